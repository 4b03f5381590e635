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

// TestEveryRoleEveryCommand runs each CLI command that talks to NATS as each user of
// deploy/nats-roles.conf: what the role may do succeeds, and what it may not fails at
// once with the permissions violation, naming the subject refused (and, where the
// command knows it, the user). "At once": each denied command runs under a deadline far
// below one JetStream request's timeout (5 s), let alone a retry loop's, with
// --timeout and --start-timeout long, so a command that waited instead of failing would
// end on the deadline, not on the violation.
func TestEveryRoleEveryCommand(t *testing.T) {
	d, pw := startRolesDispenser(t)
	url := d.ClientURL()
	const id = "1860000000000000000"
	dir := t.TempDir() // fence's data dir: an empty one, which fence may open
	as := func(user string, args ...string) []string {
		out := append([]string{}, args...)
		out = append(out, "--nats", url, "--user", user)
		if strings.HasPrefix(user, "client-") {
			out = append(out, "--inbox-prefix", "_INBOX_"+user)
		}
		return out
	}
	admin := func(user string, args ...string) []string {
		return append(append([]string{}, args...), "--nats", url, "--user", user, "--start-timeout", "1m")
	}
	tags := func(op string) []string {
		switch op {
		case "add":
			return []string{"tag", "add", "--tag", "roles", "--step", "100", "--timeout", "1m"}
		case "update":
			return []string{"tag", "update", "--tag", "roles", "--max-id", "5000", "--timeout", "1m"}
		}
		return []string{"tag", "list", "--timeout", "1m"}
	}
	decode := func(user string) []string { return append(as(user, "decode", "--timeout", "1m"), id) }
	type run struct {
		name string
		user string
		args []string
		want []string // allowed: in stdout; denied: in stderr
	}
	allowed := []run{
		{"OperatorTagAdd", "operator", as("operator", tags("add")...), []string{`"tag": "roles"`}},
		{"OperatorTagUpdate", "operator", as("operator", tags("update")...), []string{`"max_id": 5000`}},
		{"OperatorTagList", "operator", as("operator", tags("list")...), []string{"roles"}},
		{"OperatorDecode", "operator", decode("operator"), []string{`"worker_id"`}},
		{"OperatorDeploymentShow", "operator", admin("operator", "deployment", "show"), []string{"KV bucket leaf_deployment", `"segment_store"`}},
		{"ClientDecode", "client-a", decode("client-a"), []string{`"worker_id"`}},
		{"DispenserDeploymentShow", "dispenser", admin("dispenser", "deployment", "show"), []string{`"segment_store"`}},
		{"DispenserDeploymentSet", "dispenser", admin("dispenser", "deployment", "set", "--confirm"), []string{"written: revision"}},
	}
	violation := "Permissions Violation for Publish to "
	named := func(user, subject string) []string {
		return []string{`user "` + user + `"`, violation + `"` + subject + `"`}
	}
	denied := []run{
		{"OperatorDeploymentSet", "operator", admin("operator", "deployment", "set", "--confirm"), []string{`user "operator"`, violation}},
		{"OperatorFence", "operator", append(admin("operator", "fence"), "--data-dir", dir), []string{`user "operator"`, violation}},
		{"ClientTagAdd", "client-a", as("client-a", tags("add")...), named("client-a", "leaf.admin.tags.add")},
		{"ClientTagUpdate", "client-a", as("client-a", tags("update")...), named("client-a", "leaf.admin.tags.update")},
		{"ClientTagList", "client-a", as("client-a", tags("list")...), named("client-a", "leaf.admin.tags.list")},
		{"ClientDeploymentShow", "client-a", admin("client-a", "deployment", "show"), []string{`user "client-a"`, "Permissions Violation"}},
		{"ClientDeploymentSet", "client-a", admin("client-a", "deployment", "set"), []string{`user "client-a"`, "Permissions Violation"}},
		{"EtlDecode", "etl", decode("etl"), named("etl", "leaf.decode.snowflake")},
		{"EtlTagList", "etl", as("etl", tags("list")...), named("etl", "leaf.admin.tags.list")},
		{"EtlDeploymentShow", "etl", admin("etl", "deployment", "show"), []string{`user "etl"`, violation}},
		{"DispenserTagList", "dispenser", as("dispenser", tags("list")...), named("dispenser", "leaf.admin.tags.list")},
		{"DispenserDecode", "dispenser", decode("dispenser"), named("dispenser", "leaf.decode.snowflake")},
		{"ServiceTagList", "dispenser-service", as("dispenser-service", tags("list")...), []string{"Permissions Violation"}},
		{"ServiceDeploymentShow", "dispenser-service", admin("dispenser-service", "deployment", "show"), []string{`user "dispenser-service"`, "Permissions Violation"}},
	}
	check := func(t *testing.T, r run, deadline time.Duration, wantCode int) {
		password := pw[passwordVarOf(r.user)]
		t.Setenv("LEAFBUS_PASSWORD", password)
		ctx, cancel := context.WithTimeout(context.Background(), deadline)
		defer cancel()
		// Synchronized: the NATS connection's close callback may log after the command
		// returned.
		var stdout, stderr testutil.SyncBuffer
		code := runCommand(ctx, r.args, &stdout, &stderr)
		out := stdout.String()
		if wantCode != 0 {
			out = stderr.String()
		}
		ok := code == wantCode && ctx.Err() == nil
		for _, w := range r.want {
			ok = ok && strings.Contains(out, w)
		}
		if !ok {
			t.Fatalf("as %s, dispenser %s: exit %d (deadline %v: %v), want %d with %q in\nstdout: %s\nstderr: %s",
				r.user, strings.Join(r.args, " "), code, deadline, ctx.Err(), wantCode, r.want, stdout.String(), stderr.String())
		}
		if strings.Contains(stdout.String()+stderr.String(), password) {
			t.Errorf("dispenser %s printed the password", strings.Join(r.args, " "))
		}
	}
	for _, r := range allowed {
		t.Run(r.name, func(t *testing.T) { check(t, r, time.Minute, 0) })
	}
	for _, r := range denied {
		t.Run(r.name, func(t *testing.T) { check(t, r, 3*time.Second, 1) })
	}
}

// passwordVarOf is the environment variable deploy/nats-roles.conf reads user's
// password from (testutil.NATSConfPasswords' keys).
func passwordVarOf(user string) string {
	return "NATS_" + strings.ToUpper(strings.ReplaceAll(user, "-", "_")) + "_PASSWORD"
}
