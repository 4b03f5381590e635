package workerid

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/leafbus/leafbus/internal/testutil"
	"github.com/leafbus/leafbus/snowflake"
)

// What must never repeat is a (worker ID, timestamp) pair, so the records a start checks
// are keyed by the worker ID too: a static worker ID started again under another node ID
// (the host was renamed, or the ID moved to another host) still starts above everything
// it may have issued, on the injected clock.
func TestGuardWorkerRecordUnderAnotherNodeID(t *testing.T) {
	env := startJS(t)
	ctx := testutil.Context(t, 20*time.Second)
	forever := openForever(t, env.js)
	static, err := NewStaticRegistry(7, 1023)
	must(t, "NewStaticRegistry", err)
	lease, err := static.Acquire(ctx)
	must(t, "Acquire", err)

	gen := &fakeGen{}
	gen.setIssued(t0ms + 800) // borrowed ahead of the clock
	h := testHeartbeat(t, heartbeatConfig(func(c *HeartbeatConfig) {
		c.NodeID = "old-host"
		c.Lease = lease
		c.Generator = gen
		c.Forever = forever
		c.Cache = &CacheFile{Path: filepath.Join(t.TempDir(), "old-host.json")}
		c.Clock = snowflake.NewFakeClock(t0)
	}))
	must(t, "Beat", h.Beat(ctx))
	rec, err := forever.GetWorker(ctx, 7)
	must(t, "GetWorker", err)
	if want := (Record{WorkerID: 7, Timestamp: t0ms + 800, Ceiling: t0ms + 800 + 4000, NodeID: "old-host"}); rec != want {
		t.Fatalf("worker record = %+v, want %+v", rec, want)
	}

	start := func(node string, id int64, clockAt time.Time) (int64, *snowflake.FakeClock, error) {
		clock := snowflake.NewFakeClock(clockAt)
		g, err := newGuard(guardConfig(func(c *GuardConfig) {
			c.NodeID = node
			c.Forever = forever
			c.Cache = &CacheFile{Path: filepath.Join(t.TempDir(), node+".json")} // a new host: no cache file
			c.Clock = clock
			c.Logger = testutil.Logger(t)
		}))
		must(t, "newGuard", err)
		floor, err := g.Start(ctx, staticLease{workerID: id})
		return floor, clock, err
	}

	floor, clock, err := start("new-host", 7, t0)
	must(t, "Start under another node ID", err)
	if want := t0ms + 800 + 4000; floor != want {
		t.Fatalf("floor = %s, want %s: the worker ID's record plus interval and borrow-max", fmtMs(floor), fmtMs(want))
	}
	if now := clock.Now().UnixMilli(); now <= floor {
		t.Fatalf("Start returned at %s, not past the floor %s", fmtMs(now), fmtMs(floor))
	}

	// Another node's clock may be up to PeerSkewMax ahead; beyond that plus borrow-max
	// the clock was set back, whatever the node ID.
	_, _, err = start("new-host", 7, t0.Add(-10*time.Second))
	wantErrIs(t, "Start under another node ID with the clock set back", err, ErrClockBehindRecord)
	if !strings.Contains(err.Error(), "worker-7") || !strings.Contains(err.Error(), "old-host") {
		t.Fatalf("error %q should name the worker ID's record and its writer", err)
	}

	floor, _, err = start("new-host", 8, t0)
	must(t, "Start with another worker ID", err)
	if floor != 0 {
		t.Fatalf("floor for worker ID 8 = %s, want none: the record is worker ID 7's", fmtMs(floor))
	}
}

