package monotonic

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/leafbus/leafbus/bus"
	"github.com/leafbus/leafbus/core"
	"github.com/leafbus/leafbus/internal/testutil"
	"github.com/leafbus/leafbus/segment"
	"github.com/leafbus/leafbus/testenv"
	"github.com/leafbus/leafbus/wire"
)

// env is what the dispensers of one test share: the NATS servers and the settings.
type env struct {
	t        testing.TB
	urls     string // what the dispensers connect to, unless through a proxy
	prefix   string
	replicas int
	ttl      time.Duration
	renew    time.Duration
	log      bool   // dispensers log to the test log
	mysqlDSN string // segments from this MySQL database instead of the KV store
	// wrapLeaders, when set, wraps each dispenser's <prefix>_leaders bucket before its
	// Manager runs (to fail its lease writes).
	wrapLeaders func(node string, kv jetstream.KeyValue) jetstream.KeyValue
	// wrapOpts, when set, wraps each dispenser's <prefix>_tagopts bucket likewise.
	wrapOpts func(kv jetstream.KeyValue) jetstream.KeyValue
	// dirs is each dispenser's data dir, by name: a dispenser started again under a
	// name keeps its memory of monotonic tags, as a restarted process does.
	dirs map[string]string
}

// dataDir is the data dir of dispenser name, the same for every start under that name.
func (e *env) dataDir(name string) string {
	if e.dirs == nil {
		e.dirs = map[string]string{}
	}
	if e.dirs[name] == "" {
		e.dirs[name] = e.t.TempDir()
	}
	return e.dirs[name]
}

// newEnv is one NATS server and a short lease: TTL 2s, renewed every 250ms.
func newEnv(t testing.TB) *env {
	ns := testenv.StartNATS(t)
	return &env{t: t, urls: ns.URL(), prefix: "mono", replicas: 1, ttl: 2 * time.Second, renew: 250 * time.Millisecond, log: true}
}

// node is one dispenser as the dispenser package builds it, minus snowflakes: a
// segment generator over the KV store, a Manager and a service, each connection
// through a proxy when asked, so that the test can freeze or kill it.
type node struct {
	name  string
	proxy *testenv.Proxy
	nc    *nats.Conn
	svcNC *nats.Conn
	gen   *segment.Generator
	mgr   *Manager
	svc   *bus.Service

	stopOnce sync.Once
	killed   bool
	cancel   context.CancelFunc
	done     sync.WaitGroup
}

// startNode starts dispenser name on e; with proxy its connections go through one.
func (e *env) startNode(name string, proxy bool, tweak func(*Config)) *node {
	t := e.t
	t.Helper()
	n := &node{name: name}
	urls := e.urls
	if proxy {
		u, err := url.Parse(e.urls)
		if err != nil {
			t.Fatal(err)
		}
		n.proxy = testenv.StartProxy(t, u.Host)
		urls = n.proxy.URL()
	}
	n.nc = e.connect(urls, name)
	js, err := jetstream.New(n.nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	store, err := e.openStore(ctx, js)
	if err != nil {
		t.Fatalf("%s: open store: %v", name, err)
	}
	segCfg := segment.DefaultConfig()
	segCfg.Store, segCfg.Logger = store, e.logger(name, "segment")
	segCfg.Marks = segment.NewInmemMarks()
	if n.gen, err = segment.New(segCfg); err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.Prefix, cfg.NodeID, cfg.Conn, cfg.JetStream, cfg.Replicas = e.prefix, name, n.nc, js, e.replicas
	cfg.Segments, cfg.LeaseTTL, cfg.RenewInterval = n.gen, e.ttl, e.renew
	cfg.CodeOf = core.CodeOf
	cfg.Logger = e.logger(name, "monotonic")
	cfg.MemoryFile = filepath.Join(e.dataDir(name), "monotonic.tags")
	cfg.ServiceID = func() string { return n.svc.Info().ID }
	cfg.SegmentMarks = segCfg.Marks
	cfg.IDKey = testFingerprint // every node holds the tests' ID key unless tweak says otherwise
	if tweak != nil {
		tweak(&cfg)
	}
	if n.mgr, err = New(ctx, cfg); err != nil {
		t.Fatalf("%s: monotonic.New: %v", name, err)
	}
	if e.wrapLeaders != nil {
		n.mgr.leaders = e.wrapLeaders(name, n.mgr.leaders)
	}
	if e.wrapOpts != nil {
		n.mgr.opts = e.wrapOpts(n.mgr.opts)
	}
	// The service before the Manager runs: its $SRV instance is the Manager's.
	cc := core.DefaultConfig()
	cc.Segments, cc.Tags, cc.Monotonic = n.gen, store, n.mgr
	c, err := core.New(cc)
	if err != nil {
		t.Fatalf("%s: core.New: %v", name, err)
	}
	svcCfg := bus.DefaultConfig()
	svcCfg.Prefix, svcCfg.Core = e.prefix, c
	svcCfg.Logger = e.logger(name, "service")
	n.svcNC = e.connect(urls, name+"-service")
	if n.svc, err = bus.New(n.svcNC, svcCfg); err != nil {
		t.Fatalf("%s: bus.New: %v", name, err)
	}
	runCtx, runCancel := context.WithCancel(context.Background())
	n.cancel = runCancel
	for _, run := range []func(context.Context) error{n.gen.Run, n.mgr.Run} {
		n.done.Add(1)
		go func() {
			defer n.done.Done()
			if err := run(runCtx); err != nil {
				t.Errorf("%s: Run: %v", name, err)
			}
		}()
	}
	t.Cleanup(n.stop)
	for _, ready := range []<-chan struct{}{n.gen.Ready(), n.mgr.Ready()} {
		select {
		case <-ready:
		case <-time.After(20 * time.Second):
			t.Fatalf("%s not ready within 20s", name)
		}
	}
	return n
}

// openStore opens the segment store of e: MySQL with mysqlDSN, else the KV store.
func (e *env) openStore(ctx context.Context, js jetstream.JetStream) (segment.Store, error) {
	if e.mysqlDSN == "" {
		return segment.OpenKVStore(ctx, js, e.prefix+"_segments", e.replicas)
	}
	store, err := segment.OpenMySQLStore(ctx, segment.MySQLConfig{DSN: e.mysqlDSN, CreateTable: true})
	if err != nil {
		return nil, err
	}
	e.t.Cleanup(func() { _ = store.Close() })
	return store, nil
}

// stop stops the dispenser as a graceful shutdown does: serving first, then the
// leases are released, then the connection closes. Safe after kill and twice; after
// kill it closes the connections first, so that nothing waits for a server it cannot
// reach.
func (n *node) stop() {
	n.stopOnce.Do(func() {
		if n.killed {
			n.svcNC.Close()
			n.nc.Close()
		}
		_ = n.svc.Stop()
		n.cancel()
		n.done.Wait()
		n.nc.Close()
	})
}

// kill cuts every connection of n at once, as kill -9 would; its goroutines stop at
// cleanup, unable to reach anyone.
func (n *node) kill() {
	n.killed = true
	n.proxy.Kill()
}

func (e *env) connect(urls, name string) *nats.Conn {
	e.t.Helper()
	nc, err := nats.Connect(urls, nats.Name(name), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond), nats.Timeout(5*time.Second))
	if err != nil {
		e.t.Fatalf("connect %s to %s: %v", name, urls, err)
	}
	e.t.Cleanup(nc.Close)
	return nc
}

