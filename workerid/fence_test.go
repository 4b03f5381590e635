package workerid

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/leafbus/leafbus/internal/testutil"
)

// testClaimer is a claimer on f for node n1, run instance "run-1", with records stale
// after stale, its logs in logs.
func testClaimer(t *testing.T, f *Forever, stale time.Duration, logs *testutil.SyncBuffer) claimer {
	return claimer{
		forever: f, nodeID: "n1", instance: "run-1", staleAfter: stale, poll: 20 * time.Millisecond,
		log: slog.New(slog.NewTextHandler(io.MultiWriter(logs, testutil.LogWriter(t)), nil)),
	}
}

// putWorker writes worker ID id's record as another writer would, returning its revision.
func putWorker(t *testing.T, f *Forever, id int64, r Record) uint64 {
	t.Helper()
	e, err := f.getWorkerEntry(testutil.Context(t, 5*time.Second), id)
	must(t, "read the record", err)
	rev, err := f.casWorker(testutil.Context(t, 5*time.Second), id, r, e.rev)
	must(t, "write the record", err)
	return rev
}

// keepWriting rewrites worker ID id's record as a live holder does, every every, until
// the test ends or the returned stop is called.
func keepWriting(t *testing.T, f *Forever, id int64, r Record, every time.Duration) (stop func()) {
	t.Helper()
	r.Timestamp = time.Now().UnixMilli()
	putWorker(t, f, id, r) // the first write before the holder counts as running
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			e, err := f.getWorkerEntry(ctx, id)
			if err == nil {
				r.Timestamp = time.Now().UnixMilli()
				_, _ = f.casWorker(ctx, id, r, e.rev)
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	})
	stop = func() {
		cancel()
		wg.Wait()
	}
	t.Cleanup(stop)
	return stop
}

