package workerid

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/leafbus/leafbus/internal/testutil"
	"github.com/leafbus/leafbus/snowflake"
)

// Leaf's restart hole: the record is written every 3 s and holds the clock, so a node
// that crashes between two writes and restarts with its clock set back (by less than the
// time since the last write) passes Leaf's check and reissues timestamps it already used.
// Here a real generator issues at full speed (borrowing ahead of the clock), is killed
// between heartbeats with no clean stop, and a fresh Guard and generator start with the
// clock 2 s behind: no ID may repeat.
func TestRestartAfterCrashWithClockSetBackRepeatsNoID(t *testing.T) {
	tests := []struct {
		name string
		kv   bool // KV lease that expires and is taken by a new node, instead of a static ID
	}{
		{name: "static ID, same node"},
		{name: "KV lease, recycled to a new node", kv: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			testRestart(t, tt.kv)
		})
	}
}

func testRestart(t *testing.T, kv bool) {
	const (
		interval = 500 * time.Millisecond
		borrow   = 200 * time.Millisecond
		runFor   = 800 * time.Millisecond // beats at 0 and 500ms: killed 300ms after the last
	)
	// Four sequence bits (16 IDs per ms) make the generator run out of each millisecond
	// and borrow ahead of the clock even under the race detector.
	layout := snowflake.Layout{Epoch: snowflake.DefaultLayout().Epoch, TimeBits: 41, WorkerBits: 18, SequenceBits: 4}
	env := startJS(t)
	forever := openForever(t, env.js)
	dir := t.TempDir()

	type node struct {
		id    string
		lease Lease
		cache *CacheFile
	}
	newNode := func(id string) node {
		n := node{id: id, cache: &CacheFile{Path: filepath.Join(dir, id+".json")}}
		if kv {
			n.lease = acquire(t, openKVRegistry(t, env.js, kvConfig(id, kvMaxWorkerID(0))))
		} else {
			reg, err := NewStaticRegistry(5, layout.MaxWorkerID())
			must(t, "NewStaticRegistry", err)
			n.lease, err = reg.Acquire(context.Background())
			must(t, "Acquire", err)
		}
		return n
	}
	start := func(n node, clock snowflake.Clock) (*snowflake.Generator, *Heartbeat, int64) {
		t.Helper()
		g, err := newGuard(guardConfig(func(c *GuardConfig) {
			c.NodeID = n.id
			c.Forever = forever
			c.Cache = n.cache
			c.Clock = clock
			c.HeartbeatInterval = interval
			c.BorrowMax = borrow
			c.ClockWaitMax = 5 * time.Second
			c.Logger = testutil.Logger(t)
		}))
		must(t, "newGuard", err)
		floor, err := g.Start(testutil.Context(t, 20*time.Second), n.lease)
		must(t, "Guard.Start", err)
		gen, err := snowflake.New(snowflake.Config{Layout: layout, WorkerID: n.lease.WorkerID(), Clock: clock, Floor: floor, BorrowMax: borrow})
		must(t, "snowflake.New", err)
		hb := testHeartbeat(t, heartbeatConfig(func(c *HeartbeatConfig) {
			c.NodeID = n.id
			c.Lease = n.lease
			c.Generator = gen
			c.Forever = forever
			c.Cache = n.cache
			c.Clock = clock
			c.Interval = interval
			c.BorrowMax = borrow
		}))
		must(t, "first Beat", hb.Beat(context.Background()))
		return gen, hb, floor
	}

	// Run 1: issue and beat until "killed".
	first := newNode("first")
	gen1, hb1, _ := start(first, snowflake.SystemClock())
	ids1 := issueFor(t, gen1, hb1, runFor)
	issued1 := gen1.Issued()
	if now := time.Now().UnixMilli(); issued1 <= now {
		t.Logf("note: the generator was not borrowing at the kill (issued %s, clock %s)", fmtMs(issued1), fmtMs(now))
	}

	// Run 2, on a clock 2 s behind: without the guard it would reuse run 1's timestamps.
	second := first
	if kv {
		// The killed node's lease expires (deleted here rather than waited for) and a new
		// node, with no record of its own, takes the ID: only the registry protects it.
		leases, err := env.js.KeyValue(context.Background(), "leaf_leases")
		must(t, "bind leases", err)
		must(t, "expire the lease", leases.Delete(context.Background(), "0"))
		second = newNode("second")
		if second.lease.WorkerID() != first.lease.WorkerID() {
			t.Fatalf("the new node got worker ID %d, want the recycled %d", second.lease.WorkerID(), first.lease.WorkerID())
		}
	}
	back := testutil.OffsetClock{Offset: -2 * time.Second}
	if now := back.Now().UnixMilli(); now > issued1 {
		t.Fatalf("test setup: the set-back clock %s is already past run 1's last timestamp %s", fmtMs(now), fmtMs(issued1))
	}
	gen2, hb2, floor2 := start(second, back)
	if floor2 < issued1 {
		t.Fatalf("floor %s of the restart is below run 1's last timestamp %s", fmtMs(floor2), fmtMs(issued1))
	}
	ids2 := issueFor(t, gen2, hb2, 200*time.Millisecond)

	all := slices.Concat(ids1, ids2)
	slices.Sort(all)
	for i := 1; i < len(all); i++ {
		if all[i] == all[i-1] {
			d, _ := layout.Decode(all[i])
			t.Fatalf("ID %d issued twice (timestamp %s, sequence %d)", all[i], fmtMs(d.Timestamp), d.Sequence)
		}
	}
	t.Logf("%d IDs before the crash, %d after; run 1 issued up to %s, restart floor %s",
		len(ids1), len(ids2), fmtMs(issued1), fmtMs(floor2))
}

// issueFor issues IDs from two goroutines while a third beats every interval, for d; then
// everything just stops, as if the process had been killed.
func issueFor(t *testing.T, gen *snowflake.Generator, hb *Heartbeat, d time.Duration) []int64 {
	t.Helper()
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(hb.cfg.Interval)
		defer tick.Stop()
		for {
			select {
			case <-stop:
				return
			case <-tick.C:
				hb.Beat(context.Background())
			}
		}
	}()
	out := make([][]int64, 2)
	errs := make([]error, 2)
	for i := range out {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]int64, 64)
			for {
				select {
				case <-stop:
					return
				default:
				}
				err := gen.Fill(buf)
				switch {
				case err == nil:
					out[i] = append(out[i], buf...)
				case errors.Is(err, snowflake.ErrCeiling), errors.Is(err, snowflake.ErrClockBackwards):
					// Refused at the heartbeat's bound: exactly what keeps IDs unique.
				default:
					errs[i] = err
					return
				}
			}
		}()
	}
	time.Sleep(d)
	close(stop)
	wg.Wait()
	for _, err := range errs {
		must(t, "Fill", err)
	}
	return slices.Concat(out...)
}
