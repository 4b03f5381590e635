package workerid

import (
	"context"
	"encoding/json"
	"io"
	"net"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/leafbus/leafbus/internal/backoff"
	"github.com/leafbus/leafbus/internal/testutil"
	"github.com/leafbus/leafbus/testenv"
)

// hangProxy accepts ZooKeeper clients and, while hanging, never answers them (as a
// server that accepts connections before it serves does: the client's handshake waits
// ten receive timeouts); once forwarding, new connections reach the server. Connections
// accepted while hanging stay hung.
type hangProxy struct {
	ln     net.Listener
	target string

	mu      sync.Mutex
	forward bool
	hung    int // connections accepted while not forwarding, their handshake dropped
	conns   []net.Conn
	wg      sync.WaitGroup
}

func startHangProxy(tb testing.TB, target string) *hangProxy {
	tb.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	must(tb, "Listen", err)
	p := &hangProxy{ln: ln, target: target}
	p.wg.Add(1)
	go p.accept()
	tb.Cleanup(func() {
		ln.Close()
		p.mu.Lock()
		for _, c := range p.conns {
			c.Close()
		}
		p.mu.Unlock()
		p.wg.Wait()
	})
	return p
}

func (p *hangProxy) Addr() string { return p.ln.Addr().String() }

// hungConns is how many connections the proxy took in while hanging them.
func (p *hangProxy) hungConns() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.hung
}

func (p *hangProxy) setForward() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.forward = true
}

func (p *hangProxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.mu.Lock()
		p.conns = append(p.conns, c)
		if !p.forward {
			p.hung++
			p.wg.Add(1)
			go func() { // read and drop: the handshake is never answered
				defer p.wg.Done()
				_, _ = io.Copy(io.Discard, c)
			}()
			p.mu.Unlock()
			continue
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			p.mu.Unlock()
			c.Close()
			continue
		}
		p.conns = append(p.conns, s)
		p.wg.Add(2)
		p.mu.Unlock()
		go p.pipe(c, s)
		go p.pipe(s, c)
	}
}

func (p *hangProxy) pipe(dst, src net.Conn) {
	defer p.wg.Done()
	_, _ = io.Copy(dst, src)
	dst.Close()
	src.Close()
}

// runRegistry runs r.Run until the test ends.
func runRegistry(tb testing.TB, r *ZKRegistry) {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = r.Run(ctx)
	}()
	tb.Cleanup(func() {
		cancel()
		receive(tb, done, "ZKRegistry.Run to return")
	})
}

// A client whose handshake is never answered sits without a session for ten receive
// timeouts (13 s with a 2 s session) even once the server answers new connections: Run
// replaces it within about a second, and the new client has a session at once.
func TestZKRegistryReplacesStuckClient(t *testing.T) {
	t.Parallel()
	srv := testenv.ZooKeeper(t)
	conn := srv.Connect(t)
	name := zkTestName(t, srv, conn)
	proxy := startHangProxy(t, srv.Addr())
	r := openZK(t, zkConfig([]string{proxy.Addr()}, name, "10.0.0.5:8080"))
	// Connected is the client's side; the proxy may not have called Accept yet (the
	// kernel completes the connection first). Forwarding before it hung the connection
	// would let the handshake through, and nothing would be stuck.
	testutil.Eventually(t, 5*time.Second, "the client to connect and wait for its handshake", func() bool {
		return r.conn.State() == zk.StateConnected && proxy.hungConns() > 0
	})
	proxy.setForward()
	runRegistry(t, r)
	start := time.Now()
	testutil.Eventually(t, 5*time.Second, "a session", r.Connected)
	t.Logf("session %s after the server answered, %d replacement(s)", time.Since(start).Round(time.Millisecond), r.conn.Replaced())
	if r.conn.Replaced() == 0 {
		t.Fatalf("the stuck client got a session without being replaced")
	}
	zkAcquire(t, r)
}

// After the client is replaced, the lease of Leaf's layout renews on the new session:
// its alive node, left by the old session, carries this node's owner token and is taken
// over, not taken for another process's.
func TestZKLeafLeaseSurvivesClientReplacement(t *testing.T) {
	t.Parallel()
	srv := testenv.ZooKeeper(t)
	conn := srv.Connect(t)
	name := zkTestName(t, srv, conn)
	cache := &CacheFile{Path: filepath.Join(t.TempDir(), "n1.json")}
	r := openZK(t, zkConfig(srv.Servers(), name, "10.0.0.5:8080", func(c *ZKRegistryConfig) { c.Cache = cache }))
	lease := zkAcquire(t, r)
	ctx := testutil.Context(t, 20*time.Second)
	must(t, "Renew", lease.Renew(ctx, time.Now().UnixMilli()))
	old := r.conn.SessionID()

	r.replaceClient(0, "test")
	testutil.Eventually(t, 5*time.Second, "a new session", func() bool { return r.Connected() && r.conn.SessionID() != old })
	must(t, "Renew on the new session", lease.Renew(ctx, time.Now().UnixMilli()))
	_, st, err := conn.Get(r.alivePath())
	must(t, "Get alive node", err)
	if st.EphemeralOwner != r.conn.SessionID() {
		t.Fatalf("alive node owned by session %x, want the new session %x", st.EphemeralOwner, r.conn.SessionID())
	}
}

