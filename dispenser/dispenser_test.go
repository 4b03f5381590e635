package dispenser

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/leafbus/leafbus/client"
	"github.com/leafbus/leafbus/segment"
	"github.com/leafbus/leafbus/testenv"
)

// TestCloseWithoutRun: the service answers from the end of New, before Run; Close then
// gives the worker ID back with the highest timestamp it issued, so the next holder of
// the ID starts past it.
func TestCloseWithoutRun(t *testing.T) {
	srv := testenv.StartNATS(t)
	cfg := testConfig(t)
	cfg.NATS = srv.URL()
	d, err := newTest(t, cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	c, err := client.NewClient(srv.Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ids, err := c.SnowflakeN(ctx, "before-run", 5000)
	if err != nil {
		t.Fatalf("SnowflakeN before Run: %v", err)
	}
	last, err := c.Decode(ctx, ids[len(ids)-1])
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	lease := wantFree(t, nextTaker(t, otherNode(cfg)), last.WorkerID)
	if lease.Recorded() < last.Timestamp {
		t.Fatalf("the next holder of worker ID %d sees record %d, below the last timestamp issued (%d)", last.WorkerID, lease.Recorded(), last.Timestamp)
	}
}

// TestRunStopsOnClose: Close stops a running dispenser (Run returns nil), and the
// heartbeat's clean stop has given the worker ID back.
func TestRunStopsOnClose(t *testing.T) {
	srv := testenv.StartNATS(t)
	cfg := testConfig(t)
	cfg.NATS = srv.URL()
	var banner bytes.Buffer
	d, err := newTest(t, cfg, WithBanner(&banner))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- d.Run(context.Background()) }()
	select {
	case <-d.Ready():
	case err := <-done:
		t.Fatalf("Run stopped before Ready: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("not ready within 30s")
	}
	if err := d.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run after Close = %v, want nil (a clean stop)", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return after Close")
	}
	if !strings.HasPrefix(banner.String(), "leafbus is serving on "+srv.URL()+".") {
		t.Errorf("banner %q", banner.String())
	}
	wantFree(t, nextTaker(t, otherNode(cfg)), 0)
	if err := d.Run(context.Background()); !errors.Is(err, ErrClosed) {
		t.Fatalf("Run after Close = %v, want ErrClosed", err)
	}
}

// TestNewRefuses: a bad configuration or option is refused before anything starts.
func TestNewRefuses(t *testing.T) {
	cfg := testConfig(t)
	cfg.WorkerRegistry = "etcd"
	if _, err := newTest(t, cfg); err == nil || !strings.Contains(err.Error(), `--worker-registry "etcd"`) {
		t.Errorf("New with --worker-registry etcd = %v, want a message naming the flag", err)
	}
	if _, err := newTest(t, testConfig(t), WithClock(nil)); err == nil {
		t.Error("New with WithClock(nil) succeeded")
	}
	if _, err := newTest(t, testConfig(t), WithTags(segment.Tag{Name: "no\ncontrol", Step: 1})); err == nil {
		t.Error(`New with WithTags of a tag holding a newline succeeded`)
	}
}

