package workerid

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/leafbus/leafbus/internal/testutil"
	"github.com/leafbus/leafbus/snowflake"
)

// heartbeatConfig is the default heartbeat configuration for node "n1", changed by
// edit.
func heartbeatConfig(edit func(*HeartbeatConfig)) HeartbeatConfig {
	cfg := DefaultHeartbeatConfig()
	cfg.NodeID = "n1"
	cfg.CeilingLead = 0 // the ceilings these tests check are record + Interval + BorrowMax
	edit(&cfg)
	return cfg
}

// testHeartbeat returns a heartbeat for cfg, logging to the test.
func testHeartbeat(tb testing.TB, cfg HeartbeatConfig) *Heartbeat {
	tb.Helper()
	if cfg.Logger == nil {
		cfg.Logger = testutil.Logger(tb)
	}
	h, err := newHeartbeat(cfg)
	if err != nil {
		tb.Fatalf("newHeartbeat: %v", err)
	}
	return h
}

// runHeartbeat runs h.Run until the test ends or stop is called. stop cancels Run and
// returns its error; done is closed when Run has returned, whatever the reason.
func runHeartbeat(tb testing.TB, h *Heartbeat) (stop func() error, done <-chan struct{}) {
	tb.Helper()
	return runInBackground(tb, "Heartbeat.Run", 10*time.Second, h.Run)
}

// runInBackground runs run until the test ends or stop is called. stop cancels its
// context, fails the test unless run returns within grace, and returns its error; done
// is closed when run has returned, whatever the reason.
func runInBackground(tb testing.TB, name string, grace time.Duration, run func(context.Context) error) (stop func() error, done <-chan struct{}) {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ch := make(chan struct{})
	var result error
	go func() {
		defer close(ch)
		result = run(ctx)
	}()
	stop = func() error {
		cancel()
		select {
		case <-ch:
		case <-time.After(grace):
			tb.Fatalf("%s did not return within %s of its context ending", name, grace)
		}
		return result
	}
	tb.Cleanup(func() { stop() })
	return stop, ch
}

func TestHeartbeatRecordIsMaxOfIssuedAndClock(t *testing.T) {
	tests := []struct {
		name   string
		issued int64
		want   int64
	}{
		{"clock ahead of issued", t0ms - 100, t0ms},
		{"nothing issued", 0, t0ms},
		{"borrowed ahead of clock", t0ms + 700, t0ms + 700},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			gen := &fakeGen{issued: tt.issued}
			lease := &fakeLease{id: 2}
			h := testHeartbeat(t, heartbeatConfig(func(c *HeartbeatConfig) {
				c.Lease = lease
				c.Generator = gen
				c.Clock = snowflake.NewFakeClock(t0)
			}))
			must(t, "Beat", h.Beat(context.Background()))
			if got := lease.renewed; len(got) != 1 || got[0] != tt.want {
				t.Fatalf("Renew got %v, want [%d]", got, tt.want)
			}
			if ceiling, _ := gen.state(); ceiling != tt.want+4000 {
				t.Fatalf("ceiling = %d, want record + 4s = %d", ceiling, tt.want+4000)
			}
		})
	}
}

func TestHeartbeatCeilingAfterEachBeat(t *testing.T) {
	clock := snowflake.NewFakeClock(t0)
	gen := &fakeGen{}
	cache := &CacheFile{Path: filepath.Join(t.TempDir(), "workerid.json")}
	h := testHeartbeat(t, heartbeatConfig(func(c *HeartbeatConfig) {
		c.Lease = &fakeLease{id: 2}
		c.Generator = gen
		c.Cache = cache
		c.Clock = clock
	}))
	if _, susp := gen.state(); !errors.Is(susp, ErrNotRecorded) {
		t.Fatalf("after newHeartbeat the generator is suspended with %v, want ErrNotRecorded", susp)
	}
	var want []int64
	for i := range 3 {
		must(t, "Beat", h.Beat(context.Background()))
		want = append(want, t0ms+int64(i)*3000+4000)
		clock.Add(3 * time.Second)
	}
	// The clock steps back: the record, and so the ceiling, stays put.
	clock.Add(-20 * time.Second)
	must(t, "Beat after a step back", h.Beat(context.Background()))
	if fmt.Sprint(gen.ceilings) != fmt.Sprint(want) {
		t.Fatalf("ceilings = %v, want %v", gen.ceilings, want)
	}
	if _, susp := gen.state(); susp != nil {
		t.Fatalf("generator still suspended after a successful beat: %v", susp)
	}
	e, err := cache.Load()
	must(t, "cache Load", err)
	if e.Timestamp != t0ms+6000 || e.WorkerID != 2 || e.NodeID != "n1" {
		t.Fatalf("cache file = %+v, want the last record %d", e, t0ms+6000)
	}
	st := h.Stats()
	if st.Record != t0ms+6000 || st.Ceiling != t0ms+10000 || st.ClockMinusRecordMs != -17000 || st.Suspended {
		t.Fatalf("Stats() = %+v", st)
	}
	b, err := json.Marshal(st)
	must(t, "marshal Stats", err)
	if !strings.Contains(string(b), `"ceiling":1772600777000`) {
		t.Fatalf("Stats JSON = %s", b)
	}
}

