package client

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leafbus/leafbus/internal/testutil"
	"github.com/leafbus/leafbus/wire"
)

// countingFetch fills each batch with the next consecutive IDs at once, from 1: a
// dispenser infinitely fast, so that a benchmark measures Next, not the supply, and a
// test knows every ID that was fetched.
func countingFetch() func(context.Context, []int64) error {
	var next atomic.Int64
	return func(_ context.Context, dst []int64) error {
		last := next.Add(int64(len(dst)))
		for i := range dst {
			dst[i] = last - int64(len(dst)) + int64(i) + 1
		}
		return nil
	}
}

func mustNewBuffer(tb testing.TB, opts BufferOptions, fetch func(context.Context, []int64) error) *Buffer {
	tb.Helper()
	b, err := newBuffer(wire.Segment, "t", opts, fetch)
	if err != nil {
		tb.Fatalf("newBuffer(%+v): %v", opts, err)
	}
	tb.Cleanup(b.Close)
	return b
}

func testOptions(batch, batches, lowWater int) BufferOptions {
	o := DefaultBufferOptions()
	o.Batch, o.Batches, o.LowWater = batch, batches, lowWater
	return o
}

// TestBufferRefillsAtLowWater: the fetcher is woken by the Next that takes the buffer
// under LowWater, wherever that index falls (in the current batch, or at once when a
// batch becomes current under the mark), not only once the buffer is empty.
func TestBufferRefillsAtLowWater(t *testing.T) {
	tests := []struct {
		name                    string
		batch, batches, low     int
		takeBeforeFetch, settle int // the buffer settles at settle IDs; taking takeBeforeFetch more must fetch
	}{
		{"OK/InCurrentBatch", 10, 3, 15, 6, 20},
		{"OK/AtBatchBoundary", 10, 3, 11, 10, 20},
		{"OK/OneBatch", 10, 1, 1, 10, 10},
		{"OK/LowWaterAtBound", 10, 3, 21, 10, 30},
		{"OK/DefaultLowWater", 10, 2, 0, 1, 10}, // LowWater = Batch: one batch held, the first Next fetches
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			wakesAtLowWater(t, tt.batch, tt.batches, tt.low, tt.settle, tt.takeBeforeFetch, func(b *Buffer) func(context.Context) (int64, error) { return b.Next })
		})
	}
}

// wakesAtLowWater builds a buffer of batch x batches IDs with low-water mark low and a
// counting source, lets it settle at settle IDs, then takes n IDs through the taker
// takerOf gives for it: no fetch may start before the n-th, and one must follow it.
func wakesAtLowWater(t *testing.T, batch, batches, low, settle, n int, takerOf func(*Buffer) func(context.Context) (int64, error)) {
	t.Helper()
	fetches := make(chan struct{}, 100)
	count := countingFetch()
	b := mustNewBuffer(t, testOptions(batch, batches, low), func(ctx context.Context, dst []int64) error {
		fetches <- struct{}{}
		return count(ctx, dst)
	})
	testutil.Eventually(t, 5*time.Second, "the buffer to settle", func() bool { return b.Len() == settle })
	drain(fetches)
	next := takerOf(b)
	ctx := context.Background()
	for i := range n {
		if _, err := next(ctx); err != nil {
			t.Fatalf("Next %d: %v", i, err)
		}
		if i < n-1 && len(fetches) > 0 {
			t.Fatalf("fetched after %d Next calls, with %d IDs left of LowWater %d", i+1, b.Len(), low)
		}
	}
	select {
	case <-fetches:
	case <-time.After(5 * time.Second):
		t.Fatalf("no fetch within 5s of the buffer going under LowWater %d (it holds %d)", low, b.Len())
	}
}

