package workerid

import (
	"net"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/leafbus/leafbus/internal/testutil"
	"github.com/leafbus/leafbus/testenv"
)

// zkTestName gives a test its own leaf.name on a shared server: the name of a fresh
// testenv root (so no two tests collide), with /snowflake/<name> removed at cleanup.
func zkTestName(tb testing.TB, srv *testenv.ZooKeeperServer, conn *zk.Conn) string {
	tb.Helper()
	name := strings.TrimPrefix(srv.NewRoot(tb), "/")
	tb.Cleanup(func() { zkDeleteTree(conn, "/snowflake/"+name) })
	return name
}

func zkDeleteTree(conn *zk.Conn, p string) {
	children, _, err := conn.Children(p)
	if err != nil {
		return
	}
	for _, c := range children {
		zkDeleteTree(conn, p+"/"+c)
	}
	_ = conn.Delete(p, -1)
}

// zkConfig is the default ZooKeeper registry configuration for a test, with a short
// session timeout (2 s), changed by edits.
func zkConfig(servers []string, name, advertise string, edits ...func(*ZKRegistryConfig)) ZKRegistryConfig {
	cfg := DefaultZKRegistryConfig()
	cfg.Servers, cfg.Name, cfg.Advertise = servers, name, advertise
	cfg.SessionTimeout = 2 * time.Second
	for _, edit := range edits {
		edit(&cfg)
	}
	return cfg
}

// zkRecycle selects recycle mode with leases of ttl.
func zkRecycle(ttl time.Duration) func(*ZKRegistryConfig) {
	return func(c *ZKRegistryConfig) { c.Recycle, c.TTL = true, ttl }
}

// zkMaxWorkerID limits a ZooKeeper registry to worker IDs 0..n.
func zkMaxWorkerID(n int64) func(*ZKRegistryConfig) {
	return func(c *ZKRegistryConfig) { c.MaxWorkerID = n }
}

// zkSessionTimeout sets the session timeout of Leaf's layout.
func zkSessionTimeout(d time.Duration) func(*ZKRegistryConfig) {
	return func(c *ZKRegistryConfig) { c.SessionTimeout = d }
}

// openZK opens a registry with the test logger, closed at cleanup.
func openZK(tb testing.TB, cfg ZKRegistryConfig) *ZKRegistry {
	tb.Helper()
	if cfg.Logger == nil {
		cfg.Logger = testutil.Logger(tb)
	}
	r, err := OpenZKRegistry(testutil.Context(tb, 10*time.Second), cfg)
	if err != nil {
		tb.Fatalf("OpenZKRegistry(%+v): %v", cfg, err)
	}
	tb.Cleanup(r.Close)
	return r
}

func zkAcquire(tb testing.TB, r Registry) Lease {
	tb.Helper()
	l, err := r.Acquire(testutil.Context(tb, 15*time.Second))
	if err != nil {
		tb.Fatalf("Acquire: %v", err)
	}
	return l
}

func zkGet(tb testing.TB, conn *zk.Conn, p string) string {
	tb.Helper()
	b, _, err := conn.Get(p)
	if err != nil {
		tb.Fatalf("Get %s: %v", p, err)
	}
	return string(b)
}