// With a permanent ID a record counts where every start with the worker ID reads it: the
// worker ID's record in the forever bucket, or a registry that records. The cache file
// is still written while the forever bucket is down, but alone it does not move the
// ceiling: the same static worker ID started under another node ID (or on another host)
// would not read it. The static registry's Renew stores nothing, so it does not count.
func TestHeartbeatPermanentLeaseKVDown(t *testing.T) {
	env := startJS(t)
	forever := openForever(t, env.js)
	static, err := NewStaticRegistry(4, 1023)
	must(t, "NewStaticRegistry", err)
	staticLease, err := static.Acquire(context.Background())
	must(t, "Acquire", err)
	cache := &CacheFile{Path: filepath.Join(t.TempDir(), "workerid.json")}

	clock := snowflake.NewFakeClock(t0)
	withCache := &fakeGen{}
	h1 := testHeartbeat(t, heartbeatConfig(func(c *HeartbeatConfig) {
		c.NodeID = "n1"
		c.Lease = staticLease
		c.Generator = withCache
		c.Forever = forever
		c.Cache = cache
		c.Clock = clock
		c.WriteTimeout = 300 * time.Millisecond
	}))
	without := &fakeGen{}
	h2 := testHeartbeat(t, heartbeatConfig(func(c *HeartbeatConfig) {
		c.NodeID = "n2"
		c.Lease = staticLease
		c.Generator = without
		c.Forever = forever
		c.Clock = clock
		c.WriteTimeout = 300 * time.Millisecond
	}))
	recording := &fakeGen{}
	h3 := testHeartbeat(t, heartbeatConfig(func(c *HeartbeatConfig) {
		c.NodeID = "n3"
		c.Lease = &fakeLease{id: 5}
		c.Generator = recording
		c.Forever = forever
		c.Clock = clock
		c.WriteTimeout = 300 * time.Millisecond
	}))
	for _, h := range []*Heartbeat{h1, h2, h3} {
		must(t, "Beat with KV up", h.Beat(context.Background()))
	}

	env.srv.Stop()
	clock.Add(3 * time.Second)
	err = h1.Beat(context.Background())
	wantErrIs(t, "Beat with KV down and a cache file, static ID", err, ErrNotRecorded)
	if c, _ := withCache.state(); c != t0ms+4000 {
		t.Fatalf("ceiling with the cache file alone = %s, want it unchanged at %s", fmtMs(c), fmtMs(t0ms+4000))
	}
	e, err := cache.Load()
	must(t, "cache Load", err)
	if e.Timestamp != t0ms+3000 {
		t.Fatalf("cache record = %s, want %s", fmtMs(e.Timestamp), fmtMs(t0ms+3000))
	}

	err = h2.Beat(context.Background())
	wantErrIs(t, "Beat with KV down, no cache file, static ID", err, ErrNotRecorded)
	if c, _ := without.state(); c != t0ms+4000 {
		t.Fatalf("ceiling without a durable record = %s, want it unchanged at %s", fmtMs(c), fmtMs(t0ms+4000))
	}
	if st := h2.Stats(); st.ConsecutiveFailures != 1 {
		t.Fatalf("ConsecutiveFailures = %d, want 1", st.ConsecutiveFailures)
	}

	must(t, "Beat with KV down, permanent ID whose registry records", h3.Beat(context.Background()))
	if c, _ := recording.state(); c != t0ms+7000 {
		t.Fatalf("ceiling through the registry = %s, want %s", fmtMs(c), fmtMs(t0ms+7000))
	}
}

