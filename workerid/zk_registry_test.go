package workerid

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

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

// openZK opens a registry with test defaults (short session timeout, test logger),
// closed at cleanup.
func openZK(tb testing.TB, cfg ZKRegistryConfig) *ZKRegistry {
	tb.Helper()
	if cfg.Logger == nil {
		cfg.Logger = testLogger(tb)
	}
	if cfg.SessionTimeout == 0 {
		cfg.SessionTimeout = 2 * time.Second
	}
	r, err := OpenZKRegistry(testCtx(tb, 10*time.Second), cfg)
	if err != nil {
		tb.Fatalf("OpenZKRegistry(%+v): %v", cfg, err)
	}
	tb.Cleanup(r.Close)
	return r
}

func zkAcquire(tb testing.TB, r Registry) Lease {
	tb.Helper()
	l, err := r.Acquire(testCtx(tb, 15*time.Second))
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

func TestZKRegistryLeafLayout(t *testing.T) {
	t.Parallel()
	srv := testenv.ZooKeeper(t)
	conn := srv.Connect(t)
	name := zkTestName(t, srv, conn)

	r := openZK(t, ZKRegistryConfig{Servers: srv.Servers(), Name: name, Advertise: "10.0.0.5:8080"})
	l := zkAcquire(t, r)
	if l.WorkerID() != 0 || l.TTL() != 0 {
		t.Fatalf("first node: WorkerID %d TTL %s, want 0 and 0", l.WorkerID(), l.TTL())
	}
	node := "/snowflake/" + name + "/forever/10.0.0.5:8080-0000000000"
	ctx := testCtx(t, 10*time.Second)
	ts := time.Now().UnixMilli() + 1000
	must(t, "Renew", l.Renew(ctx, ts))
	if got, want := zkGet(t, conn, node), fmt.Sprintf(`{"ip":"10.0.0.5","port":"8080","timestamp":%d}`, ts); got != want {
		t.Fatalf("%s = %s, want %s", node, got, want)
	}
	// The record only rises.
	must(t, "Renew lower", l.Renew(ctx, ts-500))
	if got := zkGet(t, conn, node); !strings.Contains(got, fmt.Sprint(ts)) {
		t.Fatalf("after a lower Renew %s = %s, want the higher timestamp kept", node, got)
	}

	l2 := zkAcquire(t, openZK(t, ZKRegistryConfig{Servers: srv.Servers(), Name: name, Advertise: "10.0.0.6:8080"}))
	if l2.WorkerID() != 1 {
		t.Fatalf("second node: WorkerID %d, want 1", l2.WorkerID())
	}
	children, _, err := conn.Children("/snowflake/" + name + "/forever")
	must(t, "Children", err)
	if len(children) != 2 {
		t.Fatalf("forever/ children %v, want exactly the two Leaf nodes", children)
	}
}

func TestZKRegistryRestartKeepsWorkerID(t *testing.T) {
	t.Parallel()
	srv := testenv.ZooKeeper(t)
	conn := srv.Connect(t)
	name := zkTestName(t, srv, conn)
	cfg := ZKRegistryConfig{Servers: srv.Servers(), Name: name, Advertise: "10.0.0.5:8080"}
	// Another node first, so the ID kept is not 0 by chance.
	zkAcquire(t, openZK(t, ZKRegistryConfig{Servers: srv.Servers(), Name: name, Advertise: "10.0.0.9:8080"}))

	ctx := testCtx(t, 20*time.Second)
	r1 := openZK(t, cfg)
	l1 := zkAcquire(t, r1)
	if l1.Recorded() != 0 {
		t.Fatalf("new node: Recorded %d, want 0 (nothing issued yet)", l1.Recorded())
	}
	ts := time.Now().UnixMilli() + 1000
	must(t, "Renew", l1.Renew(ctx, ts))
	must(t, "Release", l1.Release(ctx, ts+100))
	r1.Close()

	l2 := zkAcquire(t, openZK(t, cfg))
	if l2.WorkerID() != l1.WorkerID() || l2.Recorded() != ts+100 {
		t.Fatalf("after restart: WorkerID %d Recorded %d, want %d and %d", l2.WorkerID(), l2.Recorded(), l1.WorkerID(), ts+100)
	}
}

// A node that Leaf itself registered (persistent sequential, Leaf's JSON) is found by
// ip:port and its timestamp is the record.
func TestZKRegistryTakesOverLeafNode(t *testing.T) {
	t.Parallel()
	srv := testenv.ZooKeeper(t)
	conn := srv.Connect(t)
	name := zkTestName(t, srv, conn)
	forever := "/snowflake/" + name + "/forever"
	for _, p := range []string{"/snowflake", "/snowflake/" + name, forever} {
		if _, err := conn.Create(p, nil, 0, zk.WorldACL(zk.PermAll)); err != nil && !errors.Is(err, zk.ErrNodeExists) {
			t.Fatalf("create %s: %v", p, err)
		}
	}
	const leafTS = int64(1763790000999)
	var created string
	for _, addr := range []string{"10.0.0.1:8080", "10.0.0.2:8080", "10.0.0.7:8080"} {
		data := fmt.Sprintf(`{"ip":"%s","port":"8080","timestamp":%d}`, strings.Split(addr, ":")[0], leafTS)
		var err error
		created, err = conn.Create(forever+"/"+addr+"-", []byte(data), zk.FlagSequence, zk.WorldACL(zk.PermAll))
		must(t, "create Leaf node", err)
	}
	if !strings.HasSuffix(created, "-0000000002") {
		t.Fatalf("hand-made Leaf node %s, want sequence 2", created)
	}
	l := zkAcquire(t, openZK(t, ZKRegistryConfig{Servers: srv.Servers(), Name: name, Advertise: "10.0.0.7:8080"}))
	if l.WorkerID() != 2 || l.Recorded() != leafTS {
		t.Fatalf("Leaf node taken over: WorkerID %d Recorded %d, want 2 and %d", l.WorkerID(), l.Recorded(), leafTS)
	}
}

// Leaf's first start on an empty tree gives two nodes starting together worker 0 both.
func TestZKRegistryFirstStartRace(t *testing.T) {
	t.Parallel()
	srv := testenv.ZooKeeper(t)
	conn := srv.Connect(t)
	for round := range 10 {
		name := zkTestName(t, srv, conn)
		regs := []*ZKRegistry{
			openZK(t, ZKRegistryConfig{Servers: srv.Servers(), Name: name, Advertise: "10.0.0.1:8080"}),
			openZK(t, ZKRegistryConfig{Servers: srv.Servers(), Name: name, Advertise: "10.0.0.2:8080"}),
		}
		for _, r := range regs { // both ready, so they really start together
			if !r.waitSession(testCtx(t, 10*time.Second), 10*time.Second) {
				t.Fatalf("round %d: no session", round)
			}
		}
		ids := raceAcquire(t, regs)
		if ids[0] == ids[1] {
			t.Fatalf("round %d: both nodes got worker ID %d", round, ids[0])
		}
	}
}

func TestZKRegistrySameAddressRefused(t *testing.T) {
	t.Parallel()
	srv := testenv.ZooKeeper(t)
	conn := srv.Connect(t)
	name := zkTestName(t, srv, conn)
	cfg := ZKRegistryConfig{Servers: srv.Servers(), Name: name, Advertise: "10.0.0.5:8080", SessionTimeout: time.Second}

	first := zkAcquire(t, openZK(t, cfg))
	_, err := openZK(t, cfg).Acquire(testCtx(t, 15*time.Second))
	wantErrIs(t, "second Acquire as the same ip:port", err, ErrZKAddressInUse)
	if !strings.Contains(err.Error(), "10.0.0.5:8080") {
		t.Fatalf("error %q does not name the ip:port", err)
	}
	// Released, the ID is this ip:port's again at once.
	must(t, "Release", first.Release(testCtx(t, 5*time.Second), 1))
	if l := zkAcquire(t, openZK(t, cfg)); l.WorkerID() != first.WorkerID() {
		t.Fatalf("after release: WorkerID %d, want %d", l.WorkerID(), first.WorkerID())
	}
}

func TestZKRegistrySequenceOutOfRange(t *testing.T) {
	t.Parallel()
	srv := testenv.ZooKeeper(t)
	conn := srv.Connect(t)
	name := zkTestName(t, srv, conn)
	for i := range 3 {
		l := zkAcquire(t, openZK(t, ZKRegistryConfig{Servers: srv.Servers(), Name: name, Advertise: fmt.Sprintf("10.0.0.%d:8080", i+1), MaxWorkerID: 2}))
		if l.WorkerID() != int64(i) {
			t.Fatalf("node %d: WorkerID %d", i, l.WorkerID())
		}
	}
	_, err := openZK(t, ZKRegistryConfig{Servers: srv.Servers(), Name: name, Advertise: "10.0.0.9:8080", MaxWorkerID: 2}).
		Acquire(testCtx(t, 10*time.Second))
	wantErrIs(t, "Acquire past the range", err, ErrZKSequenceOutOfRange)
	for _, want := range []string{"worker ID 3", "10.0.0.9:8080-0000000003", "above 2", "--zk-recycle"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
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
		cache   *CacheEntry
		wantErr error // from Acquire
		guard   error // from Guard.Start
	}{
		{name: "ErrZKUnavailable without cache file", wantErr: ErrZKUnavailable},
		{name: "OK from cache file behind the clock", cache: &CacheEntry{NodeID: "n1", WorkerID: 7, Timestamp: now - 10_000}},
		{name: "ErrClockBehindRecord from cache file ahead of the clock", cache: &CacheEntry{NodeID: "n1", WorkerID: 7, Timestamp: now + 60_000}, guard: ErrClockBehindRecord},
		{name: "ErrZKUnavailable in recycle mode", recycle: true, cache: &CacheEntry{NodeID: "n1", WorkerID: 7, Timestamp: now - 10_000}, wantErr: ErrZKUnavailable},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cache := &CacheFile{Path: filepath.Join(t.TempDir(), "cache.json")}
			if tt.cache != nil {
				must(t, "Save", cache.Save(*tt.cache))
			}
			r := openZK(t, ZKRegistryConfig{Servers: []string{closedAddr(t)}, Name: "down", Advertise: "10.0.0.5:8080",
				Recycle: tt.recycle, TTL: 2 * time.Second, SessionTimeout: time.Second, Cache: cache})
			l, err := r.Acquire(testCtx(t, 10*time.Second))
			if tt.wantErr != nil {
				wantErrIs(t, "Acquire", err, tt.wantErr)
				return
			}
			must(t, "Acquire", err)
			if l.WorkerID() != tt.cache.WorkerID || l.Recorded() != tt.cache.Timestamp || l.TTL() != 0 {
				t.Fatalf("lease from cache: WorkerID %d Recorded %d TTL %s, want %d, %d, 0", l.WorkerID(), l.Recorded(), l.TTL(), tt.cache.WorkerID, tt.cache.Timestamp)
			}
			if err := l.Renew(testCtx(t, 5*time.Second), now); err == nil {
				t.Fatal("Renew with ZooKeeper down = nil, want an error")
			}
			g, err := NewGuard(GuardConfig{NodeID: "n1", Cache: cache, Logger: testLogger(t)})
			must(t, "NewGuard", err)
			_, err = g.Start(testCtx(t, 10*time.Second), l)
			if tt.guard != nil {
				wantErrIs(t, "Guard.Start", err, tt.guard)
				return
			}
			must(t, "Guard.Start", err)
		})
	}
}

