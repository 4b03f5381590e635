package dispenser

import (
	"bytes"
	"context"
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/leafbus/leafbus/client"
	"github.com/leafbus/leafbus/internal/testutil"
	"github.com/leafbus/leafbus/segment"
	"github.com/leafbus/leafbus/wire"
)

// rolesConf is the shipped per-role configuration (deploy/nats-roles.conf), as the
// embedded server's --nats-config. Its placeholder passwords are fine here.
const rolesConf = "../deploy/nats-roles.conf"

// rolesPasswords is every user's password in rolesConf.
func rolesPasswords(tb testing.TB) map[string]string {
	tb.Helper()
	opts, err := server.ProcessConfigFile(rolesConf)
	if err != nil {
		tb.Fatalf("parse %s: %v", rolesConf, err)
	}
	pw := map[string]string{}
	for _, u := range opts.Users {
		pw[u.Username] = u.Password
	}
	return pw
}

// rolesConfig is the test configuration on the embedded server with rolesConf: the
// JetStream connection as user dispenser, the service connection as dispenser-service.
func rolesConfig(tb testing.TB) Config {
	tb.Helper()
	pw := rolesPasswords(tb)
	cfg := testConfig(tb)
	cfg.NATSConfig = rolesConf
	cfg.Conn.User, cfg.Conn.Password = "dispenser", pw["dispenser"]
	cfg.ServiceAuth = Credentials{User: "dispenser-service", Password: pw["dispenser-service"]}
	return cfg
}

// connectRole connects over TCP as user, as an application or operator would.
func connectRole(tb testing.TB, url, user string, opts ...nats.Option) *nats.Conn {
	tb.Helper()
	pw := rolesPasswords(tb)[user]
	nc, err := nats.Connect(url, append([]nats.Option{nats.UserInfo(user, pw), nats.MaxReconnects(0), nats.Name("test " + user)}, opts...)...)
	if err != nil {
		tb.Fatalf("connect as %s: %v", user, err)
	}
	tb.Cleanup(nc.Close)
	return nc
}

// runReady runs d until the test ends and waits until it serves.
func runReady(tb testing.TB, d *Dispenser) {
	tb.Helper()
	testutil.Run(tb, "Run", d.Run)
	select {
	case <-d.Ready():
	case <-time.After(30 * time.Second):
		tb.Fatal("not ready within 30s")
	}
}