// TestClaim: which worker records a node may take over at once, which only once their
// writer has been silent for StaleAfter (by the server's clock, or while watched), and
// which never (a live holder's).
func TestClaim(t *testing.T) {
	env := startJS(t)
	f := openForever(t, env.js)
	ctx := testutil.Context(t, 30*time.Second)
	id := int64(0)
	next := func() int64 { id++; return id }

	t.Run("OK/no record", func(t *testing.T) {
		var logs testutil.SyncBuffer
		w, err := testClaimer(t, f, time.Minute, &logs).claim(ctx, next())
		must(t, "claim", err)
		if w.rev != 0 || !strings.Contains(logs.String(), "it has no record") {
			t.Fatalf("fence at revision %d, logs %s; want revision 0 (create)", w.rev, logs.String())
		}
	})
	t.Run("OK/released", func(t *testing.T) {
		var logs testutil.SyncBuffer
		n := next()
		rev := putWorker(t, f, n, Record{WorkerID: n, Timestamp: 1000, Ceiling: 3000, NodeID: "other", Instance: "run-9", Released: true})
		w, err := testClaimer(t, f, time.Minute, &logs).claim(ctx, n)
		must(t, "claim", err)
		if w.rev != rev || w.prior.Ceiling != 3000 || !strings.Contains(logs.String(), "node other released it") {
			t.Fatalf("fence %+v, logs %s; want revision %d and the released record as prior", w, logs.String(), rev)
		}
	})
	t.Run("OK/this run's own", func(t *testing.T) {
		var logs testutil.SyncBuffer
		n := next()
		putWorker(t, f, n, Record{WorkerID: n, Timestamp: 1000, NodeID: "n1", Instance: "run-1"})
		_, err := testClaimer(t, f, time.Minute, &logs).claim(ctx, n)
		must(t, "claim", err)
		if !strings.Contains(logs.String(), "this run's own") {
			t.Fatalf("logs %s; want the record taken as this run's", logs.String())
		}
	})
	t.Run("OK/this data dir's previous run", func(t *testing.T) {
		var logs testutil.SyncBuffer
		n := next()
		putWorker(t, f, n, Record{WorkerID: n, Timestamp: 1000, NodeID: "n1", Instance: "run-0"})
		c := testClaimer(t, f, time.Minute, &logs)
		c.cache = &CacheFile{Path: filepath.Join(t.TempDir(), "cache.json")}
		must(t, "Save", c.cache.Save(cacheEntry{NodeID: "n1", WorkerID: n, Timestamp: 1000, Instance: "run-0"}))
		_, err := c.claim(ctx, n)
		must(t, "claim", err)
		if !strings.Contains(logs.String(), "previous run's, which has ended") {
			t.Fatalf("logs %s; want the record taken as this data dir's previous run's", logs.String())
		}
	})
	t.Run("OK/silent by the server's clock", func(t *testing.T) {
		var logs testutil.SyncBuffer
		n := next()
		putWorker(t, f, n, Record{WorkerID: n, Timestamp: 1000, NodeID: "gone", Instance: "run-7"})
		time.Sleep(300 * time.Millisecond)
		_, err := testClaimer(t, f, 200*time.Millisecond, &logs).claim(ctx, n)
		must(t, "claim", err)
		if !strings.Contains(logs.String(), "has not rewritten it for") || strings.Contains(logs.String(), "watching it") {
			t.Fatalf("logs %s; want the record taken as stale by its age, without watching", logs.String())
		}
	})
	t.Run("OK/silent while watched", func(t *testing.T) {
		var logs testutil.SyncBuffer
		n := next()
		putWorker(t, f, n, Record{WorkerID: n, Timestamp: 1000, NodeID: "crashed", Instance: "run-7"})
		_, err := testClaimer(t, f, 500*time.Millisecond, &logs).claim(ctx, n)
		must(t, "claim", err)
		if !strings.Contains(logs.String(), "watching it") || !strings.Contains(logs.String(), "did not rewrite it for") {
			t.Fatalf("logs %s; want the record watched, then taken", logs.String())
		}
	})
	t.Run("OK/released while watched", func(t *testing.T) {
		var logs testutil.SyncBuffer
		n := next()
		putWorker(t, f, n, Record{WorkerID: n, Timestamp: 1000, NodeID: "stopping", Instance: "run-7"})
		go func() {
			time.Sleep(100 * time.Millisecond)
			putWorker(t, f, n, Record{WorkerID: n, Timestamp: 2000, NodeID: "stopping", Instance: "run-7", Released: true})
		}()
		w, err := testClaimer(t, f, time.Minute, &logs).claim(ctx, n)
		must(t, "claim", err)
		if w.prior.Timestamp != 2000 || !strings.Contains(logs.String(), "node stopping released it") {
			t.Fatalf("fence %+v, logs %s; want the released record", w, logs.String())
		}
	})
	t.Run("ErrWorkerIDInUse/live holder", func(t *testing.T) {
		var logs testutil.SyncBuffer
		n := next()
		keepWriting(t, f, n, Record{WorkerID: n, NodeID: "disp-1", Instance: "run-live"}, 50*time.Millisecond)
		_, err := testClaimer(t, f, 2*time.Second, &logs).claim(ctx, n)
		testutil.CheckErr(t, "claim", err, ErrWorkerIDInUse, "is held by node disp-1 (run run-live), which is alive")
		if !strings.Contains(err.Error(), "never the same --worker-id twice") {
			t.Errorf("the refusal does not say what to do: %v", err)
		}
	})
	t.Run("ErrWorkerIDInUse/live holder of a version without the fence", func(t *testing.T) {
		var logs testutil.SyncBuffer
		n := next()
		keepWriting(t, f, n, Record{WorkerID: n, NodeID: "old-1"}, 50*time.Millisecond)
		_, err := testClaimer(t, f, 2*time.Second, &logs).claim(ctx, n)
		testutil.CheckErr(t, "claim", err, ErrWorkerIDInUse, "node old-1 (a version without the worker-ID fence)")
	})
	t.Run("Canceled while watching", func(t *testing.T) {
		var logs testutil.SyncBuffer
		n := next()
		putWorker(t, f, n, Record{WorkerID: n, NodeID: "quiet", Instance: "run-7"})
		cctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		defer cancel()
		_, err := testClaimer(t, f, time.Minute, &logs).claim(cctx, n)
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("claim = %v, want the context's error", err)
		}
	})
}