// Started from the cache file, the lease finds its node once ZooKeeper is back and
// records there again.
func TestZKRegistryCacheThenZooKeeperBack(t *testing.T) {
	t.Parallel()
	srv := testenv.StartZooKeeper(t)
	cfg := ZKRegistryConfig{Servers: srv.Servers(), Name: "back", Advertise: "10.0.0.5:8080", SessionTimeout: time.Second}
	zkAcquire(t, openZK(t, ZKRegistryConfig{Servers: srv.Servers(), Name: "back", Advertise: "10.0.0.1:8080"}))
	first := openZK(t, cfg)
	l := zkAcquire(t, first)
	must(t, "Release", l.Release(testCtx(t, 5*time.Second), 1000))
	first.Close()
	cfg.Cache = &CacheFile{Path: filepath.Join(t.TempDir(), "cache.json")}
	must(t, "Save", cfg.Cache.Save(CacheEntry{NodeID: "n1", WorkerID: l.WorkerID(), Timestamp: 2000}))

	srv.Stop()
	down := openZK(t, cfg)
	fallback := zkAcquire(t, down)
	if fallback.WorkerID() != l.WorkerID() || fallback.Recorded() != 2000 {
		t.Fatalf("from cache: WorkerID %d Recorded %d, want %d and 2000", fallback.WorkerID(), fallback.Recorded(), l.WorkerID())
	}
	srv.Start()
	ts := time.Now().UnixMilli() + 5000
	eventually(t, 15*time.Second, "Renew to reach ZooKeeper again", func() bool {
		return fallback.Renew(testCtx(t, 2*time.Second), ts) == nil
	})
	conn := srv.Connect(t)
	if got := zkGet(t, conn, "/snowflake/back/forever/10.0.0.5:8080-0000000001"); !strings.Contains(got, fmt.Sprintf(`"timestamp":%d`, ts)) {
		t.Fatalf("node after ZooKeeper came back = %s, want timestamp %d", got, ts)
	}
}

