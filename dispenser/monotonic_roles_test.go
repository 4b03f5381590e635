package dispenser

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/leafbus/leafbus/client"
	"github.com/leafbus/leafbus/internal/testutil"
	"github.com/leafbus/leafbus/wire"
)

// TestMonotonicUnderRoles: two dispensers on a server configured by the shipped
// per-role file (deploy/nats-roles.conf), a monotonic tag added by the operator, and an
// application of the CLIENTS account asking for it: every request is answered, the
// follower's forwarded too. A follower forwards only to a leader whose instance it
// verified over $SRV.PING.leaf.<instance>, which the dispenser user must be allowed to
// ask; without that every request reaching the follower would wait and get 503.
func TestMonotonicUnderRoles(t *testing.T) {
	cfg1 := rolesConfig(t)
	cfg1.NodeID, cfg1.MonotonicLeaseTTL = "roles-1", 2*time.Second
	d1, err := newTest(t, cfg1)
	if err != nil {
		t.Fatalf("New roles-1: %v", err)
	}
	runReady(t, d1)
	url := d1.ClientURL()
	pw := rolesPasswords(t)
	cfg2 := testConfig(t)
	cfg2.NodeID, cfg2.NATS, cfg2.MonotonicLeaseTTL = "roles-2", url, cfg1.MonotonicLeaseTTL
	cfg2.Conn.User, cfg2.Conn.Password = "dispenser", pw["dispenser"]
	cfg2.ServiceAuth = Credentials{User: "dispenser-service", Password: pw["dispenser-service"]}
	d2, err := newTest(t, cfg2)
	if err != nil {
		t.Fatalf("New roles-2: %v", err)
	}
	runReady(t, d2)

	ctx := testutil.Context(t, time.Minute)
	ops, err := client.NewClient(connectRole(t, url, "operator"))
	if err != nil {
		t.Fatal(err)
	}
	on, step := true, int64(7)
	if _, err := ops.AddTag(ctx, wire.AddTagRequest{Tag: "ordered", Step: &step, Monotonic: &on}); err != nil {
		t.Fatalf("AddTag as operator: %v", err)
	}
	app, err := client.NewClient(connectRole(t, url, "client-a", nats.CustomInboxPrefix("_INBOX_client-a")), client.WithHedge(0))
	if err != nil {
		t.Fatal(err)
	}
	var last int64
	for i := range 60 {
		ids, err := app.SegmentN(ctx, "ordered", 2)
		if err != nil {
			t.Fatalf("request %d of the monotonic tag as client-a: %v", i, err)
		}
		if ids[0] <= last || ids[1] <= ids[0] {
			t.Fatalf("request %d = %v after %d: not above the reply before it", i, ids, last)
		}
		last = ids[1]
	}
	var forwarded, unverified uint64
	for _, d := range []*Dispenser{d1, d2} {
		for _, st := range d.mono.Stats().Tags {
			forwarded += st.Forwarded
			unverified += st.Unverified
		}
	}
	if forwarded == 0 || unverified != 0 {
		t.Fatalf("forwarded %d requests, %d leader records not verified: want the follower to verify its leader and forward to it", forwarded, unverified)
	}
}