// An expiring lease not renewed for TTL/2 suspends the generator at once, even while a
// renewal hangs, and a later renewal resumes it.
func TestHeartbeatExpiringLeaseSuspendsAndResumes(t *testing.T) {
	gen := &fakeGen{}
	lease := &fakeLease{id: 3, ttl: time.Second}
	h := testHeartbeat(t, heartbeatConfig(func(c *HeartbeatConfig) {
		c.Lease = lease
		c.Generator = gen
		c.Interval = 250 * time.Millisecond
		c.WriteTimeout = 3 * time.Second
	}))
	must(t, "first Beat", h.Beat(context.Background()))
	stop, _ := runHeartbeat(t, h)

	// Every renewal now hangs for 3 s (the write timeout), well past TTL/2 = 500ms, so
	// only a timer independent of the beats can suspend in time.
	lease.setHang(true)
	testutil.Eventually(t, 2500*time.Millisecond, "the generator to be suspended while a renewal hangs", func() bool {
		_, susp := gen.state()
		return susp != nil
	})
	_, susp := gen.state()
	wantErrIs(t, "suspension reason", susp, ErrLeaseLost)
	if !strings.Contains(susp.Error(), "TTL 1s") {
		t.Fatalf("suspension reason %q should name the TTL", susp)
	}

	lease.setHang(false)
	testutil.Eventually(t, 10*time.Second, "the generator to resume", func() bool {
		_, susp := gen.state()
		return susp == nil
	})
	if err := stop(); err != nil {
		t.Fatalf("Run = %v, want nil at a clean stop", err)
	}
}

func TestHeartbeatLostLeaseEndsRun(t *testing.T) {
	gen := &fakeGen{}
	lease := &fakeLease{id: 3, ttl: time.Second}
	h := testHeartbeat(t, heartbeatConfig(func(c *HeartbeatConfig) {
		c.Lease = lease
		c.Generator = gen
		c.Interval = 100 * time.Millisecond
	}))
	stop, done := runHeartbeat(t, h)
	testutil.Eventually(t, 5*time.Second, "a first ceiling", func() bool { c, _ := gen.state(); return c > 0 })
	lease.setRenewErr(fmt.Errorf("%w: worker ID 3 is now held by node x", ErrLeaseLost))
	select {
	case <-done:
		wantErrIs(t, "Run", stop(), ErrLeaseLost)
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after the lease was lost")
	}
	_, susp := gen.state()
	wantErrIs(t, "suspension reason", susp, ErrLeaseLost)
	if !h.Stats().LeaseLost {
		t.Fatal("Stats().LeaseLost = false")
	}
	wantErrIs(t, "Beat after the loss", h.Beat(context.Background()), ErrLeaseLost)
	if len(lease.released) != 0 {
		t.Fatal("a lost lease was released")
	}
}

// The same through a real KV registry: an operator deletes the lease key, another node
// takes the ID, and the old holder's heartbeat stops for good.
func TestHeartbeatKVTakeoverEndsRun(t *testing.T) {
	env := startJS(t)
	lease := acquire(t, openKVRegistry(t, env.js, kvConfig("a", kvMaxWorkerID(0))))
	gen := &fakeGen{}
	h := testHeartbeat(t, heartbeatConfig(func(c *HeartbeatConfig) {
		c.NodeID = "a"
		c.Lease = lease
		c.Generator = gen
		c.Interval = 100 * time.Millisecond
	}))
	must(t, "Beat", h.Beat(context.Background()))
	stop, done := runHeartbeat(t, h)

	ctx := testutil.Context(t, 10*time.Second)
	kv, err := env.js.KeyValue(ctx, "leaf_leases")
	must(t, "bind leases", err)
	must(t, "delete lease key", kv.Delete(ctx, "0"))
	var other Lease
	testutil.Eventually(t, 5*time.Second, "another node to take worker ID 0", func() bool {
		l, err := openKVRegistry(t, env.js, kvConfig("b", kvMaxWorkerID(0))).Acquire(ctx)
		other = l
		return err == nil
	})
	select {
	case <-done:
		wantErrIs(t, "Run", stop(), ErrLeaseLost)
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after the ID was taken over")
	}
	if other.Recorded() < h.Stats().Ceiling-4000 {
		t.Fatalf("new holder's Recorded %s is below the old holder's ceiling base %s", fmtMs(other.Recorded()), fmtMs(h.Stats().Ceiling-4000))
	}
}

