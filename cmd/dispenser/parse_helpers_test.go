package main

import (
	"errors"
	"io"
	"strings"
	"testing"
)

// parseWith parses args, with env as the environment, into a fresh default Config.
func parseWith(args []string, env map[string]string) (Config, error) {
	c := defaultConfig()
	err := c.parse(args, func(k string) string { return env[k] }, io.Discard)
	return c, err
}

// wantUsageError fails t unless err is a usage error (exit code 2) whose text holds
// msg; an empty msg accepts any text.
func wantUsageError(t *testing.T, args []string, err error, msg string) {
	t.Helper()
	if !errors.As(err, new(*usageError)) || exitCode(err, io.Discard) != 2 {
		t.Fatalf("parse(%q) = %v, want a usage error (exit code 2)", args, err)
	}
	if !strings.Contains(err.Error(), msg) {
		t.Fatalf("parse(%q) = %v, want an error with %q", args, err, msg)
	}
}
