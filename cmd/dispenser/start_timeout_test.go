package main

import (
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
			c, err := parseWith(tt.args, tt.env)
			if tt.wantErr {
				wantUsageError(t, tt.args, err, "")
				return
			}
			if err != nil || c.StartTimeout != tt.want {
				t.Fatalf("parse(%q, env %v) = --start-timeout %v, %v; want %v", tt.args, tt.env, c.StartTimeout, err, tt.want)
			}
		})
	}
}