// Recycle mode: the lease node of the replaced client's session is taken over by token
// in one multi-op; the watch sees it there again and the holder issues on, the ID kept.
func TestZKRecycleLeaseSurvivesClientReplacement(t *testing.T) {
	t.Parallel()
	srv, conn, name, proxy := zkBehindProxy(t)
	r := openZK(t, zkConfig([]string{proxy.Addr()}, name, "10.0.0.1:8080", zkRecycle(zkWatchTTL)))
	lease := zkAcquire(t, r)
	h := startWatchedHolder(t, lease, zkWatchBeat)
	h.waitWatched(t)
	old := r.conn.SessionID()

	// The client loses its server (its session lives on there) and is replaced by one
	// that reaches the server another way.
	direct(r, srv.Servers())
	proxy.Kill()
	r.replaceClient(0, "test")
	start := time.Now()
	testutil.Eventually(t, 10*time.Second, "the lease node on the new session and the holder issuing", func() bool {
		_, st, err := conn.Get(r.leasePath(lease.WorkerID()))
		if err != nil || st.EphemeralOwner == old || st.EphemeralOwner != r.conn.SessionID() {
			return false
		}
		_, err = h.gen.Next()
		return err == nil
	})
	t.Logf("issuing again %s after the client was replaced", time.Since(start).Round(time.Millisecond))
	if st := h.hb.Stats(); st.LeaseLost {
		t.Fatalf("Stats() = %+v, want the lease kept", st)
	}
}

// direct makes r's next clients dial servers, as they were not dialled before.
func direct(r *ZKRegistry, servers []string) {
	r.conn.dial = func(dialer zk.Dialer, observe func(zk.Event)) (*zk.Conn, error) {
		conn, _, err := zk.Connect(servers, r.cfg.SessionTimeout, zk.WithDialer(dialer),
			zk.WithLogger(zkLogger{log: r.log, granted: r.granted}),
			zk.WithEventCallback(func(ev zk.Event) { observe(ev); r.onEvent(ev) }))
		return conn, err
	}
}

// A node restarted after kill -9 takes its own alive node over at once when the node's
// owner token is the one in its cache file, instead of waiting out the dead session
// (Leaf's layout); another process under the same ip:port, with another cache file, is
// still made to wait and refused.
func TestZKLeafRestartTakesOverOwnSession(t *testing.T) {
	t.Parallel()
	srv, conn, name, proxy := zkBehindProxy(t)
	dir := t.TempDir()
	cache := &CacheFile{Path: filepath.Join(dir, "n1.json")}
	withCache := func(c *ZKRegistryConfig) { c.Cache = cache }
	long := func(c *ZKRegistryConfig) { c.SessionTimeout = 8 * time.Second }

	crashed := openZK(t, zkConfig([]string{proxy.Addr()}, name, "10.0.0.5:8080", withCache, long))
	lease := zkAcquire(t, crashed)
	h := testHeartbeat(t, heartbeatConfig(func(c *HeartbeatConfig) {
		c.Lease, c.Generator, c.Cache = lease, &fakeGen{}, cache
	}))
	must(t, "Beat", h.Beat(testutil.Context(t, 10*time.Second)))
	proxy.Kill() // the process is gone; its session lives on in ZooKeeper
	var alive aliveValue
	must(t, "decode alive node", json.Unmarshal([]byte(zkGet(t, conn, crashed.alivePath())), &alive))
	if e, err := cache.Load(); err != nil || e.Owner == "" || e.Owner != alive.Owner {
		t.Fatalf("cache file %+v (%v), alive node %+v: want the same owner token in both", e, err, alive)
	}

	start := time.Now()
	restarted := zkAcquire(t, openZK(t, zkConfig(srv.Servers(), name, "10.0.0.5:8080", withCache, long)))
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("restart took %s, want under 2s: the old session was this node's own", d)
	}
	if restarted.WorkerID() != lease.WorkerID() {
		t.Fatalf("restarted with worker ID %d, want %d", restarted.WorkerID(), lease.WorkerID())
	}

	other := &CacheFile{Path: filepath.Join(dir, "other.json")}
	short := zkConfig(srv.Servers(), name, "10.0.0.5:8080", func(c *ZKRegistryConfig) { c.Cache, c.SessionTimeout = other, time.Second })
	_, err := openZK(t, short).Acquire(testutil.Context(t, 15*time.Second))
	wantErrIs(t, "Acquire by another process as the same ip:port", err, ErrZKAddressInUse)
}