// closedAddr is a loopback address nothing listens on.
func closedAddr(tb testing.TB) string {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	must(tb, "Listen", err)
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

func TestZKRegistryDownAtStart(t *testing.T) {
	t.Parallel()
	now := time.Now().UnixMilli()
	tests := []struct {
		name    string
		recycle bool
		cache   *cacheEntry
		wantErr error  // from Acquire
		wantMsg string // in Acquire's error
		guard   error  // from Guard.Start
	}{
		{name: "ErrZKUnavailable without cache file", wantErr: ErrZKUnavailable},
		{name: "OK from cache file behind the clock", cache: &cacheEntry{NodeID: "n1", WorkerID: 7, Timestamp: now - 10_000, Registry: "zk /snowflake/down"}},
		{name: "ErrClockBehindRecord from cache file ahead of the clock", cache: &cacheEntry{NodeID: "n1", WorkerID: 7, Timestamp: now + 60_000, Registry: "zk /snowflake/down"}, guard: ErrClockBehindRecord},
		{name: "ErrZKUnavailable in recycle mode", recycle: true, cache: &cacheEntry{NodeID: "n1", WorkerID: 7, Timestamp: now - 10_000, Registry: "zk /snowflake/down"}, wantErr: ErrZKUnavailable},
		// Issue 21: a worker ID is trusted only by the registry that issued it.
		{name: "ErrCacheOtherRegistry from the KV registry", cache: &cacheEntry{NodeID: "n1", WorkerID: 7, Timestamp: now - 10_000, Registry: "kv leaf_leases"},
			wantErr: ErrCacheOtherRegistry, wantMsg: `holds worker ID 7 from registry "kv leaf_leases", not this one ("zk /snowflake/down")`},
		{name: "ErrCacheOtherRegistry from another ZooKeeper name", cache: &cacheEntry{NodeID: "n1", WorkerID: 7, Timestamp: now - 10_000, Registry: "zk /snowflake/leaf-prod"},
			wantErr: ErrCacheOtherRegistry, wantMsg: `from registry "zk /snowflake/leaf-prod"`},
		{name: "ErrCacheOtherRegistry from recycle mode", cache: &cacheEntry{NodeID: "n1", WorkerID: 7, Timestamp: now - 10_000, Registry: "zk /snowflake/down (recycle)"},
			wantErr: ErrCacheOtherRegistry, wantMsg: "start with ZooKeeper reachable"},
		{name: "ErrCacheOtherRegistry from an entry without a registry", cache: &cacheEntry{NodeID: "n1", WorkerID: 7, Timestamp: now - 10_000},
			wantErr: ErrCacheOtherRegistry, wantMsg: "does not say which registry issued its worker ID (written by an earlier version), so it cannot stand in for zk /snowflake/down; start once with ZooKeeper reachable"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cache := &CacheFile{Path: filepath.Join(t.TempDir(), "cache.json")}
			if tt.cache != nil {
				must(t, "Save", cache.Save(*tt.cache))
			}
			r := openZK(t, zkConfig([]string{closedAddr(t)}, "down", "10.0.0.5:8080", func(c *ZKRegistryConfig) {
				c.Recycle, c.TTL, c.SessionTimeout, c.Cache = tt.recycle, 2*time.Second, time.Second, cache
			}))
			l, err := r.Acquire(testutil.Context(t, 10*time.Second))
			if tt.wantErr != nil {
				testutil.CheckErr(t, "Acquire", err, tt.wantErr, tt.wantMsg)
				return
			}
			must(t, "Acquire", err)
			if l.WorkerID() != tt.cache.WorkerID || l.Recorded() != tt.cache.Timestamp || l.TTL() != 0 {
				t.Fatalf("lease from cache: WorkerID %d Recorded %d TTL %s, want %d, %d, 0", l.WorkerID(), l.Recorded(), l.TTL(), tt.cache.WorkerID, tt.cache.Timestamp)
			}
			if err := l.Renew(testutil.Context(t, 5*time.Second), now); err == nil {
				t.Fatal("Renew with ZooKeeper down = nil, want an error")
			}
			g, err := newGuard(guardConfig(func(c *GuardConfig) {
				c.NodeID = "n1"
				c.Cache = cache
				c.Logger = testutil.Logger(t)
			}))
			must(t, "newGuard", err)
			_, err = g.Start(testutil.Context(t, 10*time.Second), l)
			if tt.guard != nil {
				wantErrIs(t, "Guard.Start", err, tt.guard)
				return
			}
			must(t, "Guard.Start", err)
		})
	}
}

// zkBehindProxy is the shared ZooKeeper server, a connection to it, a fresh node name
// for the test, and a proxy in front of the server that the test can cut (Kill: every
// connection dropped and new ones refused, as in a network partition, while the server
// stays up and expires the sessions that went silent) and Heal.
func zkBehindProxy(t *testing.T) (*testenv.ZooKeeperServer, *zk.Conn, string, *testenv.Proxy) {
	t.Helper()
	srv := testenv.ZooKeeper(t)
	conn := srv.Connect(t)
	return srv, conn, zkTestName(t, srv, conn), testenv.StartProxy(t, srv.Addr())
}

func TestZKRegistryConfigValidate(t *testing.T) {
	tests := []struct {
		name    string
		edit    func(*ZKRegistryConfig)
		wantMsg string
	}{
		{"no servers", func(c *ZKRegistryConfig) { c.Servers = nil }, "Servers is empty"},
		{"empty name", func(c *ZKRegistryConfig) { c.Name = "" }, `Name ""`},
		{"absolute name", func(c *ZKRegistryConfig) { c.Name = "/x" }, `Name "/x"`},
		{"advertise without port", func(c *ZKRegistryConfig) { c.Advertise = "10.0.0.5" }, `Advertise "10.0.0.5"`},
		{"advertise with dash", func(c *ZKRegistryConfig) { c.Advertise = "host-a:8080" }, `Advertise "host-a:8080"`},
		{"negative MaxWorkerID", zkMaxWorkerID(-1), "MaxWorkerID is -1"},
		{"zero TTL", func(c *ZKRegistryConfig) { c.TTL = 0 }, "TTL is 0s, want > 0"},
		{"zero SessionTimeout", zkSessionTimeout(0), "SessionTimeout is 0s, want > 0"},
	}
	ok := zkConfig([]string{"127.0.0.1:2181"}, "leafbus", "10.0.0.5:8080")
	must(t, "Validate OK", ok.Validate())
	must(t, "Validate with only worker ID 0", zkConfig([]string{"127.0.0.1:2181"}, "leafbus", "10.0.0.5:8080", zkMaxWorkerID(0)).Validate())
	for _, tt := range tests {
		t.Run("ErrInvalidConfig "+tt.name, func(t *testing.T) {
			err := zkConfig([]string{"127.0.0.1:2181"}, "leafbus", "10.0.0.5:8080", tt.edit).Validate()
			wantErrIs(t, "Validate", err, ErrInvalidConfig)
			if !strings.Contains(err.Error(), tt.wantMsg) {
				t.Errorf("Validate() = %q, want it to name %q", err, tt.wantMsg)
			}
		})
	}
}
