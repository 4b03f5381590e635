package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/leafbus/leafbus/wire"
)

// TestMonotonicTagCLI: `dispenser tag add|update|list --monotonic` against a running
// dispenser, the marked tag served in order once its leader serves, and
// --monotonic-lease-ttl read from the command line and the environment, and checked.
func TestMonotonicTagCLI(t *testing.T) {
	d := startDispenser(t, func(c *testConfig) { c.MonotonicLeaseTTL = time.Second })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	run := func(args ...string) (string, error) {
		var out, stderr bytes.Buffer
		err := runTag(ctx, append(args, "--nats", d.ClientURL()), &out, &stderr)
		return out.String(), err
	}
	tagOf := func(args ...string) wire.TagInfo {
		t.Helper()
		out, err := run(args...)
		if err != nil {
			t.Fatalf("tag %v: %v", args, err)
		}
		var info wire.TagInfo
		if err := json.Unmarshal([]byte(out), &info); err != nil {
			t.Fatalf("tag %v printed %q: %v", args, out, err)
		}
		return info
	}

	if info := tagOf("add", "--tag", "ordered", "--step", "10", "--monotonic"); !info.Monotonic {
		t.Fatalf("tag add --monotonic = %+v, want monotonic", info)
	}
	out, err := run("list")
	if err != nil || !strings.Contains(out, "MONOTONIC") || !lineWith(out, "ordered", "true") {
		t.Fatalf("tag list = %q, %v; want the ordered row marked true", out, err)
	}
	nc := d.connect(t)
	var last int64
	for i := 0; i < 20; {
		msg := request(t, nc, "leaf.segment.ordered", "3", nil)
		if msg.Header.Get(wire.ServiceErrorCodeHeader) == "503" {
			time.Sleep(20 * time.Millisecond) // a 503 while no leader serves yet (a request waits 2 s for one)
			continue
		}
		ids := wantIDs(t, msg, 3, false)
		if ids[0] <= last {
			t.Fatalf("reply %v after %d: not above the previous reply", ids, last)
		}
		last = ids[2]
		i++
	}
	if info := tagOf("update", "--tag", "ordered", "--monotonic=false"); info.Monotonic {
		t.Fatalf("tag update --monotonic=false = %+v, want not monotonic", info)
	}
	if _, err := run("update", "--tag", "ordered"); !errors.As(err, new(*usageError)) || !strings.Contains(err.Error(), "--monotonic") {
		t.Fatalf("tag update without a change = %v, want a usage error naming --monotonic", err)
	}
	wantIDs(t, request(t, nc, "leaf.segment.ordered", strconv.Itoa(2), nil), 2, false)
}

// lineWith reports whether some line of out holds every one of words.
func lineWith(out string, words ...string) bool {
	for line := range strings.Lines(out) {
		all := true
		for _, w := range words {
			all = all && strings.Contains(line, w)
		}
		if all {
			return true
		}
	}
	return false
}

// TestMonotonicLeaseTTLFlag: --monotonic-lease-ttl (and LEAFBUS_MONOTONIC_LEASE_TTL)
// reaches the dispenser's configuration, with the default of 6 s (monotonic's) when not
// given; one too short for its renewals is refused at start.
func TestMonotonicLeaseTTLFlag(t *testing.T) {
	for _, tt := range []struct {
		name    string
		args    []string
		env     map[string]string
		want    time.Duration
		wantErr string
	}{
		{"Default", nil, nil, 6 * time.Second, ""},
		{"Flag", []string{"--monotonic-lease-ttl", "2s"}, nil, 2 * time.Second, ""},
		{"Env", nil, map[string]string{"LEAFBUS_MONOTONIC_LEASE_TTL": "3s"}, 3 * time.Second, ""},
		{"ErrTooShort", []string{"--monotonic-lease-ttl", "100ms"}, nil, 0, "--monotonic-lease-ttl 100ms: want at least 600ms"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c, err := parseWith(tt.args, tt.env)
			if err == nil {
				err = c.Validate()
			}
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("parse %v = %v, want an error with %q", tt.args, err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatalf("parse %v: %v", tt.args, err)
			}
			if c.MonotonicLeaseTTL != tt.want {
				t.Fatalf("parse %v %v: MonotonicLeaseTTL %v, want %v", tt.args, tt.env, c.MonotonicLeaseTTL, tt.want)
			}
		})
	}
}