func TestHeartbeatForwardJumpCapsRecord(t *testing.T) {
	clock := snowflake.NewFakeClock(t0)
	mono := &fakeMono{}
	gen := &fakeGen{}
	lease := &fakeLease{id: 1}
	h := testHeartbeat(t, heartbeatConfig(func(c *HeartbeatConfig) {
		c.Lease = lease
		c.Generator = gen
		c.Clock = clock
		c.Monotonic = mono.now
	}))
	beat := func(clockStep, monoStep time.Duration) HeartbeatStats {
		t.Helper()
		clock.Add(clockStep)
		mono.add(monoStep)
		must(t, "Beat", h.Beat(context.Background()))
		return h.Stats()
	}
	const hour = int64(time.Hour / time.Millisecond)
	steps := []struct {
		name        string
		clock, mono time.Duration
		wantRecord  int64
		wantJumps   int
		wantActive  bool
	}{
		{"start", 0, 0, t0ms, 0, false},
		{"normal", 3 * time.Second, 3 * time.Second, t0ms + 3000, 0, false},
		{"jump of 2h", 2*time.Hour + 3*time.Second, 3 * time.Second, t0ms + 6000 + hour, 1, true},
		{"still jumped", 3 * time.Second, 3 * time.Second, t0ms + 9000 + hour, 1, true},
		{"clock fixed", -2*time.Hour + 3*time.Second, 3 * time.Second, t0ms + 9000 + hour, 1, false},
		{"second jump", 3 * time.Hour, 0, t0ms + 12000 + hour, 2, true},
	}
	for _, s := range steps {
		st := beat(s.clock, s.mono)
		if st.Record != s.wantRecord || st.ForwardJumps != s.wantJumps || st.ForwardJumpActive != s.wantActive {
			t.Fatalf("%s: Stats() = record %s, jumps %d, active %v; want %s, %d, %v",
				s.name, fmtMs(st.Record), st.ForwardJumps, st.ForwardJumpActive, fmtMs(s.wantRecord), s.wantJumps, s.wantActive)
		}
		if c, _ := gen.state(); c != s.wantRecord+4000 {
			t.Fatalf("%s: ceiling = %s, want record + 4s", s.name, fmtMs(c))
		}
	}
}

// A clean stop suspends the generator, writes the final record everywhere and releases
// the lease, so the next node takes the ID at once and starts past that record.
func TestHeartbeatCleanStop(t *testing.T) {
	env := startJS(t)
	forever := openForever(t, env.js)
	cache := &CacheFile{Path: filepath.Join(t.TempDir(), "workerid.json")}
	lease := acquire(t, openKVRegistry(t, env.js, kvConfig("a", kvMaxWorkerID(0))))
	gen := &fakeGen{}
	h := testHeartbeat(t, heartbeatConfig(func(c *HeartbeatConfig) {
		c.NodeID = "a"
		c.Lease = lease
		c.Generator = gen
		c.Forever = forever
		c.Cache = cache
		c.Interval = 100 * time.Millisecond
	}))
	stop, _ := runHeartbeat(t, h)
	testutil.Eventually(t, 5*time.Second, "a first ceiling", func() bool { c, _ := gen.state(); return c > 0 })
	borrowed := time.Now().UnixMilli() + 800
	gen.setIssued(borrowed)
	if err := stop(); err != nil {
		t.Fatalf("Run = %v, want nil", err)
	}
	_, susp := gen.state()
	wantErrIs(t, "suspension after stop", susp, ErrStopped)
	final := h.Stats().Record
	if final < borrowed {
		t.Fatalf("final record %s is below the borrowed timestamp %s", fmtMs(final), fmtMs(borrowed))
	}
	ctx := testutil.Context(t, 10*time.Second)
	rec, err := forever.Get(ctx, "a")
	must(t, "forever Get", err)
	if rec.Timestamp != final {
		t.Fatalf("forever record = %s, want the final %s", fmtMs(rec.Timestamp), fmtMs(final))
	}
	e, err := cache.Load()
	must(t, "cache Load", err)
	if e.Timestamp != final {
		t.Fatalf("cache record = %s, want the final %s", fmtMs(e.Timestamp), fmtMs(final))
	}
	next := acquire(t, openKVRegistry(t, env.js, kvConfig("b", kvMaxWorkerID(0))))
	if next.WorkerID() != 0 || next.Recorded() != final {
		t.Fatalf("next holder = (ID %d, Recorded %s), want (0, %s)", next.WorkerID(), fmtMs(next.Recorded()), fmtMs(final))
	}
	wantErrIs(t, "Beat after Run returned", h.Beat(ctx), ErrStopped)
}