// Every record carries the ceiling its run allowed, so a restart with a smaller
// --borrow-max still waits past what the previous run may have borrowed, and does not
// take that run's borrowed record for a clock set back. Checked through the forever
// bucket and, with it unreachable, through the cache file alone.
func TestGuardRecordCeilingSmallerBorrowMax(t *testing.T) {
	env := startJS(t)
	ctx := testutil.Context(t, 30*time.Second)
	forever := openForever(t, env.js)
	cache := &CacheFile{Path: filepath.Join(t.TempDir(), "n1.json")}
	gen := &fakeGen{}
	gen.setIssued(t0ms + 9000) // borrowed 9 s ahead with --borrow-max 10s
	h := testHeartbeat(t, heartbeatConfig(func(c *HeartbeatConfig) {
		c.Lease = &fakeLease{id: 3}
		c.Generator = gen
		c.Forever = forever
		c.Cache = cache
		c.Clock = snowflake.NewFakeClock(t0)
		c.BorrowMax = 10 * time.Second
	}))
	must(t, "Beat", h.Beat(ctx))
	wantFloor := t0ms + 9000 + 3000 + 10_000

	restart := func(what string) {
		t.Helper()
		clock := snowflake.NewFakeClock(t0.Add(time.Second)) // the record is 8 s ahead
		g, err := newGuard(guardConfig(func(c *GuardConfig) {
			c.NodeID = "n1"
			c.Forever = forever
			c.Cache = cache
			c.Clock = clock
			c.BorrowMax = time.Second
			c.ReadTimeout = 300 * time.Millisecond
			c.Logger = testutil.Logger(t)
		}))
		must(t, "newGuard", err)
		floor, err := g.Start(ctx, &fakeLease{id: 3})
		must(t, "Start with a smaller borrow-max "+what, err)
		if floor != wantFloor {
			t.Fatalf("floor %s = %s, want %s: the previous run's ceiling", what, fmtMs(floor), fmtMs(wantFloor))
		}
		if now := clock.Now().UnixMilli(); now <= floor {
			t.Fatalf("Start %s returned at %s, not past the floor %s", what, fmtMs(now), fmtMs(floor))
		}
	}
	restart("through the forever bucket")
	env.srv.Stop()
	restart("through the cache file")
}

// A holder that lost its worker ID and writes late cannot lower the worker ID's record.
func TestForeverRaiseWorker(t *testing.T) {
	env := startJS(t)
	ctx := testutil.Context(t, 10*time.Second)
	f := openForever(t, env.js)
	_, err := f.GetWorker(ctx, 5)
	wantErrIs(t, "GetWorker before any write", err, ErrNoRecord)
	must(t, "RaiseWorker", f.RaiseWorker(ctx, 5, Record{WorkerID: 5, Timestamp: 2000, Ceiling: 6000, NodeID: "b"}))
	must(t, "RaiseWorker lower", f.RaiseWorker(ctx, 5, Record{WorkerID: 5, Timestamp: 1000, Ceiling: 5000, NodeID: "a"}))
	must(t, "RaiseWorker higher timestamp, lower ceiling, another node", f.RaiseWorker(ctx, 5, Record{WorkerID: 5, Timestamp: 2500, Ceiling: 5500, NodeID: "c"}))
	got, err := f.GetWorker(ctx, 5)
	must(t, "GetWorker", err)
	if want := (Record{WorkerID: 5, Timestamp: 2500, Ceiling: 6000, NodeID: "c"}); got != want {
		t.Fatalf("GetWorker = %+v, want %+v", got, want)
	}
	// A clean stop of the holder: nothing issued past its timestamp.
	must(t, "RaiseWorker clean stop", f.RaiseWorker(ctx, 5, Record{WorkerID: 5, Timestamp: 2600, Ceiling: 2600, NodeID: "c"}))
	got, err = f.GetWorker(ctx, 5)
	must(t, "GetWorker", err)
	if want := (Record{WorkerID: 5, Timestamp: 2600, Ceiling: 2600, NodeID: "c"}); got != want {
		t.Fatalf("GetWorker after the holder's clean stop = %+v, want %+v", got, want)
	}
	if _, err := f.Get(context.Background(), "a"); err == nil {
		t.Fatalf("the worker ID's record must not appear as a node's")
	}
}