func TestZKRecycleRace(t *testing.T) {
	t.Parallel()
	srv := testenv.ZooKeeper(t)
	conn := srv.Connect(t)
	name := zkTestName(t, srv, conn)
	var regs []*ZKRegistry
	for i := range 10 {
		r := openZK(t, ZKRegistryConfig{Servers: srv.Servers(), Name: name, Advertise: fmt.Sprintf("10.0.0.%d:8080", i), Recycle: true, TTL: 4 * time.Second})
		if !r.waitSession(testCtx(t, 10*time.Second), 10*time.Second) {
			t.Fatal("no session")
		}
		regs = append(regs, r)
	}
	seen := map[int64]bool{}
	for _, id := range raceAcquire(t, regs) {
		if seen[id] {
			t.Fatalf("worker ID %d leased twice", id)
		}
		if id < 0 || id > 9 {
			t.Fatalf("worker ID %d, want the lowest free ones 0..9", id)
		}
		seen[id] = true
	}
}

// zkProxy forwards TCP to a ZooKeeper server until frozen: then it drops every
// connection and refuses new ones, as a network partition does, while the server
// stays up and expires the sessions that went silent.
type zkProxy struct {
	ln     net.Listener
	target string

	mu     sync.Mutex
	frozen bool
	conns  []net.Conn
	wg     sync.WaitGroup
}

