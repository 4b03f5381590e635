package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// TestTagCommand: `dispenser tag add|list|update` against a running dispenser, and the
// mistakes that are usage errors (exit code 2).
func TestTagCommand(t *testing.T) {
	d := startDispenser(t, nil)
	url := d.ClientURL()
	tests := []struct {
		name     string
		args     []string
		wantCode int
		want     string // in stdout (code 0) or stderr
	}{
		{"Add", []string{"tag", "add", "--nats", url, "--tag", "orders", "--step", "1000", "--description", "order IDs"}, 0, `"step": 1000`},
		{"AddExists", []string{"tag", "add", "--nats", url, "--tag", "orders", "--step", "1000"}, 1, "exists"},
		{"ErrAddNoStep", []string{"tag", "add", "--nats", url, "--tag", "x"}, 2, "--step is required"},
		{"Update", []string{"tag", "update", "--nats", url, "--tag", "orders", "--step", "5000"}, 0, `"step": 5000`},
		{"ErrUpdateNothing", []string{"tag", "update", "--nats", url, "--tag", "orders"}, 2, "--step, --description, --max-id, --monotonic and/or --bits"},
		{"UpdateMaxID", []string{"tag", "update", "--nats", url, "--tag", "orders", "--max-id", "1000000"}, 0, `"max_id": 1000000`},
		{"ErrUpdateMaxIDDown", []string{"tag", "update", "--nats", url, "--tag", "orders", "--max-id", "5"}, 1, "1000000"},
		{"List", []string{"tag", "list", "--nats", url}, 0, "orders"},
		{"ListJSON", []string{"tag", "list", "--nats", url, "--json"}, 0, `"description": "order IDs"`},
		{"ErrNoOp", []string{"tag"}, 2, "want add, list or update"},
		{"ErrArgument", []string{"tag", "list", "--nats", url, "extra"}, 2, `unexpected argument "extra"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := runCommand(context.Background(), tt.args, &stdout, &stderr)
			out := stdout.String()
			if tt.wantCode != 0 {
				out = stderr.String()
			}
			if code != tt.wantCode || !strings.Contains(out, tt.want) {
				t.Fatalf("dispenser %s: exit %d, want %d with %q in\nstdout: %s\nstderr: %s",
					strings.Join(tt.args, " "), code, tt.wantCode, tt.want, stdout.String(), stderr.String())
			}
		})
	}
}
