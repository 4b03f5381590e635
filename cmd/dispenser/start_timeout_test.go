package main

import (
	"errors"
	"io"
	"testing"
	"time"
)

// --start-timeout (LEAFBUS_START_TIMEOUT): how long a start waits for its dependencies.
func TestStartTimeoutFlag(t *testing.T) {
	for _, tt := range []struct {
		name    string
		args    []string
		env     map[string]string
		want    time.Duration
		wantErr bool
	}{
		{"Default", nil, nil, 30 * time.Second, false},
		{"Flag", []string{"--start-timeout", "5s"}, nil, 5 * time.Second, false},
		{"Env", nil, map[string]string{"LEAFBUS_START_TIMEOUT": "2m"}, 2 * time.Minute, false},
		{"Off", []string{"--start-timeout=0"}, nil, 0, false},
		{"ErrNegative", []string{"--start-timeout", "-1s"}, nil, 0, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c := defaultConfig()
			err := c.parse(tt.args, func(k string) string { return tt.env[k] }, io.Discard)
			if tt.wantErr {
				if !errors.As(err, new(*usageError)) {
					t.Fatalf("parse(%q) = %v, want a usage error", tt.args, err)
				}
				return
			}
			if err != nil || c.StartTimeout != tt.want {
				t.Fatalf("parse(%q, env %v) = --start-timeout %v, %v; want %v", tt.args, tt.env, c.StartTimeout, err, tt.want)
			}
		})
	}
}