// TestBusyTakerLeavesFetcherRoom: a goroutine that takes IDs in a loop that never
// blocks, alone on the only P, still gets its refills while the stock lasts, through Next
// and through cursors: the fetch a take under LowWater asks for runs before the buffer is
// empty, not once the taker has drained it and waits. Without the yield in wake, the
// fetcher is queued behind the taker and nearly every fetch finds the buffer empty.
// The scheduler checks its global queue first on one pick in 61, so a yield now and then
// hands the P straight back to the taker; the bound allows for that many times over.
func TestBusyTakerLeavesFetcherRoom(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	for _, tt := range []struct {
		name string
		run  int // 0: Buffer.Next
	}{
		{"OK/Next", 0},
		{"OK/CursorRunsOf100", 100},
		{"OK/CursorRunsOfBatch", 1000},
	} {
		t.Run(tt.name, func(t *testing.T) {
			const batch, batches, low, crossings = 1000, 4, 2000, 200
			var w fetchWatch
			b := mustNewBuffer(t, testOptions(batch, batches, low), w.fetch())
			testutil.Eventually(t, 5*time.Second, "the first batches", func() bool { return b.Len() >= low })
			w.watch(b)
			next := b.Next
			if tt.run > 0 {
				next = b.Cursor(tt.run).Next
			}
			ctx := context.Background()
			for i := range crossings * batch {
				if _, err := next(ctx); err != nil {
					t.Fatalf("Next %d: %v", i, err)
				}
			}
			if got := w.empty.Load(); got > crossings/4 {
				t.Errorf("%d of %d fetches found the buffer empty: the taker starves the fetcher", got, w.fetches.Load())
			}
			t.Logf("%d of %d fetches found the buffer empty", w.empty.Load(), w.fetches.Load())
		})
	}
}

// fetchWatch is countingFetch that also counts, once watch has named the buffer, the
// fetches that start with it empty: takers drained it and wait for this fetch, so the
// refill was not in the background.
type fetchWatch struct {
	buf            atomic.Pointer[Buffer]
	fetches, empty atomic.Int64
}

func (w *fetchWatch) watch(b *Buffer) { w.buf.Store(b) }

func (w *fetchWatch) fetch() func(context.Context, []int64) error {
	count := countingFetch()
	return func(ctx context.Context, dst []int64) error {
		if b := w.buf.Load(); b != nil {
			w.fetches.Add(1)
			if b.Len() == 0 {
				w.empty.Add(1)
			}
		}
		return count(ctx, dst)
	}
}

// reportEmptyFetches adds the share of w's fetches that found the buffer empty.
func reportEmptyFetches(b *testing.B, w *fetchWatch) {
	if n := w.fetches.Load(); n > 0 {
		b.ReportMetric(100*float64(w.empty.Load())/float64(n), "empty-fetch-%")
	}
}

// TestBufferConcurrentRefills: many goroutines drain a small buffer far faster than a
// batch lasts, through every batch change, from sources of consecutive IDs and of IDs
// with gaps (batches of many runs, runs of one). No ID is handed out twice and none is
// lost (once the fetcher is stopped, the IDs taken and those left in the buffer are
// exactly those fetched, but for a last batch fetched as it stopped), each goroutine
// sees its IDs increase, and the buffer never holds more than its bound. Run it with
// -race.
func TestBufferConcurrentRefills(t *testing.T) {
	for _, tt := range refillShapes {
		for _, src := range sourceShapes {
			t.Run(tt.name+"/"+src.name, func(t *testing.T) {
				s := newSource(src.shape)
				b := mustNewBuffer(t, testOptions(tt.batch, tt.batches, tt.low), s.fetch)
				const goroutines, each = 16, 20000
				got, _ := drainWithCursors(t, b, nil, goroutines, each, tt.batch*tt.batches)
				checkExactlyFetched(t, stopAndCollect(b, got), s.fetched())
			})
		}
	}
}

// refillShapes are the buffers the concurrency tests drain through every batch change:
// the low-water mark inside a batch, a buffer of one batch, many small batches.
var refillShapes = []struct {
	name                string
	batch, batches, low int
}{
	{"OK/LowWaterInsideBatch", 100, 3, 150},
	{"OK/OneBatch", 7, 1, 1},
	{"OK/ManySmallBatches", 3, 50, 120},
}

