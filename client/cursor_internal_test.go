package client

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unsafe"

	"github.com/leafbus/leafbus/internal/testutil"
)

// TestCursorConcurrentRefills: goroutines with a cursor each (runs of several sizes,
// some beyond a batch) and goroutines calling Buffer.Next share a small buffer through
// many batch changes and refills, from sources of consecutive IDs and of IDs with gaps
// (batches of many runs, runs of one, so that claims cross runs). Each goroutine's IDs
// increase, no cursor ever holds more than its run, the buffer never holds more than
// its bound, and once the fetcher is stopped the IDs handed out, those left in cursors
// and those left in the buffer are exactly those fetched, with no repeat: nothing is
// handed out twice and nothing is lost but the cursors' tails (and a batch fetched as
// the fetcher stopped, which is the last).
// Run it with -race.
func TestCursorConcurrentRefills(t *testing.T) {
	for _, tt := range refillShapes {
		for _, src := range sourceShapes {
			t.Run(tt.name+"/"+src.name, func(t *testing.T) {
				s := newSource(src.shape)
				b := mustNewBuffer(t, testOptions(tt.batch, tt.batches, tt.low), s.fetch)
				runs := []int{1, 2, 5, 16, 64, 1000, 1, 2, 5, 16, 64, 1000}
				const plain, each = 4, 20000
				got, cursors := drainWithCursors(t, b, runs, plain, each, tt.batch*tt.batches)
				all := stopAndCollect(b, got)
				for _, c := range cursors {
					all = append(all, heldIDs(c)...)
				}
				checkExactlyFetched(t, all, s.fetched())
			})
		}
	}
}

// drainWithCursors takes each IDs on one goroutine per entry of runs, through a cursor
// of that run size, and on plain goroutines through Buffer.Next, while another checks
// that b never holds more than bound. It returns every goroutine's IDs (the cursors'
// first) and the cursors, to read what they still hold.
func drainWithCursors(t *testing.T, b *Buffer, runs []int, plain, each, bound int) ([][]int64, []*Cursor) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	goroutines := len(runs) + plain
	got := make([][]int64, goroutines)
	cursors := make([]*Cursor, len(runs))
	errs := make(chan error, goroutines+1)
	stopChecker := watchBound(b, bound, errs)
	var wg sync.WaitGroup
	for g := range goroutines {
		next, held := b.Next, func() int { return 0 }
		maxHeld := 0
		if g < len(runs) {
			c := b.Cursor(runs[g])
			cursors[g] = c
			next, held = c.Next, func() int { return cursorHeld(c) }
			maxHeld = min(runs[g], b.opts.Batch)
		}
		wg.Go(func() {
			ids := make([]int64, 0, each)
			for range each {
				id, err := next(ctx)
				if err != nil {
					errs <- fmt.Errorf("goroutine %d: Next: %w", g, err)
					return
				}
				if n := len(ids); n > 0 && id <= ids[n-1] {
					errs <- fmt.Errorf("goroutine %d: %d after %d", g, id, ids[n-1])
					return
				}
				if h := held(); h > maxHeld {
					errs <- fmt.Errorf("goroutine %d: its cursor holds %d IDs, above its run %d", g, h, maxHeld)
					return
				}
				ids = append(ids, id)
			}
			got[g] = ids
		})
	}
	wg.Wait()
	stopChecker()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	return got, cursors
}

// TestCursorRefillsAtLowWater: the claim whose run takes the buffer under LowWater
// wakes the fetcher, wherever the low-water index falls in the run (a run cut at the
// batch's end included), and no claim before it does.
func TestCursorRefillsAtLowWater(t *testing.T) {
	tests := []struct {
		name                        string
		batch, batches, low, run    int
		settle, nextsBeforeAnyFetch int // settle IDs held; the nextsBeforeAnyFetch-th Next fetches
	}{
		{"OK/InsideRun", 10, 3, 15, 4, 20, 5},        // runs 0-3 (16 left), 4-7 (12 < 15)
		{"OK/RunCutAtBatchEnd", 10, 3, 11, 4, 20, 9}, // 0-3, 4-7 (12), 8-9 cut (10 < 11)
		{"OK/RunOverBatch", 10, 3, 15, 25, 20, 1},    // clamped to 10: 0-9 (10 < 15)
		{"OK/RunOfOne", 10, 3, 15, 1, 20, 6},         // as Next: the 6th leaves 14
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			wakesAtLowWater(t, tt.batch, tt.batches, tt.low, tt.settle, tt.nextsBeforeAnyFetch, func(b *Buffer) func(context.Context) (int64, error) { return b.Cursor(tt.run).Next })
		})
	}
}

// hangingFetch never answers: it returns when the buffer closes, as a fetch in flight
// to a silent responder would.
func hangingFetch(ctx context.Context, _ []int64) error {
	<-ctx.Done()
	return ctx.Err()
}