// TestFenceWrite: the fence writes only on the revision it holds, never below the
// claimed record, and tells its own earlier write from another holder's.
func TestFenceWrite(t *testing.T) {
	env := startJS(t)
	f := openForever(t, env.js)
	ctx := testutil.Context(t, 30*time.Second)
	var logs testutil.SyncBuffer
	putWorker(t, f, 3, Record{WorkerID: 3, Timestamp: 5000, Ceiling: 9000, NodeID: "before", Instance: "run-0", Released: true})
	w, err := testClaimer(t, f, time.Minute, &logs).claim(ctx, 3)
	must(t, "claim", err)

	must(t, "write", w.write(ctx, 4000, 6000, false))
	got, err := f.GetWorker(ctx, 3)
	must(t, "GetWorker", err)
	if want := (Record{WorkerID: 3, Timestamp: 5000, Ceiling: 9000, NodeID: "n1", Instance: "run-1"}); got != want {
		t.Fatalf("record after a write below the claimed one = %+v, want %+v", got, want)
	}
	// The record's bytes, as PROTOCOL.md gives them: the node record's two fields first.
	raw, err := f.kv.Get(ctx, WorkerKey(3))
	must(t, "Get", err)
	if want := `{"worker_id":3,"timestamp":5000,"ceiling":9000,"node_id":"n1","instance":"run-1"}`; string(raw.Value()) != want {
		t.Fatalf("record bytes %s, want %s", raw.Value(), want)
	}

	// Its own write that went through although it seemed to fail: adopted.
	own := putWorker(t, f, 3, Record{WorkerID: 3, Timestamp: 7000, Ceiling: 9000, NodeID: "n1", Instance: "run-1"})
	err = w.write(ctx, 8000, 10000, false)
	wantErrIs(t, "write after the record moved", err, errRecordMoved)
	reclaim, err := w.resolve(ctx)
	must(t, "resolve of its own write", err)
	if reclaim != "" {
		t.Fatalf("resolve of its own write: reclaim %q, want none", reclaim)
	}
	if w.rev != own {
		t.Fatalf("revision after resolve = %d, want the own write's %d", w.rev, own)
	}
	must(t, "write after resolve", w.write(ctx, 8000, 10000, false))
	must(t, "release", w.release(ctx))
	raw, err = f.kv.Get(ctx, WorkerKey(3))
	must(t, "Get", err)
	if want := `{"worker_id":3,"timestamp":8000,"ceiling":10000,"node_id":"n1","instance":"run-1","released":true}`; string(raw.Value()) != want {
		t.Fatalf("released record bytes %s, want %s", raw.Value(), want)
	}

	// A write naming another run with a ceiling below this holder's, as no claimer
	// writes (a claimer starts above the ceilings it read): taken back.
	putWorker(t, f, 3, Record{WorkerID: 3, Timestamp: 8000, NodeID: "forger", Instance: "run-f"})
	wantErrIs(t, "write after a forged one", w.write(ctx, 8500, 10500, false), errRecordMoved)
	reclaim, err = w.resolve(ctx)
	must(t, "resolve of a forged write", err)
	if !strings.Contains(reclaim, "ceiling below this holder's") {
		t.Fatalf("resolve of a forged write: reclaim %q, want it taken back", reclaim)
	}
	must(t, "write after taking it back", w.write(ctx, 8500, 10500, false))

	// Another holder's write, with a ceiling above this holder's as a claimer's is: lost,
	// naming it.
	putWorker(t, f, 3, Record{WorkerID: 3, Timestamp: 11000, Ceiling: 15000, NodeID: "thief", Instance: "run-x"})
	wantErrIs(t, "write after another's", w.write(ctx, 9000, 11000, false), errRecordMoved)
	_, err = w.resolve(ctx)
	testutil.CheckErr(t, "resolve", err, ErrWorkerIDInUse, "worker ID 3 is held by node thief (run run-x)")
	wantErrIs(t, "resolve", err, ErrLeaseLost)
	// release leaves a record that is not its own any more alone.
	must(t, "release of a lost record", w.release(ctx))
	if got, _ := f.GetWorker(ctx, 3); got.NodeID != "thief" {
		t.Fatalf("record after release = %+v, want the thief's untouched", got)
	}
}

