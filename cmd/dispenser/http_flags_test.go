package main

import (
	"testing"

	"github.com/leafbus/leafbus/httpapi"
	"github.com/leafbus/leafbus/metrics"
)

// TestHTTPFlags: --http defaults to Leaf's port on loopback, not explicit; the flag or
// LEAFBUS_HTTP makes it explicit (a taken port is then a start-up error); --http ""
// turns HTTP off; --metrics-max-tags is checked.
func TestHTTPFlags(t *testing.T) {
	for _, tt := range []struct {
		name         string
		args         []string
		env          map[string]string
		wantHTTP     string
		wantExplicit bool
		wantMaxTags  int
		wantErr      bool
	}{
		{"Default", nil, nil, httpapi.DefaultAddr, false, metrics.DefaultMaxTags, false},
		{"Flag", []string{"--http", "0.0.0.0:8090"}, nil, "0.0.0.0:8090", true, metrics.DefaultMaxTags, false},
		{"Env", nil, map[string]string{"LEAFBUS_HTTP": "127.0.0.1:8091"}, "127.0.0.1:8091", true, metrics.DefaultMaxTags, false},
		{"FlagWinsOverEnv", []string{"--http=127.0.0.1:8092"}, map[string]string{"LEAFBUS_HTTP": "127.0.0.1:8091"}, "127.0.0.1:8092", true, metrics.DefaultMaxTags, false},
		{"Off", []string{"--http", ""}, nil, "", true, metrics.DefaultMaxTags, false},
		{"MaxTags", []string{"--metrics-max-tags", "5"}, map[string]string{"LEAFBUS_METRICS_MAX_TAGS": "7"}, httpapi.DefaultAddr, false, 5, false},
		{"ErrNoHost", []string{"--http", ":8080"}, nil, "", false, 0, true},
		{"ErrMaxTags", []string{"--metrics-max-tags", "-1"}, nil, "", false, 0, true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c, err := parseWith(tt.args, tt.env)
			if tt.wantErr {
				wantUsageError(t, tt.args, err, "")
				return
			}
			if err != nil || c.HTTP != tt.wantHTTP || c.HTTPExplicit != tt.wantExplicit || c.MetricsMaxTags != tt.wantMaxTags {
				t.Fatalf("parse(%q, env %v) = --http %q explicit %v --metrics-max-tags %d, %v; want %q, %v, %d",
					tt.args, tt.env, c.HTTP, c.HTTPExplicit, c.MetricsMaxTags, err, tt.wantHTTP, tt.wantExplicit, tt.wantMaxTags)
			}
		})
	}
}