// A failed beat is tried again within a second, not a whole interval later: a store that
// fails over (an R3 bucket electing a new stream leader) is back before the generator
// reaches its ceiling, which leaves only BorrowMax of slack past the next beat.
func TestHeartbeatRetriesFailedBeatSoon(t *testing.T) {
	gen := &fakeGen{}
	lease := &fakeLease{id: 2}
	h := testHeartbeat(t, heartbeatConfig(func(c *HeartbeatConfig) {
		c.Lease = lease
		c.Generator = gen
	}))
	must(t, "first Beat", h.Beat(context.Background()))
	first, _ := gen.state()
	lease.setRenewErr(errors.New("nats: no response from stream"))
	runHeartbeat(t, h)
	testutil.Eventually(t, 5*time.Second, "a failed beat", func() bool { return h.Stats().ConsecutiveFailures > 0 })
	failedAt := time.Now()
	lease.setRenewErr(nil)
	testutil.Eventually(t, 2*time.Second, "the ceiling to rise again", func() bool { c, _ := gen.state(); return c > first })
	if d := time.Since(failedAt); d > 1500*time.Millisecond {
		t.Fatalf("the beat after a failure came %s later, want well within the 3s interval", d)
	}
}

// This node's own record of another worker ID (it held another before, and lost it)
// still refuses a clock set back, but sets no floor for the new worker ID: what must
// not repeat is a (worker ID, timestamp) pair.
func TestGuardOwnRecordOfAnotherWorkerID(t *testing.T) {
	env := startJS(t)
	ctx := testutil.Context(t, 10*time.Second)
	forever := openForever(t, env.js)
	must(t, "Put", forever.Put(ctx, "n1", Record{WorkerID: 3, Timestamp: t0ms - 100, Ceiling: t0ms + 3900}))
	start := func(clockAt time.Time, id int64) (int64, error) {
		g, err := newGuard(guardConfig(func(c *GuardConfig) {
			c.NodeID, c.Forever, c.Clock, c.Logger = "n1", forever, snowflake.NewFakeClock(clockAt), testutil.Logger(t)
		}))
		must(t, "newGuard", err)
		return g.Start(ctx, &fakeLease{id: id})
	}
	floor, err := start(t0, 4)
	must(t, "Start with another worker ID", err)
	if floor != 0 {
		t.Fatalf("floor = %s, want none: the record is worker ID 3's", fmtMs(floor))
	}
	if floor, err = start(t0, 3); err != nil || floor != t0ms+3900 {
		t.Fatalf("Start with the record's worker ID = %s, %v; want the floor %s", fmtMs(floor), err, fmtMs(t0ms+3900))
	}
	_, err = start(t0.Add(-10*time.Second), 4)
	wantErrIs(t, "Start with another worker ID, clock set back", err, ErrClockBehindRecord)
}

// After a clean stop the records say nothing was issued past the last timestamp, so a
// restart (or the next holder of the ID) waits only for the clock to pass it, not for
// an interval and borrow-max more; after a crash it still waits the whole margin.
func TestGuardCleanStopRecordSetsTheFloor(t *testing.T) {
	env := startJS(t)
	ctx := testutil.Context(t, 10*time.Second)
	forever := openForever(t, env.js)
	for _, tt := range []struct {
		name    string
		stop    bool
		wantGap int64 // floor minus the last record
	}{
		{"clean stop", true, 0},
		{"crash", false, 4000},
	} {
		t.Run(tt.name, func(t *testing.T) {
			lease := &fakeLease{id: 9}
			cache := &CacheFile{Path: filepath.Join(t.TempDir(), "n1.json")}
			clock := snowflake.NewFakeClock(t0)
			h := testHeartbeat(t, heartbeatConfig(func(c *HeartbeatConfig) {
				c.Lease, c.Generator, c.Forever, c.Cache, c.Clock = lease, &fakeGen{}, forever, cache, clock
			}))
			must(t, "Beat", h.Beat(ctx))
			clock.Add(time.Second)
			last := t0ms
			if tt.stop {
				stop, _ := runHeartbeat(t, h)
				must(t, "stop", stop())
				last = t0ms + 1000
			}
			g, err := newGuard(guardConfig(func(c *GuardConfig) {
				c.NodeID, c.Forever, c.Cache, c.Clock, c.Logger = "n1", forever, cache, clock, testutil.Logger(t)
			}))
			must(t, "newGuard", err)
			floor, err := g.Start(ctx, &fakeLease{id: 9, recorded: last})
			must(t, "Start", err)
			if floor != last+tt.wantGap {
				t.Fatalf("floor = %s, want %s", fmtMs(floor), fmtMs(last+tt.wantGap))
			}
		})
	}
}