func startZKProxy(tb testing.TB, target string) *zkProxy {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	must(tb, "Listen", err)
	p := &zkProxy{ln: ln, target: target}
	p.wg.Add(1)
	go p.accept()
	tb.Cleanup(func() {
		ln.Close()
		p.setFrozen(true)
		p.wg.Wait()
	})
	return p
}

func (p *zkProxy) Addr() string { return p.ln.Addr().String() }

func (p *zkProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		if p.frozen {
			p.mu.Unlock()
			c.Close()
			continue
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			p.mu.Unlock()
			c.Close()
			continue
		}
		p.conns = append(p.conns, c, s)
		p.wg.Add(2)
		p.mu.Unlock()
		go p.pipe(c, s)
		go p.pipe(s, c)
	}
}

func (p *zkProxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	_, _ = io.Copy(dst, src)
	dst.Close()
	src.Close()
}

func (p *zkProxy) setFrozen(frozen bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.frozen = frozen
	if frozen {
		for _, c := range p.conns {
			c.Close()
		}
		p.conns = nil
	}
}

// A silent holder's ID goes to another node once its session expired (TTL); the new
// holder starts past the old one's last report and the old holder's Renew says lost.
func TestZKRecycleExpiry(t *testing.T) {
	t.Parallel()
	srv := testenv.ZooKeeper(t)
	conn := srv.Connect(t)
	name := zkTestName(t, srv, conn)
	proxy := startZKProxy(t, srv.Addr())
	const ttl = 2 * time.Second

	a := openZK(t, ZKRegistryConfig{Servers: []string{proxy.Addr()}, Name: name, Advertise: "10.0.0.1:8080", Recycle: true, TTL: ttl})
	la := zkAcquire(t, a)
	if la.TTL() != ttl {
		t.Fatalf("TTL %s, want %s", la.TTL(), ttl)
	}
	ctx := testCtx(t, 30*time.Second)
	lastReport := time.Now().UnixMilli()
	must(t, "Renew", la.Renew(ctx, lastReport))

	proxy.setFrozen(true)
	leasePath := a.leasePath(la.WorkerID())
	eventually(t, 10*time.Second, "the silent holder's lease node to expire", func() bool {
		ok, _, err := conn.Exists(leasePath)
		return err == nil && !ok
	})
	b := openZK(t, ZKRegistryConfig{Servers: srv.Servers(), Name: name, Advertise: "10.0.0.2:8080", Recycle: true, TTL: ttl})
	lb := zkAcquire(t, b)
	if lb.WorkerID() != la.WorkerID() {
		t.Fatalf("new holder got worker ID %d, want the expired %d", lb.WorkerID(), la.WorkerID())
	}
	if lb.Recorded() < lastReport {
		t.Fatalf("new holder's Recorded %d, want >= the previous holder's last report %d", lb.Recorded(), lastReport)
	}

	proxy.setFrozen(false)
	var err error
	eventually(t, 15*time.Second, "the old holder's Renew to report the lease lost", func() bool {
		err = la.Renew(ctx, time.Now().UnixMilli())
		return errors.Is(err, ErrLeaseLost)
	})
	// The old holder's failed renewals never lowered nor took over the new holder's record.
	must(t, "new holder Renew", lb.Renew(ctx, time.Now().UnixMilli()))
}

