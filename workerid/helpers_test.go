package workerid

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leafbus/leafbus/internal/testutil"
	"github.com/leafbus/leafbus/testenv"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// jsEnv is a JetStream server with one client connection.
type jsEnv struct {
	srv *testenv.NATS
	nc  *nats.Conn
	js  jetstream.JetStream
}

func startJS(tb testing.TB) jsEnv {
	tb.Helper()
	srv := testenv.StartNATS(tb)
	nc := srv.Connect(tb)
	js, err := jetstream.New(nc)
	if err != nil {
		tb.Fatalf("jetstream.New: %v", err)
	}
	return jsEnv{srv: srv, nc: nc, js: js}
}

// kvConfig is the default KV registry configuration for node, changed by edits.
func kvConfig(node string, edits ...func(*KVRegistryConfig)) KVRegistryConfig {
	cfg := DefaultKVRegistryConfig()
	cfg.NodeID = node
	for _, edit := range edits {
		edit(&cfg)
	}
	return cfg
}

// kvMaxWorkerID limits a KV registry to worker IDs 0..n.
func kvMaxWorkerID(n int64) func(*KVRegistryConfig) {
	return func(c *KVRegistryConfig) { c.MaxWorkerID = n }
}

// kvShortTTL is the lease configuration of the expiry tests: short enough to wait out,
// with two worker IDs.
func kvShortTTL(c *KVRegistryConfig) {
	c.TTL, c.RenewInterval, c.MaxWorkerID = time.Second, 250*time.Millisecond, 1
}

func openKVRegistry(tb testing.TB, js jetstream.JetStream, cfg KVRegistryConfig) *KVRegistry {
	tb.Helper()
	if cfg.Logger == nil {
		cfg.Logger = testutil.Logger(tb)
	}
	r, err := OpenKVRegistry(testutil.Context(tb, 10*time.Second), js, cfg)
	if err != nil {
		tb.Fatalf("OpenKVRegistry(%+v): %v", cfg, err)
	}
	return r
}

func openForever(tb testing.TB, js jetstream.JetStream) *Forever {
	tb.Helper()
	f, err := OpenForever(testutil.Context(tb, 10*time.Second), js, ForeverBucket("leaf"), 1)
	if err != nil {
		tb.Fatalf("OpenForever: %v", err)
	}
	return f
}

// fakeGen records what the heartbeat does to a generator.
type fakeGen struct {
	mu        sync.Mutex
	issued    int64
	ceiling   int64
	ceilings  []int64
	suspended error
	suspends  int
	resumes   int
	history   []error // every Suspend's reason, nil for every Resume
}

func (g *fakeGen) Issued() int64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.issued
}

func (g *fakeGen) setIssued(ts int64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.issued = ts
}

func (g *fakeGen) SetCeiling(ts int64) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.ceiling = ts
	g.ceilings = append(g.ceilings, ts)
}

func (g *fakeGen) Suspend(err error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.suspended = err
	g.suspends++
	g.history = append(g.history, err)
}

func (g *fakeGen) Resume() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.suspended = nil
	g.resumes++
	g.history = append(g.history, nil)
}

// sawSuspension reports whether the generator was ever suspended for a reason wrapping
// target.
func (g *fakeGen) sawSuspension(target error) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, err := range g.history {
		if errors.Is(err, target) {
			return true
		}
	}
	return false
}

func (g *fakeGen) state() (ceiling int64, suspended error) {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.ceiling, g.suspended
}

// fakeLease is a Lease whose Renew result the test controls. It stands in for a registry
// only in heartbeat tests about timing; registries themselves are tested on real servers.
type fakeLease struct {
	id       int64
	ttl      time.Duration
	recorded int64

	mu       sync.Mutex
	renewErr error
	hang     bool // Renew blocks until its ctx ends, as a write to an unreachable server does
	renewed  []int64
	released []int64
}

func (l *fakeLease) WorkerID() int64    { return l.id }
func (l *fakeLease) Recorded() int64    { return l.recorded }
func (l *fakeLease) TTL() time.Duration { return l.ttl }

