package dispenser

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/leafbus/leafbus/bus"
	"github.com/leafbus/leafbus/client"
	"github.com/leafbus/leafbus/internal/testutil"
	"github.com/leafbus/leafbus/segment"
	"github.com/leafbus/leafbus/wire"
	"github.com/leafbus/leafbus/workerid"
)

// rolesConf is the shipped per-role configuration (deploy/nats-roles.conf), as the
// embedded server's --nats-config.
const rolesConf = "../deploy/nats-roles.conf"

// rolesPasswords puts every role's password into the environment for tb's duration, as
// an operator's secrets file does (the file reads them from there), and returns each
// user's password.
func rolesPasswords(tb testing.TB) map[string]string {
	tb.Helper()
	testutil.NATSConfPasswords(tb, rolesConf)
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

// noDiscoveryConfig is the test configuration on an embedded server whose dispenser
// user may not publish to $SRV (as deploy/nats-roles.conf allowed before issue 25): the
// peer range check's request is refused.
func noDiscoveryConfig(tb testing.TB) Config {
	tb.Helper()
	conf := filepath.Join(tb.TempDir(), "no-discovery.conf")
	err := os.WriteFile(conf, []byte(`accounts {
  LEAF {
    jetstream: enabled
    users: [
      {user: dispenser, password: "d", permissions: {publish: {deny: ["$SRV.>"]}}}
      {user: dispenser-service, password: "s"}
    ]
  }
}
`), 0o600)
	if err != nil {
		tb.Fatal(err)
	}
	cfg := testConfig(tb)
	cfg.NATSConfig = conf
	cfg.Conn.User, cfg.Conn.Password = "dispenser", "d"
	cfg.ServiceAuth = Credentials{User: "dispenser-service", Password: "s"}
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
		before := serviceSubs(t, d.embedded)
		for range n {
			if _, err := app.Segment(ctx, SampleTagName); err != nil {
				t.Fatal(err)
			}
		}
		// The server counts a connection's published message after it has delivered it,
		// so the last reply can reach the client before its publisher's count moves: wait
		// (bounded) for the counts rather than read them once.
		counted := func(after map[uint64]servingConn) bool {
			for cid, a := range after {
				if b := before[cid]; a.delivered-b.delivered < n || a.published-b.published < n {
					return false
				}
			}
			return true
		}
		after := serviceSubs(t, d.embedded)
		for deadline := time.Now().Add(5 * time.Second); !counted(after) && time.Now().Before(deadline); {
			time.Sleep(10 * time.Millisecond)
			after = serviceSubs(t, d.embedded)
		}
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
func serviceSubs(tb testing.TB, srv *bus.Embedded) map[uint64]servingConn {
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
			testutil.CheckErr(t, "New", err, nats.ErrAuthorization, "connect in process to the embedded NATS server: ")
			if took := time.Since(start); took > 5*time.Second {
				t.Errorf("New took %v to report the refusal, want it at once", took)
			}
		})
	}
}

// TestNATSConfigRolesDiscovery: under the shipped roles the dispensers find each other.
// Two dispensers on one server (the second joins the first's embedded server over TCP
// with --nats), with worker-ID ranges that overlap without being the same: each one's
// peer range check asks $SRV.INFO and warns about the other, nobody logs a refusal, and
// each status page lists both dispensers with their worker IDs.
func TestNATSConfigRolesDiscovery(t *testing.T) {
	first := rolesConfig(t)
	first.NodeID, first.WorkerIDMin, first.WorkerIDMax = "roles-1", 0, 511
	logs := map[string]*testutil.SyncBuffer{}
	start := func(cfg Config) *Dispenser {
		t.Helper()
		buf := &testutil.SyncBuffer{}
		logs[cfg.NodeID] = buf
		logger := slog.New(slog.NewTextHandler(io.MultiWriter(buf, testutil.LogWriter(t)), &slog.HandlerOptions{Level: slog.LevelInfo}))
		d, err := newTest(t, cfg, WithLogger(logger), withPeerCheck(100*time.Millisecond, time.Hour))
		if err != nil {
			t.Fatalf("New(%s): %v", cfg.NodeID, err)
		}
		runReady(t, d)
		return d
	}
	a := start(first)
	second := testConfig(t)
	second.NATS, second.NodeID, second.WorkerIDMin, second.WorkerIDMax = a.ClientURL(), "roles-2", 256, 767
	second.Conn.User, second.Conn.Password = first.Conn.User, first.Conn.Password
	second.ServiceAuth = first.ServiceAuth
	b := start(second)

	waitWarning(t, logs["roles-1"], "roles-1", "roles-2", workerid.Range{Min: 0, Max: 511})
	waitWarning(t, logs["roles-2"], "roles-2", "roles-1", workerid.Range{Min: 256, Max: 767})

	want := map[string]int64{"roles-1": a.snowflakes.WorkerID(), "roles-2": b.snowflakes.WorkerID()}
	for _, d := range []*Dispenser{a, b} {
		testutil.Eventually(t, 10*time.Second, d.cfg.NodeID+"'s status page listing both dispensers with their worker IDs", func() bool {
			got := statusCluster(t, d)
			return maps.Equal(got, want)
		})
	}
	for node, log := range logs {
		for _, bad := range []string{"peer range check off", "NATS asynchronous error", "Permissions Violation", "level=ERROR"} {
			if strings.Contains(log.String(), bad) {
				t.Errorf("%s logged %q under the shipped roles:\n%s", node, bad, log.Line(bad))
			}
		}
	}
}

// clusterRow is one dispenser of the status page's cluster table: its node ID and its
// worker ID ("—" when it did not say).
var clusterRow = regexp.MustCompile(`<td>([^<\s]+)(?: <span class="muted">\(this node\)</span>)?</td><td>[^<]*</td>\s*<td class="num">(\d+|—)</td>`)

// statusCluster reads d's status page and returns the worker ID of each dispenser its
// cluster table lists (-1 for one shown without).
func statusCluster(t *testing.T, d *Dispenser) map[string]int64 {
	t.Helper()
	resp, err := http.Get("http://" + d.HTTPAddr().String() + "/")
	if err != nil {
		t.Fatalf("status page of %s: %v", d.cfg.NodeID, err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	section, _, _ := strings.Cut(string(body[bytes.Index(body, []byte(`<section id="cluster">`))+1:]), "</section>")
	out := map[string]int64{}
	for _, m := range clusterRow.FindAllStringSubmatch(section, -1) {
		w, err := strconv.ParseInt(m[2], 10, 64)
		if err != nil {
			w = -1
		}
		out[m[1]] = w
	}
	return out
}