// TestHeartbeatFencedCeiling: with a fence, only a fenced write raises the ceiling: a
// permanent lease whose registry records the beat does not, while the forever bucket
// cannot be written (issue 21: another holder could take the record meanwhile, and
// would start above the last ceiling it shows, not above this one's).
func TestHeartbeatFencedCeiling(t *testing.T) {
	env := startJS(t)
	f := openForever(t, env.js)
	ctx := testutil.Context(t, 30*time.Second)
	var logs testutil.SyncBuffer
	w, err := testClaimer(t, f, time.Minute, &logs).claim(ctx, 4)
	must(t, "claim", err)
	gen := &fakeGen{}
	lease := &fakeLease{id: 4}
	h := testHeartbeat(t, heartbeatConfig(func(c *HeartbeatConfig) {
		c.Lease, c.Generator, c.Forever, c.fence = lease, gen, f, w
		c.WriteTimeout = 500 * time.Millisecond
	}))
	must(t, "first Beat", h.Beat(ctx))
	first, suspended := gen.state()
	if suspended != nil || first == 0 {
		t.Fatalf("after the first beat: ceiling %d, suspended %v; want a ceiling and issuing", first, suspended)
	}
	env.srv.Stop()
	time.Sleep(10 * time.Millisecond) // the clock moves on: a beat would raise the ceiling
	err = h.Beat(ctx)
	wantErrIs(t, "Beat while the bucket is down", err, ErrNotRecorded)
	if c, _ := gen.state(); c != first {
		t.Fatalf("ceiling %d after a beat only the registry recorded, want %d kept", c, first)
	}
	if len(lease.renewed) != 2 {
		t.Fatalf("the lease was renewed %d times, want 2 (the registry records every beat)", len(lease.renewed))
	}
	env.srv.Start()
	testutil.Eventually(t, 10*time.Second, "a beat with the bucket back", func() bool { return h.Beat(ctx) == nil })
	if c, _ := gen.state(); c <= first {
		t.Fatalf("ceiling %d after the bucket came back, want above %d", c, first)
	}
}

// TestHeartbeatFenceLost: a beat whose fenced write finds another holder's record
// suspends the generator for good and reports the loss, naming the holder; an earlier
// write of its own that only seemed to fail suspends it only while the record is read.
func TestHeartbeatFenceLost(t *testing.T) {
	env := startJS(t)
	f := openForever(t, env.js)
	ctx := testutil.Context(t, 30*time.Second)
	var logs testutil.SyncBuffer
	w, err := testClaimer(t, f, time.Minute, &logs).claim(ctx, 5)
	must(t, "claim", err)
	gen := &fakeGen{}
	h := testHeartbeat(t, heartbeatConfig(func(c *HeartbeatConfig) {
		c.Lease, c.Generator, c.Forever, c.fence = &fakeLease{id: 5}, gen, f, w
	}))
	must(t, "first Beat", h.Beat(ctx))

	putWorker(t, f, 5, Record{WorkerID: 5, Timestamp: time.Now().UnixMilli(), NodeID: "n1", Instance: "run-1"})
	must(t, "Beat after an own write", h.Beat(ctx))
	if _, suspended := gen.state(); suspended != nil || !gen.sawSuspension(ErrLeaseUnverified) {
		t.Fatalf("after an own write: suspended %v (suspended while read: %v); want issuing again", suspended, gen.sawSuspension(ErrLeaseUnverified))
	}

	// A claimer's record: its ceiling is above every ceiling it read, this holder's too.
	putWorker(t, f, 5, Record{WorkerID: 5, Timestamp: time.Now().UnixMilli(), Ceiling: time.Now().Add(time.Minute).UnixMilli(), NodeID: "disp-2", Instance: "run-2"})
	err = h.Beat(ctx)
	testutil.CheckErr(t, "Beat after another holder's write", err, ErrWorkerIDInUse, "worker ID 5 is held by node disp-2")
	wantErrIs(t, "Beat", err, ErrLeaseLost)
	if _, suspended := gen.state(); !errors.Is(suspended, ErrWorkerIDInUse) {
		t.Fatalf("generator suspended with %v, want the loss", suspended)
	}
	if st := h.Stats(); !st.LeaseLost {
		t.Fatalf("Stats() = %+v, want the lease lost", st)
	}
	if got, _ := f.GetWorker(ctx, 5); got.NodeID != "disp-2" {
		t.Fatalf("record = %+v, want disp-2's untouched", got)
	}
}
