package main

import (
	"testing"
)

// TestWorkerIDRangeFlags: --worker-id-min and --worker-id-max come from flags or
// LEAFBUS_WORKER_ID_MIN/MAX, default to the whole layout, and a bad range is a usage
// error that names the flags.
func TestWorkerIDRangeFlags(t *testing.T) {
	tests := []struct {
		name     string
		args     []string
		env      map[string]string
		min, max int64
		wantMsg  string
	}{
		{"Default", nil, nil, 0, 1023, ""},
		{"Flags", []string{"--worker-id-min", "512", "--worker-id-max", "1023"}, nil, 512, 1023, ""},
		{"Env", nil, map[string]string{"LEAFBUS_WORKER_ID_MIN": "0", "LEAFBUS_WORKER_ID_MAX": "511"}, 0, 511, ""},
		{"FlagWinsOverEnv", []string{"--worker-id-max", "255"}, map[string]string{"LEAFBUS_WORKER_ID_MAX": "511"}, 0, 255, ""},
		{"MinAboveMax", []string{"--worker-id-min", "600", "--worker-id-max", "500"}, nil, 0, 0, "--worker-id-min 600 is above --worker-id-max 500"},
		{"MaxBeyondLayout", []string{"--worker-id-max", "4095"}, nil, 0, 0, "--worker-id-max 4095: want 0 to 1023"},
		{"StaticOutside", []string{"--worker-registry", "static", "--worker-id", "7", "--worker-id-min", "512"}, nil, 0, 0,
			"--worker-id 7 is outside --worker-id-min 512 .. --worker-id-max 1023"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := parseWith(tt.args, tt.env)
			if tt.wantMsg != "" {
				wantUsageError(t, tt.args, err, tt.wantMsg)
				return
			}
			if err != nil {
				t.Fatalf("parse(%q): %v", tt.args, err)
			}
			if c.WorkerIDMin != tt.min || c.WorkerIDMax != tt.max {
				t.Errorf("parse(%q, %v): range %d..%d, want %d..%d", tt.args, tt.env, c.WorkerIDMin, c.WorkerIDMax, tt.min, tt.max)
			}
		})
	}
}
