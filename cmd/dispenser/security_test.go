package main

import (
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/leafbus/leafbus/client"
	"github.com/leafbus/leafbus/dispenser"
	"github.com/leafbus/leafbus/internal/testutil"
)

// rolesConf is deploy/nats-roles.conf from this package's directory; the passwords it
// reads from the environment are set by testutil.NATSConfPasswords.
const rolesConf = "../../deploy/nats-roles.conf"

// TestSecurityFlags: --nats-config, --insecure-listen and the --service-* credentials
// come from flags or LEAFBUS_* variables into the dispenser's configuration, and their
// mistakes are usage errors that name the flags.
func TestSecurityFlags(t *testing.T) {
	creds, _ := testutil.CredsFile(t, t.TempDir())
	tests := []struct {
		name    string
		args    []string
		env     map[string]string
		want    func(c Config) bool
		wantMsg string
	}{
		{"Flags", []string{"--nats-config", rolesConf, "--user", "dispenser", "--password", "p", "--service-user", "dispenser-service", "--service-password", "q"}, nil,
			func(c Config) bool {
				return c.NATSConfig == rolesConf && c.ServiceAuth == dispenser.Credentials{User: "dispenser-service", Password: "q"} && c.Conn.User == "dispenser"
			}, ""},
		{"Env", nil, map[string]string{"LEAFBUS_NATS_CONFIG": rolesConf, "LEAFBUS_SERVICE_USER": "dispenser-service", "LEAFBUS_SERVICE_PASSWORD": "q", "LEAFBUS_INSECURE_LISTEN": "true"},
			func(c Config) bool {
				return c.NATSConfig == rolesConf && c.InsecureListen && c.ServiceAuth == dispenser.Credentials{User: "dispenser-service", Password: "q"}
			}, ""},
		{"ServiceCredsWithNATS", []string{"--nats", "nats://10.0.0.1:4222", "--service-creds", creds}, nil,
			func(c Config) bool { return c.ServiceAuth == dispenser.Credentials{CredsFile: creds} }, ""},
		{"ServiceTokenEnv", []string{"--nats", "nats://10.0.0.1:4222"}, map[string]string{"LEAFBUS_SERVICE_TOKEN": "t"},
			func(c Config) bool { return c.ServiceAuth == dispenser.Credentials{Token: "t"} }, ""},
		{"ServicePasswordAlone", []string{"--nats", "nats://10.0.0.1:4222", "--service-password", "q"}, nil, nil, "--service-password given without --service-user"},
		{"TwoServiceMethods", []string{"--nats", "nats://10.0.0.1:4222", "--service-user", "a", "--service-token", "t"}, nil, nil,
			"choose one NATS authentication method for the service connection, got --service-user and --service-token"},
		{"MissingServiceNKey", []string{"--nats", "nats://10.0.0.1:4222", "--service-nkey", "/nonexistent/seed"}, nil, nil, "--service-nkey: stat /nonexistent/seed"},
		{"ServiceCredsEmbeddedNoConfig", []string{"--service-user", "a"}, nil, nil, "--service-user: the embedded server has users only with --nats-config"},
		{"MissingConfigFile", []string{"--nats-config", "/nonexistent/nats.conf"}, nil, nil, "--nats-config: stat /nonexistent/nats.conf"},
		{"TwoMethodsEmbedded", []string{"--nats-config", rolesConf, "--user", "a", "--token", "t"}, nil, nil,
			"choose one NATS authentication method for the dispenser's connections, got --user and --token"},
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
			if !tt.want(c) {
				t.Errorf("parse(%q, %v) = NATSConfig %q InsecureListen %v ServiceAuth %+v", tt.args, tt.env, c.NATSConfig, c.InsecureListen, c.ServiceAuth)
			}
		})
	}
}

// TestRolesFromFlags: the embedded server configured by the shipped per-role file, the
// dispenser's two users from the command line and the environment; an application of
// the CLIENTS account gets IDs.
func TestRolesFromFlags(t *testing.T) {
	pw := testutil.NATSConfPasswords(t, rolesConf)
	args := []string{"--nats-config", rolesConf, "--user", "dispenser", "--password", pw["NATS_DISPENSER_PASSWORD"]}
	env := map[string]string{"LEAFBUS_SERVICE_USER": "dispenser-service", "LEAFBUS_SERVICE_PASSWORD": pw["NATS_DISPENSER_SERVICE_PASSWORD"]}
	parsed := defaultConfig()
	if err := parsed.parse(args, func(k string) string { return env[k] }, io.Discard); err != nil {
		t.Fatal(err)
	}
	d := startDispenser(t, func(c *testConfig) {
		listen, dir, node := c.Listen, c.DataDir, c.NodeID
		c.Config = parsed.Config
		c.Listen, c.DataDir, c.NodeID = listen, dir, node
	})
	nc, err := nats.Connect(d.ClientURL(), nats.UserInfo("client-a", pw["NATS_CLIENT_A_PASSWORD"]), nats.CustomInboxPrefix("_INBOX_client-a"), nats.MaxReconnects(0))
	if err != nil {
		t.Fatalf("connect as client-a: %v", err)
	}
	defer nc.Close()
	cl, err := client.NewClient(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := testutil.Context(t, 30*time.Second)
	if _, err := cl.SegmentN(ctx, dispenser.SampleTagName, 5); err != nil {
		t.Fatalf("SegmentN as client-a: %v", err)
	}
	if _, err := cl.Snowflake(ctx, "any"); err != nil {
		t.Fatalf("Snowflake as client-a: %v", err)
	}
	if _, err := nats.Connect(d.ClientURL(), nats.MaxReconnects(0)); err == nil {
		t.Error("a connection without credentials was let in")
	}
}

// TestExposedListenRefused: the real command refuses an embedded server on every
// interface without authentication, exit code 1, naming the fixes.
func TestExposedListenRefused(t *testing.T) {
	var stderr testutil.SyncBuffer
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	code := runCommand(ctx, []string{"--listen", "0.0.0.0:0", "--data-dir", t.TempDir()}, io.Discard, &stderr)
	if code != 1 {
		t.Fatalf("exit code %d, want 1; stderr:\n%s", code, stderr.String())
	}
	line := stderr.Line("dispenser: ")
	for _, want := range []string{"--listen 0.0.0.0:0 is reachable from other hosts", "--nats-config", "--insecure-listen", "make IDs repeat"} {
		if !strings.Contains(line, want) {
			t.Errorf("stderr %q: want it to say %q", line, want)
		}
	}
}
