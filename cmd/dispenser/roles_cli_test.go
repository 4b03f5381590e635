package main

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/leafbus/leafbus/internal/testutil"
)

// startRolesDispenser runs a dispenser on an embedded server configured with the
// shipped roles (deploy/nats-roles.conf), its two users' passwords from the environment
// as README says, and returns it with every role's password.
func startRolesDispenser(t *testing.T) (*testDispenser, map[string]string) {
	t.Helper()
	pw := testutil.NATSConfPasswords(t, rolesConf)
	env := map[string]string{
		"LEAFBUS_NATS_CONFIG": rolesConf, "LEAFBUS_USER": "dispenser", "LEAFBUS_SERVICE_USER": "dispenser-service",
		"LEAFBUS_PASSWORD": pw["NATS_DISPENSER_PASSWORD"], "LEAFBUS_SERVICE_PASSWORD": pw["NATS_DISPENSER_SERVICE_PASSWORD"],
	}
	parsed := defaultConfig()
	if err := parsed.parse(nil, func(k string) string { return env[k] }, io.Discard); err != nil {
		t.Fatal(err)
	}
	d := startDispenser(t, func(c *testConfig) {
		listen, dir, node := c.Listen, c.DataDir, c.NodeID
		c.Config = parsed.Config
		c.Listen, c.DataDir, c.NodeID = listen, dir, node
	})
	return d, pw
}

// runAs runs the dispenser command args as a user whose password is in
// LEAFBUS_PASSWORD only, with more environment in env, and returns the exit code,
// stdout and stderr.
func runAs(t *testing.T, password string, env map[string]string, args ...string) (int, string, string) {
	t.Helper()
	t.Setenv("LEAFBUS_PASSWORD", password)
	for k, v := range env {
		t.Setenv(k, v)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var stdout, stderr bytes.Buffer
	code := runCommand(ctx, args, &stdout, &stderr)
	return code, stdout.String(), stderr.String()
}

// TestCLIUnderRoles: `dispenser decode` and `dispenser tag` speak every role of the
// shipped roles with the password in LEAFBUS_PASSWORD: an application's user with its
// inbox prefix (--inbox-prefix or LEAFBUS_INBOX_PREFIX), and the operator. Without the
// prefix the application's user is told at once what to give, instead of waiting out
// --timeout; what the role may not do is refused at once.
func TestCLIUnderRoles(t *testing.T) {
	d, pw := startRolesDispenser(t)
	url := d.ClientURL()
	const id = "1860000000000000000"
	client, operator := pw["NATS_CLIENT_A_PASSWORD"], pw["NATS_OPERATOR_PASSWORD"]
	tests := []struct {
		name     string
		password string
		env      map[string]string
		args     []string
		wantCode int
		want     []string // in stdout (code 0) or stderr
	}{
		{"ClientDecode", client, nil,
			[]string{"decode", "--nats", url, "--user", "client-a", "--inbox-prefix", "_INBOX_client-a", id}, 0, []string{`"worker_id"`}},
		{"ClientDecodeInboxPrefixFromEnv", client, map[string]string{"LEAFBUS_INBOX_PREFIX": "_INBOX_client-a", "LEAFBUS_USER": "client-a", "LEAFBUS_NATS": url},
			[]string{"decode", id}, 0, []string{`"worker_id"`}},
		{"ErrClientDecodeNoInboxPrefix", client, nil,
			[]string{"decode", "--nats", url, "--user", "client-a", "--timeout", "1m", id}, 1,
			[]string{"refuses this user its reply inboxes _INBOX.>", "--inbox-prefix"}},
		{"ErrClientTagList", client, nil,
			[]string{"tag", "list", "--nats", url, "--user", "client-a", "--inbox-prefix", "_INBOX_client-a", "--timeout", "1m"}, 1,
			[]string{"Permissions Violation", "leaf.admin.tags.list"}},
		{"OperatorDecode", operator, nil,
			[]string{"decode", "--nats", url, "--user", "operator", id}, 0, []string{`"worker_id"`}},
		{"OperatorTagAdd", operator, nil,
			[]string{"tag", "add", "--nats", url, "--user", "operator", "--tag", "orders", "--step", "1000"}, 0, []string{`"tag": "orders"`}},
		{"OperatorTagList", operator, nil,
			[]string{"tag", "list", "--nats", url, "--user", "operator"}, 0, []string{"orders"}},
		{"ErrInboxPrefixNotAnInbox", client, nil,
			[]string{"decode", "--nats", url, "--user", "client-a", "--inbox-prefix", "leaf.mine", id}, 2, []string{"--inbox-prefix", "never answers"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, stdout, stderr := runAs(t, tt.password, tt.env, tt.args...)
			out := stdout
			if tt.wantCode != 0 {
				out = stderr
			}
			ok := code == tt.wantCode
			for _, w := range tt.want {
				ok = ok && strings.Contains(out, w)
			}
			if !ok {
				t.Fatalf("dispenser %s: exit %d, want %d with %q in\nstdout: %s\nstderr: %s",
					strings.Join(tt.args, " "), code, tt.wantCode, tt.want, stdout, stderr)
			}
			if strings.Contains(stdout+stderr, tt.password) {
				t.Errorf("dispenser %s printed the password", strings.Join(tt.args, " "))
			}
		})
	}
}