// TestBanner: the start-up lines are byte for byte what they have always been; scripts
// read them. Where the servers authenticate clients they say how to connect as the
// shipped roles' users, and where the secret goes, never a secret.
func TestBanner(t *testing.T) {
	tests := []struct {
		name, url, prefix, status string
		auth                      clientAuth
		want                      string
	}{
		{"DefaultURL", nats.DefaultURL, "leaf", "", clientAuth{}, "leafbus is serving on nats://127.0.0.1:4222. Ask for IDs with the nats CLI:\n" +
			"  nats req leaf.segment.leaf-segment-test \"\"\n" +
			"  nats req leaf.snowflake.any \"\"\n" +
			"  nats req leaf.segment.leaf-segment-test 5      (five IDs)\n"},
		{"OtherURL", "nats://127.0.0.1:41234", "acme", "", clientAuth{}, "leafbus is serving on nats://127.0.0.1:41234. Ask for IDs with the nats CLI:\n" +
			"  nats --server nats://127.0.0.1:41234 req acme.segment.leaf-segment-test \"\"\n" +
			"  nats --server nats://127.0.0.1:41234 req acme.snowflake.any \"\"\n" +
			"  nats --server nats://127.0.0.1:41234 req acme.segment.leaf-segment-test 5      (five IDs)\n"},
		{"StatusPage", nats.DefaultURL, "leaf", "http://127.0.0.1:8080/", clientAuth{}, "leafbus is serving on nats://127.0.0.1:4222. Ask for IDs with the nats CLI:\n" +
			"  nats req leaf.segment.leaf-segment-test \"\"\n" +
			"  nats req leaf.snowflake.any \"\"\n" +
			"  nats req leaf.segment.leaf-segment-test 5      (five IDs)\n" +
			"status page: http://127.0.0.1:8080/\n"},
		{"Users", "nats://n1:4222,nats://n2:4222", "leaf", "http://127.0.0.1:8081/", clientAuth{method: "user"},
			"leafbus is serving on nats://n1:4222,nats://n2:4222, whose servers authenticate clients. Ask for IDs with the nats CLI as an application's user (deploy/nats-roles.conf: client-a, its password in NATS_PASSWORD):\n" +
				"  nats --server nats://n1:4222,nats://n2:4222 --user client-a --inbox-prefix _INBOX_client-a req leaf.segment.leaf-segment-test \"\"\n" +
				"  nats --server nats://n1:4222,nats://n2:4222 --user client-a --inbox-prefix _INBOX_client-a req leaf.snowflake.any \"\"\n" +
				"  nats --server nats://n1:4222,nats://n2:4222 --user client-a --inbox-prefix _INBOX_client-a req leaf.segment.leaf-segment-test 5      (five IDs)\n" +
				"Manage tags as the operator (its password in LEAFBUS_PASSWORD):\n" +
				"  dispenser tag list --nats nats://n1:4222,nats://n2:4222 --user operator\n" +
				"status page: http://127.0.0.1:8081/\n"},
		{"CredsAndTLS", "tls://n1:4222", "acme", "", clientAuth{method: "creds", tlsCA: "/etc/leafbus/ca.pem", mutualTLS: true},
			"leafbus is serving on tls://n1:4222, whose servers authenticate clients. Ask for IDs with the nats CLI as an application's user (deploy/nats-roles.conf: client-a, the .creds file of client-a):\n" +
				"  nats --server tls://n1:4222 --creds client-a.creds --inbox-prefix _INBOX_client-a --tlsca /etc/leafbus/ca.pem --tlscert client-a.pem --tlskey client-a-key.pem req acme.segment.leaf-segment-test \"\"\n" +
				"  nats --server tls://n1:4222 --creds client-a.creds --inbox-prefix _INBOX_client-a --tlsca /etc/leafbus/ca.pem --tlscert client-a.pem --tlskey client-a-key.pem req acme.snowflake.any \"\"\n" +
				"  nats --server tls://n1:4222 --creds client-a.creds --inbox-prefix _INBOX_client-a --tlsca /etc/leafbus/ca.pem --tlscert client-a.pem --tlskey client-a-key.pem req acme.segment.leaf-segment-test 5      (five IDs)\n" +
				"Manage tags as the operator (the .creds file of operator):\n" +
				"  dispenser tag list --nats tls://n1:4222 --prefix acme --creds operator.creds --tls-ca /etc/leafbus/ca.pem --tls-cert operator.pem --tls-key operator-key.pem\n"},
		{"Token", nats.DefaultURL, "leaf", "", clientAuth{method: "token"},
			"leafbus is serving on nats://127.0.0.1:4222, whose servers authenticate clients. Ask for IDs with the nats CLI, the deployment's token in NATS_USER:\n" +
				"  nats req leaf.segment.leaf-segment-test \"\"\n" +
				"  nats req leaf.snowflake.any \"\"\n" +
				"  nats req leaf.segment.leaf-segment-test 5      (five IDs)\n" +
				"Manage tags as the operator (the deployment's token in LEAFBUS_TOKEN):\n" +
				"  dispenser tag list --nats nats://127.0.0.1:4222\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var b bytes.Buffer
			writeBanner(&b, banner{url: tt.url, prefix: tt.prefix, statusURL: tt.status, auth: tt.auth})
			if b.String() != tt.want {
				t.Errorf("writeBanner(%q, %q, %q, %+v) =\n%s\nwant\n%s", tt.url, tt.prefix, tt.status, tt.auth, b.String(), tt.want)
			}
		})
	}
}

// TestBannerNoSecret: a dispenser configured with credentials prints how to connect
// under them, and not one secret: not its password, not its service user's.
func TestBannerNoSecret(t *testing.T) {
	cfg := rolesConfig(t)
	var out bytes.Buffer
	d, err := newTest(t, cfg, WithBanner(&out))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	runReady(t, d)
	b := out.String()
	for _, secret := range []string{cfg.Conn.Password, cfg.ServiceAuth.Password} {
		if strings.Contains(b, secret) {
			t.Errorf("the banner prints a password:\n%s", b)
		}
	}
	for _, want := range []string{"--user client-a --inbox-prefix _INBOX_client-a req leaf.segment.", "dispenser tag list --nats " + d.ClientURL() + " --user operator"} {
		if !strings.Contains(b, want) {
			t.Errorf("the banner does not say %q:\n%s", want, b)
		}
	}
}