func TestHeartbeatConfigValidate(t *testing.T) {
	tests := []struct {
		name    string
		edit    func(*HeartbeatConfig)
		wantErr error
		wantMsg string
	}{
		{"OK", func(*HeartbeatConfig) {}, nil, ""},
		{"OK/permanent ID", func(c *HeartbeatConfig) { c.Lease = &fakeLease{} }, nil, ""},
		{"ErrInvalidConfig/TTL", func(c *HeartbeatConfig) { c.Lease = &fakeLease{ttl: 10 * time.Second} }, ErrInvalidConfig, "lease TTL 10s is shorter than 4 x the renew interval 3s (12s)"},
		{"ErrInvalidConfig/no lease", func(c *HeartbeatConfig) { c.Lease = nil }, ErrInvalidConfig, "Lease is nil"},
		{"ErrInvalidConfig/no generator", func(c *HeartbeatConfig) { c.Generator = nil }, ErrInvalidConfig, "Generator is nil"},
		{"ErrInvalidConfig/no monotonic clock", func(c *HeartbeatConfig) { c.Monotonic = nil }, ErrInvalidConfig, "Monotonic is nil"},
		{"ErrInvalidConfig/interval", func(c *HeartbeatConfig) { c.Interval = -time.Second }, ErrInvalidConfig, "Interval is -1s, want > 0"},
		{"ErrInvalidConfig/zero WriteTimeout", func(c *HeartbeatConfig) { c.WriteTimeout = 0 }, ErrInvalidConfig, "WriteTimeout is 0s, want > 0"},
		{"ErrInvalidNodeID", func(c *HeartbeatConfig) { c.NodeID = "a b" }, ErrInvalidNodeID, "a b"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := heartbeatConfig(func(c *HeartbeatConfig) {
				c.Lease = &fakeLease{ttl: 30 * time.Second}
				c.Generator = &fakeGen{}
				tt.edit(c)
			}).Validate()
			if tt.wantErr == nil {
				must(t, "Validate", err)
				return
			}
			wantErrIs(t, "Validate", err, tt.wantErr)
			if !strings.Contains(err.Error(), tt.wantMsg) {
				t.Errorf("Validate() = %q, want it to name %q", err, tt.wantMsg)
			}
		})
	}
}

// A lease watch that cannot see the lease suspends the generator until it can again; a
// renewal meanwhile does not resume it.
func TestHeartbeatWatchSuspendsWhileUnverified(t *testing.T) {
	gen := &fakeGen{}
	lease := newFakeWatchedLease(3, 30*time.Second)
	h := testHeartbeat(t, heartbeatConfig(func(c *HeartbeatConfig) {
		c.Lease, c.Generator = lease, gen
	}))
	must(t, "Beat", h.Beat(context.Background()))
	runHeartbeat(t, h)
	if !receive(t, lease.watching, "the watch to start") {
		t.Fatal("watch reported stopping before it started")
	}

	send(t, lease.reports, error(errors.New("connection closed")), "a report that the watch cannot see the lease")
	testutil.Eventually(t, 5*time.Second, "the generator to be suspended", func() bool {
		_, susp := gen.state()
		return errors.Is(susp, ErrLeaseUnverified)
	})
	if st := h.Stats(); !st.Suspended || !strings.Contains(st.SuspendReason, "connection closed") {
		t.Fatalf("Stats() = %+v, want suspended naming the watch's reason", st)
	}
	must(t, "Beat while unverified", h.Beat(context.Background()))
	if _, susp := gen.state(); !errors.Is(susp, ErrLeaseUnverified) {
		t.Fatalf("after a renewal the generator is suspended with %v, want still ErrLeaseUnverified", susp)
	}

	send(t, lease.reports, nil, "a report that the watch sees the lease")
	testutil.Eventually(t, 5*time.Second, "the generator to resume", func() bool {
		_, susp := gen.state()
		return susp == nil
	})
	if st := h.Stats(); st.Suspended || st.LeaseLost {
		t.Fatalf("Stats() = %+v, want issuing", st)
	}
}