// TestNATSConfigRoles runs a dispenser on the embedded server configured by the shipped
// per-role file: applications of the CLIENTS account get IDs on their own inbox prefix,
// the operator manages tags, a reply subject aimed at the dispenser's buckets changes
// nothing, and the connection that answers is the dispenser-service user's.
func TestNATSConfigRoles(t *testing.T) {
	const deputyTag = "deputy" // never requested: its row must never move
	d, err := newTest(t, rolesConfig(t), WithTags(segment.Tag{Name: deputyTag, Step: 1000, MaxID: 1}))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	runReady(t, d)
	ctx := testutil.Context(t, time.Minute)
	url := d.ClientURL()

	clientNC := connectRole(t, url, "client-a", nats.CustomInboxPrefix("_INBOX_client-a"))
	app, err := client.NewClient(clientNC)
	if err != nil {
		t.Fatal(err)
	}
	var workerID int64
	t.Run("client", func(t *testing.T) {
		segs, err := app.SegmentN(ctx, SampleTagName, 10)
		if err != nil {
			t.Fatalf("SegmentN as client-a: %v", err)
		}
		if !slices.IsSorted(segs) || segs[0] < 1 {
			t.Fatalf("SegmentN as client-a = %v, want 10 increasing IDs", segs)
		}
		id, err := app.Snowflake(ctx, "orders")
		if err != nil {
			t.Fatalf("Snowflake as client-a: %v", err)
		}
		dec, err := app.Decode(ctx, id)
		if err != nil {
			t.Fatalf("Decode as client-a: %v", err)
		}
		workerID = dec.WorkerID
		if _, err := app.Tags(ctx); !errors.Is(err, nats.ErrPermissionViolation) {
			t.Errorf("Tags as client-a: %v, want a permissions violation (admin is the operator's)", err)
		}
	})

	t.Run("operator", func(t *testing.T) {
		ops, err := client.NewClient(connectRole(t, url, "operator"))
		if err != nil {
			t.Fatal(err)
		}
		step := int64(500)
		if _, err := ops.AddTag(ctx, wire.AddTagRequest{Tag: "orders", Step: &step}); err != nil {
			t.Fatalf("AddTag as operator: %v", err)
		}
		step = 700
		if info, err := ops.UpdateTag(ctx, wire.UpdateTagRequest{Tag: "orders", Step: &step}); err != nil || info.Step != step {
			t.Fatalf("UpdateTag as operator = %+v, %v", info, err)
		}
		tags, err := ops.Tags(ctx)
		if err != nil {
			t.Fatalf("Tags as operator: %v", err)
		}
		if !slices.ContainsFunc(tags, func(ti wire.TagInfo) bool { return ti.Tag == "orders" }) {
			t.Fatalf("Tags as operator = %+v, want orders among them", tags)
		}
		if _, err := app.Segment(ctx, "orders"); err != nil {
			t.Fatalf("Segment orders as client-a after the operator added it: %v", err)
		}
	})

	t.Run("deputy", func(t *testing.T) {
		// The JetStream user reads what a deputy reply would have written over.
		js, err := jetstream.New(connectRole(t, url, "dispenser"))
		if err != nil {
			t.Fatal(err)
		}
		leaseKey := strconv.FormatInt(workerID, 10)
		rowRev, lease := deputyState(ctx, t, js, deputyTag, leaseKey)
		targets := []string{
			"$KV.leaf_segments." + deputyTag,
			"$KV.leaf_leases." + leaseKey,
			"$JS.API.STREAM.PURGE.KV_leaf_leases",
			"$JS.API.STREAM.DELETE.KV_leaf_segments",
		}
		for _, kind := range []string{"segment." + SampleTagName, "snowflake.x"} {
			for _, reply := range targets {
				if err := clientNC.PublishRequest("leaf."+kind, reply, []byte("1")); err != nil {
					t.Fatal(err)
				}
			}
			// One endpoint answers its requests in order: once this one is answered,
			// the deputy ones before it were answered (to _R_.<random>, which the server
			// maps back into the client's own account, where no bucket is).
			if _, err := clientNC.Request("leaf."+kind, []byte("1"), 10*time.Second); err != nil {
				t.Fatalf("request %s after the deputy ones: %v", kind, err)
			}
		}
		gotRev, gotLease := deputyState(ctx, t, js, deputyTag, leaseKey)
		if gotRev != rowRev {
			t.Errorf("tag %s: revision %d after the deputy replies, was %d", deputyTag, gotRev, rowRev)
		}
		if !bytes.Equal(gotLease, lease) {
			t.Errorf("lease %s: %q after the deputy replies, was %q", leaseKey, gotLease, lease)
		}
		// A lease key written by anyone else stops its holder within milliseconds.
		if _, err := app.SnowflakeN(ctx, "after-deputy", 10); err != nil {
			t.Errorf("snowflake after the deputy replies: %v", err)
		}
	})

	t.Run("service-user-answers", func(t *testing.T) {
		const n = 20
		before := serviceSubs(t, d.embedded.srv)
		for range n {
			if _, err := app.Segment(ctx, SampleTagName); err != nil {
				t.Fatal(err)
			}
		}
		after := serviceSubs(t, d.embedded.srv)
		if len(after) != 1 {
			t.Fatalf("connections subscribed to leaf.segment.* in queue group leaf: %+v, want one", after)
		}
		for cid, a := range after {
			if a.user != "dispenser-service" {
				t.Errorf("the serving connection %q is user %q, want dispenser-service", a.name, a.user)
			}
			b := before[cid]
			if a.delivered-b.delivered < n || a.published-b.published < n {
				t.Errorf("the serving connection got %d requests and published %d messages during %d requests, want at least %d each",
					a.delivered-b.delivered, a.published-b.published, n, n)
			}
		}
	})
}