func (l *fakeLease) Renew(ctx context.Context, ts int64) error {
	l.mu.Lock()
	hang := l.hang
	l.mu.Unlock()
	if hang {
		<-ctx.Done()
		return ctx.Err()
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.renewErr != nil {
		return l.renewErr
	}
	l.renewed = append(l.renewed, ts)
	return nil
}

func (l *fakeLease) setHang(hang bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.hang = hang
}

func (l *fakeLease) Release(ctx context.Context, ts int64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.released = append(l.released, ts)
	return nil
}

func (l *fakeLease) setRenewErr(err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.renewErr = err
}

// fakeMono is a Monotonic the test moves by hand.
type fakeMono struct {
	mu sync.Mutex
	d  time.Duration
}

func (m *fakeMono) now() time.Duration {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.d
}

func (m *fakeMono) add(d time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.d += d
}

// must fails tb when err is not nil.
func must(tb testing.TB, what string, err error) {
	tb.Helper()
	if err != nil {
		tb.Fatalf("%s: %v", what, err)
	}
}

// wantErrIs fails tb unless errors.Is(err, want).
func wantErrIs(tb testing.TB, what string, err, want error) {
	tb.Helper()
	if !errors.Is(err, want) {
		tb.Fatalf("%s: error = %v, want one wrapping %v", what, err, want)
	}
}

// raceAcquire calls Acquire on every registry at the same instant and returns the IDs;
// any error fails the test.
func raceAcquire[R Registry](tb testing.TB, regs []R) []int64 {
	tb.Helper()
	ids := make([]int64, len(regs))
	errs := make([]error, len(regs))
	start := make(chan struct{})
	var wg sync.WaitGroup
	ctx := testutil.Context(tb, 20*time.Second)
	for i, r := range regs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			l, err := r.Acquire(ctx)
			if err != nil {
				errs[i] = err
				return
			}
			ids[i] = l.WorkerID()
		}()
	}
	close(start)
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			tb.Fatalf("Acquire %d: %v", i, err)
		}
	}
	return ids
}

// fakeWatchedLease is a fakeLease with a watch the test drives: what it sends on reports
// goes to the heartbeat's vouch, and an error on end ends the watch with it.
type fakeWatchedLease struct {
	*fakeLease
	reports  chan error
	end      chan error
	watching chan bool // true when Watch starts, false when it returns

	active           atomic.Bool
	releasedWatching atomic.Bool // Release ran while Watch did
}

func newFakeWatchedLease(id int64, ttl time.Duration) *fakeWatchedLease {
	return &fakeWatchedLease{
		fakeLease: &fakeLease{id: id, ttl: ttl},
		reports:   make(chan error),
		end:       make(chan error),
		watching:  make(chan bool, 2),
	}
}

func (l *fakeWatchedLease) Watch(ctx context.Context, vouch func(error)) error {
	l.active.Store(true)
	l.watching <- true
	defer func() {
		l.active.Store(false)
		l.watching <- false
	}()
	for {
		select {
		case <-ctx.Done():
			return nil
		case err := <-l.reports:
			vouch(err)
		case err := <-l.end:
			return err
		}
	}
}

func (l *fakeWatchedLease) Release(ctx context.Context, ts int64) error {
	if l.active.Load() {
		l.releasedWatching.Store(true)
	}
	return l.fakeLease.Release(ctx, ts)
}

// send hands v to the running watch, failing tb if none takes it within 5 s.
func send[T any](tb testing.TB, ch chan<- T, v T, what string) {
	tb.Helper()
	select {
	case ch <- v:
	case <-time.After(5 * time.Second):
		tb.Fatalf("%s: nothing took it within 5s", what)
	}
}

// receive takes a value from ch, failing tb if none comes within 5 s.
func receive[T any](tb testing.TB, ch <-chan T, what string) T {
	tb.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(5 * time.Second):
		tb.Fatalf("%s: nothing within 5s", what)
	}
	panic("unreachable")
}