// ZooKeeper restarted while the client is connected (TESTENV-NOTES.md: a go-zk client can
// stay without a session long after): the session is back within 2 s of the server
// serving again. Once the server accepts connections the client is replaced at once,
// and a client whose handshake the restarting server leaves unanswered is replaced after
// half a second, instead of waiting out go-zk's own retry.
func TestZKRegistrySessionBackSoonAfterRestart(t *testing.T) {
	srv := testenv.StartZooKeeper(t)
	conn := srv.Connect(t)
	name := zkTestName(t, srv, conn)
	r := openZK(t, zkConfig(srv.Servers(), name, "10.0.0.5:8080"))
	zkAcquire(t, r)
	runRegistry(t, r)
	srv.Stop()
	testutil.Eventually(t, 5*time.Second, "the session to be lost", func() bool { return !r.Connected() })
	time.Sleep(3 * time.Second) // long enough for a replacement and go-zk's own retries
	before := r.conn.Replaced()
	srv.Start()
	back := time.Now()
	testutil.Eventually(t, 10*time.Second, "a session", r.Connected)
	took := time.Since(back)
	t.Logf("session %s after ZooKeeper was serving again; %d replacement(s) while it was down, %d after",
		took.Round(time.Millisecond), before, r.conn.Replaced()-before)
	if took > 2*time.Second {
		t.Fatalf("session %s after ZooKeeper was back, want within 2s", took.Round(time.Millisecond))
	}
}

// TestZKWatchdogProbe: without a session, the watchdog replaces the client as soon as a
// server accepts connections again (after zkProbeAfter), once per outage, rather than
// waiting out ReplaceAfter; with a session again, it starts afresh.
func TestZKWatchdogProbe(t *testing.T) {
	start := time.Unix(1_700_000_000, 0)
	d := zkWatchdog{retry: backoff.New(zkReplaceRetry), replaceAfter: time.Minute, lastOK: start, wait: time.Minute}
	up := false
	probes := 0
	reachable := func() bool { probes++; return up }
	at := func(d time.Duration) time.Time { return start.Add(d) }
	if why := d.check(zk.StateDisconnected, reachable, at(zkProbeAfter/2)); why != "" || probes != 0 {
		t.Fatalf("before zkProbeAfter: %q after %d probes, want nothing and no probe", why, probes)
	}
	if why := d.check(zk.StateDisconnected, reachable, at(zkProbeAfter+time.Millisecond)); why != "" || probes != 1 {
		t.Fatalf("servers down: %q after %d probes, want nothing after one probe", why, probes)
	}
	up = true
	if why := d.check(zk.StateDisconnected, reachable, at(zkProbeAfter+zkProbeEvery+2*time.Millisecond)); why != "ZooKeeper accepts connections again" {
		t.Fatalf("a server back: %q, want the replacement on reachability", why)
	}
	replacedAt := at(zkProbeAfter + zkProbeEvery + 2*time.Millisecond)
	d.replaced(replacedAt)
	before := probes
	// Looked at until just before the next replacement may be due: the retry's first
	// wait less its jitter.
	shortest := time.Duration(float64(zkReplaceRetry.Min) * (1 - zkReplaceRetry.Jitter))
	for i := 2; ; i++ {
		now := at(zkProbeAfter + time.Duration(i)*zkProbeEvery + 3*time.Millisecond)
		if now.Sub(replacedAt) >= shortest {
			break
		}
		if why := d.check(zk.StateDisconnected, reachable, now); why != "" {
			t.Fatalf("the same outage again: %q, want one replacement on reachability per outage", why)
		}
	}
	if probes != before {
		t.Errorf("probed %d more times in an outage whose one replacement is spent", probes-before)
	}
	d.check(zk.StateHasSession, reachable, at(time.Second))
	up = true
	if why := d.check(zk.StateDisconnected, reachable, at(time.Second+zkProbeAfter+time.Millisecond)); why != "ZooKeeper accepts connections again" {
		t.Fatalf("a new outage: %q, want the probe's replacement again", why)
	}
}