// A watch that reports the lease lost stops the generator for good and ends Run with
// ErrLeaseLost, before any renewal; the lost lease is not released.
func TestHeartbeatWatchLossEndsRun(t *testing.T) {
	for _, tt := range []struct {
		name string
		end  error
	}{
		{"lost", fmt.Errorf("%w: lease key deleted", ErrLeaseLost)},
		{"watch ended by itself", nil},
		{"watch failed", errors.New("boom")},
	} {
		t.Run(tt.name, func(t *testing.T) {
			gen := &fakeGen{}
			lease := newFakeWatchedLease(3, 30*time.Second)
			h := testHeartbeat(t, heartbeatConfig(func(c *HeartbeatConfig) {
				c.Lease, c.Generator = lease, gen
			}))
			must(t, "Beat", h.Beat(context.Background()))
			stop, done := runHeartbeat(t, h)
			receive(t, lease.watching, "the watch to start")
			send(t, lease.end, tt.end, "the end of the watch")
			receive(t, done, "Run to return")
			wantErrIs(t, "Run", stop(), ErrLeaseLost)
			_, susp := gen.state()
			wantErrIs(t, "suspension reason", susp, ErrLeaseLost)
			if !h.Stats().LeaseLost {
				t.Fatal("Stats().LeaseLost = false")
			}
			if len(lease.renewed) != 1 || len(lease.released) != 0 {
				t.Fatalf("renewed %v, released %v: want only the first beat's renewal and no release", lease.renewed, lease.released)
			}
		})
	}
}

// At a clean stop the watch ends before the release, which deletes what it watches.
func TestHeartbeatWatchStopsBeforeRelease(t *testing.T) {
	lease := newFakeWatchedLease(3, 30*time.Second)
	h := testHeartbeat(t, heartbeatConfig(func(c *HeartbeatConfig) {
		c.Lease, c.Generator = lease, &fakeGen{}
	}))
	stop, _ := runHeartbeat(t, h)
	receive(t, lease.watching, "the watch to start")
	must(t, "Run", stop())
	if lease.releasedWatching.Load() {
		t.Fatal("the lease was released while its watch still ran")
	}
	if len(lease.released) != 1 {
		t.Fatalf("released %v, want one release", lease.released)
	}
}

// The generator issues only when no reason to suspend holds: the watch seeing the lease
// does not lift the beats' suspension, nor a beat the watch's.
func TestHeartbeatSuspensionReasonsCombine(t *testing.T) {
	gen := &fakeGen{}
	h := testHeartbeat(t, heartbeatConfig(func(c *HeartbeatConfig) {
		c.Lease, c.Generator = &fakeLease{id: 3, ttl: 30 * time.Second}, gen
	}))
	steps := []struct {
		name string
		do   func()
		want error // nil: issuing
	}{
		{"new", func() {}, ErrNotRecorded},
		{"watch cannot see the lease", func() { h.vouch(errors.New("disconnected")) }, ErrNotRecorded},
		{"watch sees it", func() { h.vouch(nil) }, ErrNotRecorded},
		{"first beat", func() { must(t, "Beat", h.Beat(context.Background())) }, nil},
		{"watch cannot see the lease again", func() { h.vouch(errors.New("disconnected")) }, ErrLeaseUnverified},
		{"beat", func() { must(t, "Beat", h.Beat(context.Background())) }, ErrLeaseUnverified},
		{"watch sees it again", func() { h.vouch(nil) }, nil},
		{"lost", func() { h.loseLease(fmt.Errorf("%w: test", ErrLeaseLost)) }, ErrLeaseLost},
		{"watch sees it after the loss", func() { h.vouch(nil) }, ErrLeaseLost},
	}
	for _, s := range steps {
		s.do()
		_, susp := gen.state()
		if s.want == nil && susp != nil || s.want != nil && !errors.Is(susp, s.want) {
			t.Fatalf("after %s: generator suspended with %v, want %v", s.name, susp, s.want)
		}
	}
}