// deputyState is what a deputy reply would change: the revision of tag's row and the
// value of the lease key. Both buckets must still exist.
func deputyState(ctx context.Context, tb testing.TB, js jetstream.JetStream, tag, leaseKey string) (uint64, []byte) {
	tb.Helper()
	segs, err := js.KeyValue(ctx, "leaf_segments")
	if err != nil {
		tb.Fatalf("segments bucket: %v", err)
	}
	row, err := segs.Get(ctx, tag)
	if err != nil {
		tb.Fatalf("tag %s: %v", tag, err)
	}
	leases, err := js.KeyValue(ctx, "leaf_leases")
	if err != nil {
		tb.Fatalf("leases bucket: %v", err)
	}
	lease, err := leases.Get(ctx, leaseKey)
	if err != nil {
		tb.Fatalf("lease %s: %v", leaseKey, err)
	}
	return row.Revision(), lease.Value()
}

// servingConn is one connection that holds the segment endpoint's subscription.
type servingConn struct {
	name, user           string
	delivered, published int64 // requests delivered to the endpoint; messages the connection published
}

// serviceSubs finds, by connection ID, every connection subscribed to the segment
// endpoint (leaf.segment.* in queue group leaf), as the server sees them.
func serviceSubs(tb testing.TB, srv *server.Server) map[uint64]servingConn {
	tb.Helper()
	cz, err := srv.Connz(&server.ConnzOptions{Username: true, Subscriptions: true, SubscriptionsDetail: true})
	if err != nil {
		tb.Fatalf("connz: %v", err)
	}
	out := map[uint64]servingConn{}
	for _, c := range cz.Conns {
		for _, s := range c.SubsDetail {
			if s.Subject == "leaf.segment.*" && s.Queue == "leaf" {
				out[c.Cid] = servingConn{name: c.Name, user: c.AuthorizedUser, delivered: s.Msgs, published: c.InMsgs}
			}
		}
	}
	return out
}

// TestNATSConfigServiceNeedsItsOwnUser: without --service-* credentials the service
// connection is the JetStream user, whom the per-role file does not let serve; the
// start fails at once, saying which flags fix it, instead of running deaf.
func TestNATSConfigServiceNeedsItsOwnUser(t *testing.T) {
	cfg := rolesConfig(t)
	cfg.ServiceAuth = Credentials{}
	_, err := newTest(t, cfg)
	testutil.CheckErr(t, "New without --service-user", err, ErrServiceRefused, `authenticates as user "dispenser"`)
	if !strings.Contains(err.Error(), "--service-user") {
		t.Errorf("New without --service-user: %v, want the message to name --service-user", err)
	}
}

// TestNATSConfigWrongCredentials: an in-process connection authenticates like a TCP
// one, and a refusal is reported at once, as the server's own "Authorization Violation".
func TestNATSConfigWrongCredentials(t *testing.T) {
	tests := []struct {
		name string
		set  func(*Config)
	}{
		{"Password", func(c *Config) { c.Conn.Password = "wrong" }},
		{"ServicePassword", func(c *Config) { c.ServiceAuth.Password = "wrong" }},
		{"NoCredentials", func(c *Config) { c.Conn = client.ConnConfig{}; c.ServiceAuth = Credentials{} }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := rolesConfig(t)
			tt.set(&cfg)
			start := time.Now()
			_, err := newTest(t, cfg)
			testutil.CheckErr(t, "New", err, nats.ErrAuthorization, "connect in process to the embedded NATS server as")
			if took := time.Since(start); took > 5*time.Second {
				t.Errorf("New took %v to report the refusal, want it at once", took)
			}
		})
	}
}