// TestCursorClose: Close wakes a cursor waiting on an empty buffer with
// ErrBufferClosed, and a cursor still holding part of its run hands none of it out
// after Close (the rest is a gap, as the buffer's own IDs are).
func TestCursorClose(t *testing.T) {
	t.Run("OK/Waiting", func(t *testing.T) {
		b := mustNewBuffer(t, testOptions(10, 2, 0), hangingFetch)
		c := b.Cursor(4)
		nextErr := make(chan error, 1)
		go func() {
			_, err := c.Next(context.Background())
			nextErr <- err
		}()
		time.Sleep(20 * time.Millisecond) // let Next start waiting (not required for the assertions)
		b.Close()
		select {
		case err := <-nextErr:
			if !errors.Is(err, ErrBufferClosed) {
				t.Fatalf("waiting Cursor.Next after Close = %v, want ErrBufferClosed", err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("a waiting Cursor.Next was not woken by Close within 5s")
		}
	})
	// A claim of 4 holds the next IDs as one stretch (consecutive IDs: dropped by Next's
	// own check) or as several (runs of one: dropped when Next moves to the next stretch).
	for _, src := range []struct {
		name  string
		fetch func(context.Context, []int64) error
		first int64 // the first ID; 0: any
	}{
		{"OK/HoldingARun", countingFetch(), 1},
		{"OK/HoldingRunsOfOne", newSource(shapeRunsOfOne).fetch, 0},
	} {
		t.Run(src.name, func(t *testing.T) {
			b := mustNewBuffer(t, testOptions(10, 2, 0), src.fetch)
			c := b.Cursor(4)
			ctx := context.Background()
			if id, err := c.Next(ctx); err != nil || (src.first != 0 && id != src.first) {
				t.Fatalf("Cursor.Next = %d, %v, want %d", id, err, src.first)
			}
			b.Close()
			for range 2 {
				if id, err := c.Next(ctx); !errors.Is(err, ErrBufferClosed) {
					t.Fatalf("Cursor.Next after Close = %d, %v, want ErrBufferClosed (the rest of the claim dropped)", id, err)
				}
			}
			if n := cursorHeld(c); n > 0 {
				t.Fatalf("the cursor keeps %d IDs after Close, want them dropped", n)
			}
		})
	}
}

// TestCursorContext: a cursor waiting on an empty buffer gives up when its context
// ends, with the context's error.
func TestCursorContext(t *testing.T) {
	b := mustNewBuffer(t, testOptions(10, 2, 0), hangingFetch)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := b.Cursor(4).Next(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Cursor.Next = %v, want context.DeadlineExceeded", err)
	}
}

// TestCursorFetchError: with the buffer empty and the last fetch failed, Cursor.Next
// returns that error at once, as Buffer.Next does, without waiting for its context;
// and a run claimed before is served first (errors show late).
func TestCursorFetchError(t *testing.T) {
	boom := errors.New("boom")
	var calls atomic.Int64
	count := countingFetch()
	opts := testOptions(4, 1, 0)
	opts.RetryMax = time.Millisecond
	b := mustNewBuffer(t, opts, func(ctx context.Context, dst []int64) error {
		if calls.Add(1) == 1 {
			return count(ctx, dst) // one batch, then only failures
		}
		return boom
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c := b.Cursor(3)
	for want := int64(1); want <= 4; want++ { // runs 1-3 and 4 (cut at the batch's end)
		if id, err := c.Next(ctx); err != nil || id != want {
			t.Fatalf("Cursor.Next = %d, %v, want %d", id, err, want)
		}
	}
	testutil.Eventually(t, 5*time.Second, "a failed fetch", func() bool { return calls.Load() >= 2 })
	if _, err := c.Next(ctx); !errors.Is(err, boom) {
		t.Fatalf("Cursor.Next on an empty buffer after a failed fetch = %v, want %v", err, boom)
	}
	if ctx.Err() != nil {
		t.Fatalf("Cursor.Next waited for its context instead of returning the fetch error")
	}
}

// TestCursorSize: a Cursor fills the 128-byte size class, so that no other object
// shares its cache lines (see its padding).
func TestCursorSize(t *testing.T) {
	if n := unsafe.Sizeof(Cursor{}); n != 128 {
		t.Fatalf("a Cursor is %d bytes, want 128: adjust its padding", n)
	}
}

// TestCursorRunSize: the run size is clamped to 1..Batch.
func TestCursorRunSize(t *testing.T) {
	b := mustNewBuffer(t, testOptions(10, 2, 0), countingFetch())
	for _, tt := range []struct{ n, want int64 }{{-1, 1}, {0, 1}, {1, 1}, {7, 7}, {10, 10}, {11, 10}} {
		if got := b.Cursor(int(tt.n)).n; got != tt.want {
			t.Errorf("Cursor(%d) runs %d IDs, want %d", tt.n, got, tt.want)
		}
	}
}