// stopAndCollect stops b's fetcher, keeping what b holds, and returns the IDs taken
// (every goroutine's) followed by those left in the buffer.
func stopAndCollect(b *Buffer, taken [][]int64) []int64 {
	b.stop()
	<-b.done
	var all []int64
	for _, ids := range taken {
		all = append(all, ids...)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if cur := b.cur.Load(); cur.left() > 0 {
		all = append(all, idsFrom(cur, cur.size-int64(cur.left()))...)
	}
	for _, q := range b.queue {
		all = append(all, idsFrom(q, 0)...)
	}
	return all
}

// watchBound checks every 50µs, until stop is called, that b never holds more than
// bound IDs; a breach goes to errs.
func watchBound(b *Buffer, bound int, errs chan<- error) (stop func()) {
	done := make(chan struct{})
	var checker sync.WaitGroup
	checker.Go(func() {
		for {
			if n := b.Len(); n > bound {
				errs <- fmt.Errorf("buffer holds %d IDs, above its bound %d", n, bound)
				return
			}
			select {
			case <-done:
				return
			case <-time.After(50 * time.Microsecond):
			}
		}
	})
	return func() {
		close(done)
		checker.Wait()
	}
}

// TestBufferCloseWhileTaking: Close while goroutines take IDs: each Next returns an ID
// or ErrBufferClosed, never the same ID twice, and none hangs.
func TestBufferCloseWhileTaking(t *testing.T) {
	b := mustNewBuffer(t, testOptions(50, 2, 0), countingFetch())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var wg sync.WaitGroup
	var mu sync.Mutex
	seen := map[int64]bool{}
	started := make(chan struct{}, 8)
	for range 8 {
		wg.Go(func() {
			started <- struct{}{}
			for {
				id, err := b.Next(ctx)
				if err == ErrBufferClosed {
					return
				}
				if err != nil {
					t.Errorf("Next: %v, want an ID or ErrBufferClosed", err)
					return
				}
				mu.Lock()
				dup := seen[id]
				seen[id] = true
				mu.Unlock()
				if dup {
					t.Errorf("ID %d handed out twice", id)
					return
				}
			}
		})
	}
	for range 8 {
		<-started
	}
	b.Close()
	wg.Wait()
}

// lockedBuffer is the Buffer of 8414e1b, kept to benchmark against in the same run:
// every Next takes a mutex, and the refill works as the Buffer's does.
type lockedBuffer struct {
	opts  BufferOptions
	fetch func(context.Context, []int64) error

	mu     sync.Mutex
	chunks [][]int64
	pos    int
	count  int
	want   chan struct{}
	stop   context.CancelFunc
	done   chan struct{}
}

func newLockedBuffer(opts BufferOptions, fetch func(context.Context, []int64) error) *lockedBuffer {
	ctx, cancel := context.WithCancel(context.Background())
	b := &lockedBuffer{opts: opts, fetch: fetch, want: make(chan struct{}, 1), stop: cancel, done: make(chan struct{})}
	go b.run(ctx)
	return b
}

// Next as 8414e1b had it, for a buffer that is never empty (the benchmark waits for
// the first batch, and the instant fetch keeps up).
func (b *lockedBuffer) Next(context.Context) (int64, error) {
	for {
		b.mu.Lock()
		if b.count > 0 {
			id := b.chunks[0][b.pos]
			b.pos++
			b.count--
			if b.pos == len(b.chunks[0]) {
				b.chunks[0] = nil
				b.chunks = b.chunks[1:]
				b.pos = 0
			}
			low := b.count < b.opts.LowWater
			b.mu.Unlock()
			if low {
				select {
				case b.want <- struct{}{}:
				default:
				}
			}
			return id, nil
		}
		b.mu.Unlock()
		time.Sleep(time.Microsecond) // never in the benchmark's steady state
	}
}

func (b *lockedBuffer) run(ctx context.Context) {
	defer close(b.done)
	for {
		b.mu.Lock()
		need := b.count < b.opts.LowWater
		b.mu.Unlock()
		if !need {
			select {
			case <-ctx.Done():
				return
			case <-b.want:
			}
			continue
		}
		ids := make([]int64, b.opts.Batch)
		if b.fetch(ctx, ids) != nil {
			return
		}
		b.mu.Lock()
		b.chunks = append(b.chunks, ids)
		b.count += len(ids)
		b.mu.Unlock()
	}
}

func (b *lockedBuffer) Close() {
	b.stop()
	<-b.done
}

// BenchmarkBufferNextMemory is Next with the buffer's goroutine refilling it in the
// background (batches of 1000, at most 4 held, a fetch below 2000) from an instant
// source: the cost of Next itself, on one goroutine and, with -cpu 2, on two at once,
// for the Buffer of 8414e1b (locked) and this one (lock-free) in one run. The kind does
// not matter here: IDs are numbers in memory. BenchmarkBufferNext measures the same
// against a real dispenser, where the supply (one round trip per batch) can be the limit.
func BenchmarkBufferNextMemory(b *testing.B) {
	opts := testOptions(1000, 4, 2000)
	for _, impl := range []string{"locked", "lock-free"} {
		b.Run(impl, func(b *testing.B) {
			var next func(context.Context) (int64, error)
			var w fetchWatch
			var watched *Buffer
			if impl == "locked" {
				buf := newLockedBuffer(opts, countingFetch())
				defer buf.Close()
				next = buf.Next
			} else {
				watched = mustNewBuffer(b, opts, w.fetch())
				next = watched.Next
			}
			ctx := context.Background()
			if _, err := next(ctx); err != nil { // the first batch is in
				b.Fatal(err)
			}
			if watched != nil {
				w.watch(watched)
			}
			b.ReportAllocs()
			b.ResetTimer()
			cpu := testutil.ProcessCPU()
			b.RunParallel(func(pb *testing.PB) {
				last := int64(0)
				for pb.Next() {
					id, err := next(ctx)
					if err != nil || id <= last {
						b.Errorf("Next = %d, %v after %d", id, err, last)
						return
					}
					last = id
				}
			})
			reportRates(b, testutil.ProcessCPU()-cpu)
			reportEmptyFetches(b, &w)
		})
	}
}

// BenchmarkBufferCursorMemory is BenchmarkBufferNextMemory (same instant source) with
// each goroutine taking IDs through its own Cursor, which claims runs of 100 or 1000
// IDs with one shared add each: with -cpu 2, two goroutines that share one add per run
// instead of one per ID. Each runs under b.RunParallel ("parallel") and under runSpread
// ("spread"), which is the same loop without testing.PB's own false sharing; "next" is
// Buffer.Next under both, to compare in the same run. The stock is
// BenchmarkBufferNextMemory's (batches of 1000, at most 4 held, a fetch below 2000) and,
// as "stock-80k", one sized for 300M IDs/s (batches of 10,000, at most 8, a fetch below
// 40,000: the fetcher has about 130 µs to get its turn on a core).
func BenchmarkBufferCursorMemory(b *testing.B) {
	for _, stock := range []struct {
		name string
		opts BufferOptions
	}{
		{"", testOptions(1000, 4, 2000)},
		{"/stock-80k", testOptions(10000, 8, 40000)},
	} {
		benchmarkCursorMemory(b, stock.name, stock.opts)
	}
}

func benchmarkCursorMemory(b *testing.B, suffix string, opts BufferOptions) {
	for _, run := range []int{0, 100, 1000} {
		name := fmt.Sprintf("run-%d", run)
		if run == 0 {
			name = "next"
		}
		for _, harness := range []string{"parallel", "spread"} {
			b.Run(name+"/"+harness+suffix, func(b *testing.B) {
				var w fetchWatch
				buf := mustNewBuffer(b, opts, w.fetch())
				ctx := context.Background()
				if _, err := buf.Next(ctx); err != nil { // the first batch is in
					b.Fatal(err)
				}
				w.watch(buf)
				next := func() func(context.Context) (int64, error) { // one per goroutine
					if run == 0 {
						return buf.Next
					}
					return buf.Cursor(run).Next
				}
				b.ReportAllocs()
				b.ResetTimer()
				cpu := testutil.ProcessCPU()
				if harness == "parallel" {
					b.RunParallel(func(pb *testing.PB) { takeIncreasing(b, ctx, pb.Next, next()) })
				} else {
					runSpread(b, func(pb *spreadPB) { takeIncreasing(b, ctx, pb.Next, next()) })
				}
				reportRates(b, testutil.ProcessCPU()-cpu)
				reportEmptyFetches(b, &w)
			})
		}
	}
}

// takeIncreasing calls next while more says so, checking that the IDs increase.
func takeIncreasing(b *testing.B, ctx context.Context, more func() bool, next func(context.Context) (int64, error)) {
	last := int64(0)
	for more() {
		id, err := next(ctx)
		if err != nil || id <= last {
			b.Errorf("Next = %d, %v after %d", id, err, last)
			return
		}
		last = id
	}
}

// spreadPB is testing.PB for runSpread: one goroutine's share of b.N, taken from a
// shared count in grains. Next writes left on every iteration, so the padding makes it
// 128 bytes, alone on its cache lines: the two testing.PBs of a -cpu 2 RunParallel were
// measured 32 bytes apart, one line that both cores then write on every iteration.
type spreadPB struct {
	left  int64
	taken *atomic.Int64
	n     int64
	_     [128 - 24]byte
}

// Next reports whether another iteration is due, as testing.PB.Next does.
func (p *spreadPB) Next() bool {
	if p.left == 0 {
		const grain = 1000
		end := p.taken.Add(grain)
		p.left = min(grain, p.n-(end-grain))
		if p.left <= 0 {
			p.left = 0
			return false
		}
	}
	p.left--
	return true
}

// runSpread is b.RunParallel without its false sharing: GOMAXPROCS goroutines share
// b.N through spreadPBs.
func runSpread(b *testing.B, body func(*spreadPB)) {
	var taken atomic.Int64
	var wg sync.WaitGroup
	for range runtime.GOMAXPROCS(0) {
		wg.Go(func() { body(&spreadPB{taken: &taken, n: int64(b.N)}) })
	}
	wg.Wait()
}

// BenchmarkSpreadControl is runSpread around arithmetic that touches no memory: what
// -cpu 2 gives on this machine when nothing is shared. On a shared host whose cores
// are busy, two goroutines may not get two cores; this tells whether a -cpu 2 figure
// says something about the code or about the host.
func BenchmarkSpreadControl(b *testing.B) {
	cpu := testutil.ProcessCPU()
	runSpread(b, func(pb *spreadPB) {
		x := uint64(1)
		for pb.Next() { // two rounds of a 64-bit LCG and a shift: a few ns, no memory
			x = x*6364136223846793005 + 1442695040888963407
			x ^= x >> 13
			x = x*6364136223846793005 + 1442695040888963407
		}
		if x == 42 { // uses x, so that the loop is not removed
			b.Log(x)
		}
	})
	reportRates(b, testutil.ProcessCPU()-cpu)
}

// reportRates adds millions of IDs per second and, where the platform says, the CPU
// time of the whole process (every goroutine, the refills and the garbage collector
// included) per ID: on a machine whose cores are shared, the figure that does not
// depend on how much of them the benchmark got.
func reportRates(b *testing.B, cpu time.Duration) {
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds()/1e6, "M-IDs/s")
	if cpu > 0 {
		b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/op")
	}
}

func drain(ch chan struct{}) {
	for len(ch) > 0 {
		<-ch
	}
}