func (e *env) logger(node, component string) *slog.Logger {
	if !e.log {
		return nil
	}
	return testutil.Logger(e.t).With("node", node, "component", component)
}

// admin calls a tag admin subject and returns the tag it answers.
func admin(t testing.TB, nc *nats.Conn, prefix, op string, body any) (wire.TagInfo, error) {
	t.Helper()
	b, err := json.Marshal(body)
	if err != nil {
		t.Fatal(err)
	}
	msg, err := nc.Request(wire.Subjects{Prefix: prefix}.AdminTags(op), b, 10*time.Second)
	if err != nil {
		return wire.TagInfo{}, err
	}
	if err := wire.ReplyError(msg.Header.Get(wire.ServiceErrorCodeHeader), msg.Header.Get(wire.ServiceErrorHeader)); err != nil {
		return wire.TagInfo{}, err
	}
	var info wire.TagInfo
	if err := json.Unmarshal(msg.Data, &info); err != nil {
		return info, fmt.Errorf("admin %s answer %q: %w", op, msg.Data, err)
	}
	return info, nil
}

// addMonotonic adds tag, marked monotonic, through the admin subject.
func addMonotonic(t testing.TB, nc *nats.Conn, prefix, tag string, step int64) {
	t.Helper()
	on := true
	info, err := admin(t, nc, prefix, "add", wire.AddTagRequest{Tag: tag, Step: &step, Monotonic: &on})
	if err != nil || !info.Monotonic {
		t.Fatalf("add monotonic tag %q = %+v, %v", tag, info, err)
	}
}

// leaderOf waits until exactly one of nodes serves tag as its leader and returns it.
func leaderOf(t testing.TB, tag string, within time.Duration, nodes ...*node) *node {
	t.Helper()
	var leader *node
	testutil.Eventually(t, within, "one leader of "+tag, func() bool {
		leader = nil
		count := 0
		for _, n := range nodes {
			if n.role(tag) == "leader" {
				leader = n
				count++
			}
		}
		return count == 1
	})
	return leader
}

// role is n's role for tag: leader, starting, follower or none.
func (n *node) role(tag string) string {
	for _, ts := range n.mgr.Stats().Tags {
		if ts.Tag == tag {
			return ts.Role
		}
	}
	return ""
}

// request asks for count IDs of tag once, and says what came back: the IDs, or the
// service error code (0 for a NATS error).
func request(nc *nats.Conn, subject string, count int, timeout time.Duration) ([]int64, int, error) {
	msg, err := nc.Request(subject, []byte(strconv.Itoa(count)), timeout)
	if err != nil {
		return nil, 0, err
	}
	if err := wire.ReplyError(msg.Header.Get(wire.ServiceErrorCodeHeader), msg.Header.Get(wire.ServiceErrorHeader)); err != nil {
		var we *wire.Error
		errors.As(err, &we)
		return nil, we.Code, err
	}
	ids, err := wire.DecodeIDs(nil, msg.Data, wire.Text)
	if err == nil && len(ids) != count {
		err = fmt.Errorf("%d IDs for %d asked", len(ids), count)
	}
	return ids, 0, err
}