// A holder cut off from ZooKeeper is suspended by its heartbeat (at TTL/2) while the
// lease node still exists, i.e. before anyone else could be given the ID.
func TestZKRecycleHeartbeatSuspendsBeforeExpiry(t *testing.T) {
	t.Parallel()
	srv := testenv.ZooKeeper(t)
	conn := srv.Connect(t)
	name := zkTestName(t, srv, conn)
	proxy := startZKProxy(t, srv.Addr())
	const ttl = 2 * time.Second

	r := openZK(t, ZKRegistryConfig{Servers: []string{proxy.Addr()}, Name: name, Advertise: "10.0.0.1:8080", Recycle: true, TTL: ttl})
	lease := zkAcquire(t, r)
	gen := &fakeGen{}
	hb, err := NewHeartbeat(HeartbeatConfig{NodeID: "n1", Lease: lease, Generator: gen, Interval: 250 * time.Millisecond,
		WriteTimeout: 200 * time.Millisecond, Logger: testLogger(t)})
	must(t, "NewHeartbeat", err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- hb.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Error("heartbeat Run did not return")
		}
	})
	eventually(t, 5*time.Second, "the first beat to resume the generator", func() bool {
		_, s := gen.state()
		return s == nil
	})

	proxy.setFrozen(true)
	eventually(t, 5*time.Second, "the heartbeat to suspend the generator", func() bool {
		_, s := gen.state()
		return errors.Is(s, ErrLeaseLost)
	})
	ok, st, err := conn.Exists(r.leasePath(lease.WorkerID()))
	must(t, "Exists", err)
	if !ok {
		t.Fatal("the lease node had already expired when the generator was suspended")
	}
	if st.EphemeralOwner == 0 {
		t.Fatal("lease node is not ephemeral")
	}
}

func TestZKRegistryConfigValidate(t *testing.T) {
	ok := ZKRegistryConfig{Servers: []string{"127.0.0.1:2181"}, Name: "leafbus", Advertise: "10.0.0.5:8080"}
	tests := []struct {
		name   string
		modify func(*ZKRegistryConfig)
	}{
		{"no servers", func(c *ZKRegistryConfig) { c.Servers = nil }},
		{"empty name", func(c *ZKRegistryConfig) { c.Name = "" }},
		{"absolute name", func(c *ZKRegistryConfig) { c.Name = "/x" }},
		{"advertise without port", func(c *ZKRegistryConfig) { c.Advertise = "10.0.0.5" }},
		{"advertise with dash", func(c *ZKRegistryConfig) { c.Advertise = "host-a:8080" }},
		{"negative MaxWorkerID", func(c *ZKRegistryConfig) { c.MaxWorkerID = -1 }},
	}
	must(t, "Validate OK", ok.Validate())
	for _, tt := range tests {
		t.Run("ErrInvalidConfig "+tt.name, func(t *testing.T) {
			c := ok
			tt.modify(&c)
			wantErrIs(t, "Validate", c.Validate(), ErrInvalidConfig)
		})
	}
}
