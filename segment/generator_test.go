package segment

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leafbus/leafbus/snowflake"
)

func TestConfigValidate(t *testing.T) {
	store := NewInmemStore()
	ok := DefaultConfig()
	ok.Store = store
	for _, tc := range []struct {
		name    string
		change  func(*Config)
		wantErr string // a substring naming the field; "" for no error
	}{
		{"OK", func(*Config) {}, ""},
		{"NilStore", func(c *Config) { c.Store = nil }, "Store"},
		{"RefreshInterval", func(c *Config) { c.RefreshInterval = 0 }, "RefreshInterval 0s"},
		{"SegmentDuration", func(c *Config) { c.SegmentDuration = -time.Second }, "SegmentDuration -1s"},
		{"MaxStepZero", func(c *Config) { c.MaxStep = 0 }, "MaxStep 0"},
		{"MaxStepTooBig", func(c *Config) { c.MaxStep = MaxStoredStep + 1 }, "MaxStep 10000001 must be between 1 and 10000000"},
		{"WaitMax", func(c *Config) { c.WaitMax = 0 }, "WaitMax 0s"},
		{"LoadTimeout", func(c *Config) { c.LoadTimeout = 0 }, "LoadTimeout 0s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := ok
			tc.change(&cfg)
			err := cfg.Validate()
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("Validate() = %v, want an error naming %q", err, tc.wantErr)
			}
			if _, nerr := New(cfg); nerr == nil {
				t.Fatalf("New accepted the config Validate refuses")
			}
		})
	}
}

func TestNextStep(t *testing.T) {
	const target = 15 * time.Minute
	for _, tc := range []struct {
		name          string
		step, minStep int64
		lasted        time.Duration
		maxStep       int64
		want          int64
	}{
		{"FastDoubles", 100, 100, time.Minute, 1_000_000, 200},
		{"DoublesToMaxStep", 500_000, 100, time.Minute, 1_000_000, 1_000_000},
		{"WouldPassMaxStepKeeps", 600_000, 100, time.Minute, 1_000_000, 600_000},
		{"JustUnderTargetDoubles", 100, 100, target - time.Millisecond, 1_000_000, 200},
		{"AtTargetKeeps", 400, 100, target, 1_000_000, 400},
		{"UnderTwiceTargetKeeps", 400, 100, 2*target - time.Millisecond, 1_000_000, 400},
		{"AtTwiceTargetHalves", 400, 100, 2 * target, 1_000_000, 200},
		{"SlowHalves", 400, 100, time.Hour, 1_000_000, 200},
		{"HalvingBelowMinKeeps", 150, 100, time.Hour, 1_000_000, 150},
		{"HalvingToMin", 200, 100, time.Hour, 1_000_000, 100},
		{"RaisedMinIsFloor", 200, 5000, time.Hour, 1_000_000, 5000},
		{"RaisedMinIsFloorWhenFast", 200, 5000, time.Minute, 1_000_000, 5000},
		{"StoredStepAboveMaxStep", 3_000_000, 3_000_000, time.Minute, 1_000_000, 3_000_000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := nextStep(tc.step, tc.minStep, tc.lasted, target, tc.maxStep); got != tc.want {
				t.Fatalf("nextStep(%d, min %d, lasted %v, max %d) = %d, want %d", tc.step, tc.minStep, tc.lasted, tc.maxStep, got, tc.want)
			}
		})
	}
}

func TestNewSegmentClips(t *testing.T) {
	for _, tc := range []struct {
		name        string
		maxID, step int64
		start, size int64
	}{
		{"Normal", 1001, 1000, 1, 1000},
		{"HandInsertedZero", 10, 10, 1, 9},
		{"MaxIDBelowStep", 5, 10, 1, 4},
		{"MaxIDOne", 1, 10, 1, 0},
		{"MaxIDZero", 0, 10, 1, 0},
		{"MaxIDNegative", -1 << 63, 10, 1, 0},
		{"Top", 1<<63 - 1, 10, 1<<63 - 11, 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := newSegment(tc.maxID, tc.step)
			if s.start != tc.start || s.size != tc.size || s.trigger != tc.size/10 {
				t.Fatalf("newSegment(%d, %d) = start %d size %d trigger %d, want start %d size %d", tc.maxID, tc.step, s.start, s.size, s.trigger, tc.start, tc.size)
			}
		})
	}
}

func TestFillSequential(t *testing.T) {
	store := NewInmemStore()
	mustAdd(t, store, Tag{Name: "a", Step: 10})
	g, _ := startGenerator(t, testConfig(t, store))
	// One dispenser alone on a store gets adjacent segments, so its IDs have no gaps.
	for want := int64(1); want <= 200; want++ {
		if got := fill(t, g, "a", 1)[0]; got != want {
			t.Fatalf("ID #%d = %d, want %d", want, got, want)
		}
	}
}

func TestFillBatchSpansSegments(t *testing.T) {
	store := NewInmemStore()
	mustAdd(t, store, Tag{Name: "a", Step: 4}, Tag{Name: "b", Step: 10})
	cfg := testConfig(t, store)
	cfg.MaxStep = 4 // stays 4 for "a": a batch of 23 spans six segments
	g, _ := startGenerator(t, cfg)
	for _, tc := range []struct {
		tag  string
		n    int
		from int64
	}{
		{"a", 23, 1}, {"a", 1, 24}, {"a", 7, 25},
		{"b", 3, 1}, {"b", 12, 4}, {"b", 1, 16},
	} {
		got := fill(t, g, tc.tag, tc.n)
		for i, id := range got {
			if id != tc.from+int64(i) {
				t.Fatalf("Fill(%q, %d) = %v, want %d..%d", tc.tag, tc.n, got, tc.from, tc.from+int64(tc.n)-1)
			}
		}
	}
}

func TestTryFill(t *testing.T) {
	store := NewInmemStore()
	mustAdd(t, store, Tag{Name: "a", Step: 1000})
	mustAdd(t, store, Tag{Name: "w", Step: 1000})
	g, err := New(testConfig(t, store))
	if err != nil {
		t.Fatal(err)
	}
	dst := make([]int64, 3)
	// Starting: TryFill says "would wait", and Fill waits for the tag list (a dispenser
	// restarted under load takes requests before its tags are in), at most WaitMax.
	if ok, err := g.TryFill("a", dst); ok || err != nil {
		t.Fatalf("TryFill before Run = %v, %v; want false, nil (would wait)", ok, err)
	}
	if err := g.Fill(context.Background(), "a", dst); !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "starting") {
		t.Fatalf("Fill before Run = %v; want ErrUnavailable (starting) after WaitMax", err)
	}
	waited := make(chan error, 1)
	go func() { waited <- g.Fill(context.Background(), "w", make([]int64, 2)) }()
	stop := runGenerator(t, g)
	if err := <-waited; err != nil {
		t.Fatalf("Fill while the tag list loads = %v, want the IDs once it is in", err)
	}
	waitFor(t, "Ready", func() bool {
		select {
		case <-g.Ready():
			return true
		default:
			return false
		}
	})

	for _, tc := range []struct {
		name    string
		tag     string
		wantOK  bool
		wantErr error
	}{
		{"InvalidTag", "a\x00b", false, ErrInvalidTag},
		{"EmptyTag", "", false, ErrInvalidTag},
		{"UnknownTagWouldLookUp", "zzz", false, nil},
		{"ListedTagNotLoadedYet", "a", false, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ok, err := g.TryFill(tc.tag, dst)
			if ok != tc.wantOK || !errors.Is(err, tc.wantErr) || (tc.wantErr == nil && err != nil) {
				t.Fatalf("TryFill(%q) = %v, %v; want %v, %v", tc.tag, ok, err, tc.wantOK, tc.wantErr)
			}
		})
	}
	// The refused TryFill on "a" started its first load; once it is in, TryFill serves.
	waitFor(t, "the first load of a", func() bool { return g.bufferOf("a").cur.Load() != nil })
	ok, err := g.TryFill("a", dst)
	if !ok || err != nil || dst[0] != 1 || dst[1] != 2 || dst[2] != 3 {
		t.Fatalf("TryFill(a) = %v, %v, %v; want true and 1 2 3", ok, err, dst)
	}
	if ok, err := g.TryFill("a", nil); !ok || err != nil {
		t.Fatalf("TryFill(a, no room) = %v, %v; want true, nil", ok, err)
	}

	stop()
	if ok, err := g.TryFill("a", dst); ok || !errors.Is(err, ErrUnavailable) {
		t.Fatalf("TryFill after stop = %v, %v; want ErrUnavailable", ok, err)
	}
	if err := g.Fill(context.Background(), "a", dst); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Fill after stop = %v; want ErrUnavailable", err)
	}
}

func TestTryFillAllocatesNothing(t *testing.T) {
	store := NewInmemStore()
	mustAdd(t, store, Tag{Name: "a", Step: 1_000_000})
	g, _ := startGenerator(t, testConfig(t, store))
	fill(t, g, "a", 1)
	dst := make([]int64, 1)
	allocs := testing.AllocsPerRun(10_000, func() {
		if ok, err := g.TryFill("a", dst); !ok || err != nil {
			t.Fatalf("TryFill = %v, %v", ok, err)
		}
	})
	if allocs != 0 {
		t.Fatalf("TryFill of one ID allocates %v times, want 0", allocs)
	}
}

// TestPreloadAtTenPercent: the next segment is loaded when 10% of the current one is
// used, not before, and the switch to it needs no wait.
func TestPreloadAtTenPercent(t *testing.T) {
	store := newHookStore()
	mustAdd(t, store, Tag{Name: "a", Step: 100})
	cfg := testConfig(t, store)
	cfg.MaxStep = 100
	g, _ := startGenerator(t, cfg)
	fill(t, g, "a", 1)
	b := g.bufferOf("a")
	state := func() (next, loading bool) {
		b.mu.Lock()
		defer b.mu.Unlock()
		return b.next != nil, b.loading
	}
	dst := make([]int64, 1)
	for i := 2; i <= 10; i++ {
		if ok, err := g.TryFill("a", dst); !ok || err != nil {
			t.Fatalf("TryFill #%d = %v, %v", i, ok, err)
		}
	}
	if next, loading := state(); next || loading || store.takes.Load() != 1 {
		t.Fatalf("after 10 of 100 IDs: next %v, loading %v, takes %d; want no load yet", next, loading, store.takes.Load())
	}
	if ok, err := g.TryFill("a", dst); !ok || err != nil || dst[0] != 11 {
		t.Fatalf("TryFill #11 = %v, %v, %v", ok, err, dst)
	}
	if next, loading := state(); !next && !loading {
		t.Fatalf("after 11 of 100 IDs no load started")
	}
	waitFor(t, "the next segment", func() bool { next, _ := state(); return next })
	for want := int64(12); want <= 210; want++ {
		if ok, err := g.TryFill("a", dst); !ok || err != nil || dst[0] != want {
			t.Fatalf("TryFill = %v, %v, %v; want ID %d with no wait", ok, err, dst, want)
		}
		if want%100 == 50 { // past 10% of each new segment: let its successor arrive
			waitFor(t, "the next segment", func() bool { next, _ := state(); return next })
		}
	}
	if got := store.takes.Load(); got != 3 {
		t.Fatalf("store Takes = %d, want 3 for 210 IDs in segments of 100", got)
	}
}

// TestDynamicStep drives loads with an injected clock and checks the step each asks the
// store for, Leaf's way, including an admin's step change raising the floor.
func TestDynamicStep(t *testing.T) {
	store := newHookStore()
	var mu sync.Mutex
	var asked []int64
	store.TakeFn = func(ctx context.Context, tag string, step int64) (Tag, error) {
		mu.Lock()
		asked = append(asked, step)
		mu.Unlock()
		return store.inner.Take(ctx, tag, step)
	}
	lastAsked := func() (int, int64) {
		mu.Lock()
		defer mu.Unlock()
		return len(asked), asked[len(asked)-1]
	}
	mustAdd(t, store, Tag{Name: "a", Step: 100})
	clock := snowflake.NewFakeClock(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
	cfg := testConfig(t, store)
	cfg.Now = clock.Now
	cfg.MaxStep = 1000
	cfg.RefreshInterval = time.Hour // this test refreshes by hand
	g, _ := startGenerator(t, cfg)

	fill(t, g, "a", 1)
	if n, step := lastAsked(); n != 1 || step != 0 {
		t.Fatalf("first load asked for step %d (%d loads), want 0: the stored step", step, n)
	}
	setStep := func(s int64) func() {
		return func() {
			if _, err := store.UpdateTag(context.Background(), TagUpdate{Name: "a", Step: &s}); err != nil {
				t.Fatalf("UpdateTag: %v", err)
			}
		}
	}
	refresh := func() {
		if err := g.refresh(context.Background()); err != nil {
			t.Fatalf("refresh: %v", err)
		}
	}
	for i, tc := range []struct {
		before  []func()
		elapsed time.Duration
		want    int64
	}{
		{nil, time.Minute, 200},
		{nil, time.Minute, 400},
		{nil, time.Minute, 800},
		{nil, time.Minute, 800}, // 1600 would pass MaxStep
		{nil, 20 * time.Minute, 800},
		{nil, 30 * time.Minute, 400},
		{nil, 45 * time.Minute, 200},
		{nil, 45 * time.Minute, 100},
		{nil, 45 * time.Minute, 100}, // never below the stored step
		{[]func(){setStep(300), refresh}, 45 * time.Minute, 300},
		{[]func(){setStep(500)}, 45 * time.Minute, 300}, // no refresh: this load reads 500...
		{nil, 45 * time.Minute, 500},                    // ...and the next one obeys it
		{nil, time.Minute, 1000},
		{[]func(){setStep(50), refresh}, time.Hour, 500},
		{nil, time.Hour, 250},
		{nil, time.Hour, 125},
		{nil, time.Hour, 62},
		{nil, time.Hour, 62},
	} {
		for _, f := range tc.before {
			f()
		}
		clock.Add(tc.elapsed)
		loads := g.Stats().Loads
		before, _ := lastAsked()
		for n := 0; ; n++ {
			if got, _ := lastAsked(); got > before {
				break
			}
			if n > 5000 {
				t.Fatalf("load %d: no store call after %d IDs", i+2, n)
			}
			fill(t, g, "a", 1)
		}
		waitFor(t, "the load to be installed", func() bool { return g.Stats().Loads > loads })
		if _, step := lastAsked(); step != tc.want {
			t.Fatalf("load %d (%v after the previous) asked for step %d, want %d", i+2, tc.elapsed, step, tc.want)
		}
	}
}

// TestIDsArePositive: rows with a max_id below their step (a hand-inserted 0, or a
// negative value) give clipped or empty segments, never an ID below 1; a row at the top
// of int64 gives its last IDs and then ErrUnavailable wrapping ErrMaxIDOverflow.
func TestIDsArePositive(t *testing.T) {
	store := NewInmemStore()
	store.put(Tag{Name: "zero", MaxID: 0, Step: 10})
	store.put(Tag{Name: "negative", MaxID: -25, Step: 10})
	store.put(Tag{Name: "top", MaxID: 1<<63 - 16, Step: 10})
	cfg := testConfig(t, store)
	cfg.MaxStep = 10
	cfg.WaitMax = 300 * time.Millisecond
	g, _ := startGenerator(t, cfg)

	for _, tag := range []string{"zero", "negative"} {
		for want := int64(1); want <= 30; want++ {
			if got := fill(t, g, tag, 1)[0]; got != want {
				t.Fatalf("%s: ID #%d = %d, want %d", tag, want, got, want)
			}
		}
	}
	got := fill(t, g, "top", 10)
	for i, id := range got {
		if want := int64(1<<63-16) + int64(i); id != want {
			t.Fatalf("top: IDs %v, want %d..%d", got, int64(1<<63-16), int64(1<<63-7))
		}
	}
	err := g.Fill(context.Background(), "top", make([]int64, 1))
	if !errors.Is(err, ErrUnavailable) || !errors.Is(err, ErrMaxIDOverflow) {
		t.Fatalf("Fill past int64 = %v, want ErrUnavailable wrapping ErrMaxIDOverflow", err)
	}
}

// TestLookupCoalesced: many concurrent requests for a tag that is not in the tag list
// cause one store call, whose answer they all get.
func TestLookupCoalesced(t *testing.T) {
	for _, tc := range []struct {
		name    string
		exists  bool
		wantErr error
	}{
		{"OK", true, nil},
		{"ErrTagNotFound", false, ErrTagNotFound},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store := newHookStore()
			release := make(chan struct{})
			var lateTakes atomic.Int64
			store.TakeFn = func(ctx context.Context, tag string, step int64) (Tag, error) {
				lateTakes.Add(1)
				select {
				case <-release:
				case <-ctx.Done():
					return Tag{}, ctx.Err()
				}
				return store.inner.Take(ctx, tag, step)
			}
			// The lookup reads the row first (the spelling check): held the same way.
			var lateReads atomic.Int64
			store.TagFn = func(ctx context.Context, tag string) (Tag, error) {
				lateReads.Add(1)
				select {
				case <-release:
				case <-ctx.Done():
					return Tag{}, ctx.Err()
				}
				return store.inner.Tag(ctx, tag)
			}
			cfg := testConfig(t, store)
			cfg.RefreshInterval = time.Hour
			g, _ := startGenerator(t, cfg)
			if tc.exists {
				mustAdd(t, store, Tag{Name: "late", Step: 1000}) // after the tag list was read
			}
			const requests = 20
			errs := make(chan error, requests)
			ids := make(chan int64, requests)
			for range requests {
				go func() {
					dst := make([]int64, 1)
					err := g.Fill(context.Background(), "late", dst)
					if err == nil {
						ids <- dst[0]
					}
					errs <- err
				}()
			}
			waitFor(t, "every request to wait on the one lookup", func() bool {
				g.mu.Lock()
				defer g.mu.Unlock()
				b := g.pending["late"]
				if b == nil {
					return false
				}
				b.mu.Lock()
				defer b.mu.Unlock()
				return b.waiters == requests
			})
			close(release)
			seen := make(map[int64]bool)
			for range requests {
				select {
				case err := <-errs:
					if !errors.Is(err, tc.wantErr) || (tc.wantErr == nil && err != nil) {
						t.Fatalf("Fill = %v, want %v", err, tc.wantErr)
					}
				case <-time.After(10 * time.Second):
					t.Fatal("a request did not return within 10s")
				}
			}
			close(ids)
			for id := range ids {
				if seen[id] || id < 1 || id > requests {
					t.Fatalf("ID %d repeated or out of 1..%d", id, requests)
				}
				seen[id] = true
			}
			wantTakes := int64(0)
			if tc.exists {
				wantTakes = 1
			}
			if reads, takes := lateReads.Load(), lateTakes.Load(); reads != 1 || takes != wantTakes {
				t.Fatalf("%d reads and %d takes of the store for %d concurrent requests, want 1 and %d", reads, takes, requests, wantTakes)
			}
			if st := g.Stats(); st.Lookups != 1 || st.Pending != 0 {
				t.Fatalf("stats %+v, want 1 lookup and none pending", st)
			}
		})
	}
}

// TestNewTagServedAtOnce: a missing tag is not remembered as missing, so one added by
// anyone is served on the next request, not after the refresh.
func TestNewTagServedAtOnce(t *testing.T) {
	store := NewInmemStore()
	cfg := testConfig(t, store)
	cfg.RefreshInterval = time.Hour
	g, _ := startGenerator(t, cfg)
	dst := make([]int64, 2)
	if err := g.Fill(context.Background(), "fresh", dst); !errors.Is(err, ErrTagNotFound) {
		t.Fatalf("Fill(missing) = %v, want ErrTagNotFound", err)
	}
	mustAdd(t, store, Tag{Name: "fresh", Step: 10})
	if err := g.Fill(context.Background(), "fresh", dst); err != nil || dst[0] != 1 || dst[1] != 2 {
		t.Fatalf("Fill after AddTag = %v, %v; want 1 2", err, dst)
	}
	// The load answers its waiters before it moves the buffer into the map.
	waitFor(t, "the looked-up tag resident", func() bool { return g.bufferOf("fresh") != nil })
	if ok, err := g.TryFill("fresh", dst); !ok || err != nil || dst[0] != 3 {
		t.Fatalf("TryFill after the lookup = %v, %v, %v; want 3 4", ok, err, dst)
	}
}

// TestSpentTagStoreDown: a tag whose both segments are spent while its store calls fail
// or hang waits at most WaitMax, fails with ErrUnavailable, does not hold up other tags,
// and recovers by itself once the store answers again.
func TestSpentTagStoreDown(t *testing.T) {
	const (
		up = iota
		failing
		hanging
	)
	for _, tc := range []struct {
		name      string
		mode      int32
		wantCause error
	}{
		{"Failing", failing, errBoom},
		{"Hanging", hanging, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			store := newHookStore()
			var mode atomic.Int32
			store.TakeFn = func(ctx context.Context, tag string, step int64) (Tag, error) {
				if tag == "a" {
					switch mode.Load() {
					case failing:
						return Tag{}, errBoom
					case hanging:
						<-ctx.Done()
						return Tag{}, ctx.Err()
					}
				}
				return store.inner.Take(ctx, tag, step)
			}
			mustAdd(t, store, Tag{Name: "a", Step: 5}, Tag{Name: "b", Step: 5})
			cfg := testConfig(t, store)
			cfg.MaxStep = 5
			cfg.WaitMax = 200 * time.Millisecond
			cfg.LoadTimeout = 500 * time.Millisecond
			g, _ := startGenerator(t, cfg)

			fill(t, g, "a", 1) // loads [1,6) and, past 10% of it, [6,11)
			waitFor(t, "the second segment", func() bool { return g.Stats().Loads == 2 })
			mode.Store(tc.mode)
			if got := fill(t, g, "a", 9); got[0] != 2 || got[8] != 10 {
				t.Fatalf("Fill(a, 9) = %v, want 2..10 from memory", got)
			}

			errc := make(chan error, 1)
			go func() { errc <- g.Fill(context.Background(), "a", make([]int64, 1)) }()
			// Meanwhile, other tags are served.
			for i := range 30 {
				fill(t, g, "b", 1+i%3)
			}
			select {
			case err := <-errc:
				if !errors.Is(err, ErrUnavailable) {
					t.Fatalf("Fill(spent a) = %v, want ErrUnavailable", err)
				}
				if tc.wantCause != nil && !errors.Is(err, tc.wantCause) {
					t.Fatalf("Fill(spent a) = %v, want it to wrap %v", err, tc.wantCause)
				}
			case <-time.After(10 * time.Second):
				t.Fatal("Fill on a spent tag did not give up within 10s")
			}
			if ok, err := g.TryFill("a", make([]int64, 1)); ok || err != nil {
				t.Fatalf("TryFill(spent a) = %v, %v; want false, nil", ok, err)
			}

			mode.Store(up)
			dst := make([]int64, 1)
			waitFor(t, "a to recover", func() bool {
				return g.Fill(context.Background(), "a", dst) == nil
			})
			if dst[0] < 11 {
				t.Fatalf("ID after recovery = %d, want a new segment (>= 11)", dst[0])
			}
			if st := g.Stats(); st.LoadErrors == 0 || st.WaitTimeouts == 0 || st.Waits == 0 {
				t.Fatalf("stats %+v, want load errors, waits and wait time-outs counted", st)
			}
		})
	}
}

// TestNoDuplicates hammers many tags from many goroutines, mixing TryFill and Fill and
// batch sizes, over a store that is slow and sometimes fails, while the tag list is
// refreshed and admins change steps: every ID is handed out once, every batch strictly
// increases, and no ID is below 1.
func TestNoDuplicates(t *testing.T) {
	store := newHookStore()
	store.TakeFn = func(ctx context.Context, tag string, step int64) (Tag, error) {
		if rand.IntN(4) == 0 {
			timer := time.NewTimer(time.Duration(rand.IntN(3000)) * time.Microsecond)
			select {
			case <-timer.C:
			case <-ctx.Done():
				timer.Stop()
				return Tag{}, ctx.Err()
			}
		}
		if rand.IntN(10) == 0 {
			return Tag{}, errBoom
		}
		return store.inner.Take(ctx, tag, step)
	}
	const tags = 12
	for i := range tags {
		mustAdd(t, store, Tag{Name: fmt.Sprintf("t%d", i), Step: int64(1 + i*3)})
	}
	cfg := testConfig(t, store)
	cfg.MaxStep = 64 // keep segments short: many loads and switches
	cfg.RefreshInterval = 3 * time.Millisecond
	cfg.WaitMax = 10 * time.Second
	g, _ := startGenerator(t, cfg)

	type batch struct {
		tag string
		ids []int64
	}
	const workers, requests = 12, 400
	results := make([][]batch, workers)
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for r := range requests {
				tag := fmt.Sprintf("t%d", rand.IntN(tags))
				dst := make([]int64, 1+rand.IntN(40))
				if r%2 == 0 {
					if ok, err := g.TryFill(tag, dst); err != nil {
						t.Errorf("TryFill(%s): %v", tag, err)
						return
					} else if ok {
						results[w] = append(results[w], batch{tag, dst})
						continue
					}
					dst = make([]int64, len(dst)) // what TryFill left is no good
				}
				if err := g.Fill(context.Background(), tag, dst); err != nil {
					t.Errorf("Fill(%s, %d): %v", tag, len(dst), err)
					return
				}
				results[w] = append(results[w], batch{tag, dst})
			}
		})
	}
	// An admin changes steps while the workers run.
	for i := range 20 {
		step := int64(1 + rand.IntN(100))
		if _, err := store.UpdateTag(context.Background(), TagUpdate{Name: fmt.Sprintf("t%d", i%tags), Step: &step}); err != nil {
			t.Fatalf("UpdateTag: %v", err)
		}
		time.Sleep(time.Millisecond)
	}
	wg.Wait()

	type key struct {
		tag string
		id  int64
	}
	seen := make(map[key]bool)
	for _, rs := range results {
		for _, b := range rs {
			for i, id := range b.ids {
				if id < 1 {
					t.Fatalf("%s batch %v holds an ID below 1", b.tag, b.ids)
				}
				if i > 0 && id <= b.ids[i-1] {
					t.Fatalf("%s batch %v is not strictly increasing", b.tag, b.ids)
				}
				if seen[key{b.tag, id}] {
					t.Fatalf("%s ID %d handed out twice", b.tag, id)
				}
				seen[key{b.tag, id}] = true
			}
		}
	}
	st := g.Stats()
	t.Logf("%d IDs, stats %+v", len(seen), st)
	if st.LoadErrors == 0 || st.Refreshes < 2 {
		t.Fatalf("stats %+v: the test did not exercise failing loads and refreshes", st)
	}
}

// TestRestartNeverRepeats: a new Generator on the same store, after an old one stopped
// (with a preloaded segment it never used) or beside a running one, never repeats an
// ID of the other.
func TestRestartNeverRepeats(t *testing.T) {
	store := NewInmemStore()
	mustAdd(t, store, Tag{Name: "a", Step: 50})
	seen := make(map[int64]string)
	take := func(name string, g *Generator, n int) {
		t.Helper()
		for range n {
			for _, id := range fill(t, g, "a", 3) {
				if prev, dup := seen[id]; dup {
					t.Fatalf("ID %d from %s was already handed out by %s", id, name, prev)
				}
				seen[id] = name
			}
		}
	}
	first, stopFirst := startGenerator(t, testConfig(t, store))
	take("first", first, 10) // 30 IDs: the next segment is preloaded, unused
	stopFirst()
	second, _ := startGenerator(t, testConfig(t, store))
	take("second", second, 10)
	third, _ := startGenerator(t, testConfig(t, store))
	for range 20 {
		take("second", second, 3)
		take("third", third, 2)
	}
}

// TestRunStopsEverything: Run returns only after its loaders returned, even one stuck in
// a store call, and requests waiting or arriving afterwards get ErrUnavailable.
func TestRunStopsEverything(t *testing.T) {
	store := newHookStore()
	var inside, returned atomic.Int32
	store.TakeFn = func(ctx context.Context, tag string, step int64) (Tag, error) {
		if tag == "stuck" {
			inside.Add(1)
			<-ctx.Done()
			returned.Add(1)
			return Tag{}, ctx.Err()
		}
		return store.inner.Take(ctx, tag, step)
	}
	mustAdd(t, store, Tag{Name: "stuck", Step: 5}, Tag{Name: "fine", Step: 5})
	cfg := testConfig(t, store)
	cfg.LoadTimeout = time.Hour
	cfg.WaitMax = time.Hour
	g, stop := startGenerator(t, cfg)
	fill(t, g, "fine", 1)
	errc := make(chan error, 1)
	go func() { errc <- g.Fill(context.Background(), "stuck", make([]int64, 1)) }()
	waitFor(t, "the stuck load", func() bool { return inside.Load() == 1 })
	stop()
	if returned.Load() != 1 {
		t.Fatal("Run returned while a loader was still inside the store")
	}
	select {
	case err := <-errc:
		if !errors.Is(err, ErrUnavailable) {
			t.Fatalf("waiting Fill at stop = %v, want ErrUnavailable", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a waiting Fill did not return at stop")
	}
	if _, err := g.TryFill("fine", make([]int64, 1)); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("TryFill after stop = %v, want ErrUnavailable", err)
	}
	if err := g.Run(context.Background()); err == nil {
		t.Fatal("a second Run succeeded")
	}
}

// TestNotReadyUntilTagList: while the first tag list cannot be read the generator answers
// ErrUnavailable; it keeps trying and becomes ready by itself.
func TestNotReadyUntilTagList(t *testing.T) {
	store := newHookStore()
	mustAdd(t, store, Tag{Name: "a", Step: 5})
	var down atomic.Bool
	down.Store(true)
	var calls atomic.Int32
	store.TagsFn = func(ctx context.Context) ([]Tag, error) {
		calls.Add(1)
		if down.Load() {
			return nil, errBoom
		}
		return store.inner.Tags(ctx)
	}
	g, err := New(testConfig(t, store))
	if err != nil {
		t.Fatal(err)
	}
	runGenerator(t, g)
	waitFor(t, "two failed tag list loads", func() bool { return calls.Load() >= 2 })
	select {
	case <-g.Ready():
		t.Fatal("Ready closed without a tag list")
	default:
	}
	if err := g.Fill(context.Background(), "a", make([]int64, 1)); !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), "starting") {
		t.Fatalf("Fill while starting = %v, want ErrUnavailable (starting)", err)
	}
	down.Store(false)
	select {
	case <-g.Ready():
	case <-time.After(10 * time.Second):
		t.Fatal("not ready 10s after the store came back")
	}
	if got := fill(t, g, "a", 2); got[0] != 1 {
		t.Fatalf("Fill after ready = %v", got)
	}
	if st := g.Stats(); !st.Ready || st.RefreshErrors < 2 || st.LastError == "" {
		t.Fatalf("stats %+v: want ready, refresh errors and the last error", st)
	}
}

// TestRefresh: the periodic tag list load adds new tags and drops deleted ones.
func TestRefresh(t *testing.T) {
	store := NewInmemStore()
	mustAdd(t, store, Tag{Name: "a", Step: 5})
	cfg := testConfig(t, store)
	cfg.RefreshInterval = 5 * time.Millisecond
	g, _ := startGenerator(t, cfg)
	mustAdd(t, store, Tag{Name: "b", Step: 1000}) // no preload: the refresh must be what drops it
	waitFor(t, "b to be listed", func() bool { return g.bufferOf("b") != nil })
	fill(t, g, "b", 3)
	if st := g.Stats(); st.Tags != 2 || st.Lookups != 0 {
		t.Fatalf("stats %+v: want 2 tags and no lookups", st)
	}
	store.remove("b")
	waitFor(t, "b to be dropped", func() bool { return g.bufferOf("b") == nil })
	if err := g.Fill(context.Background(), "b", make([]int64, 1)); !errors.Is(err, ErrTagNotFound) {
		t.Fatalf("Fill(deleted) = %v, want ErrTagNotFound", err)
	}
	if st := g.Stats(); st.DroppedTags != 1 || st.Tags != 1 {
		t.Fatalf("stats %+v: want 1 dropped, 1 tag", st)
	}
}

// TestRefreshKeepsTagFoundMeanwhile: a tag looked up while a refresh was reading an older
// tag list is not dropped by that refresh.
func TestRefreshKeepsTagFoundMeanwhile(t *testing.T) {
	store := newHookStore()
	var calls atomic.Int32
	entered, hold := make(chan []Tag, 1), make(chan struct{})
	store.TagsFn = func(ctx context.Context) ([]Tag, error) {
		list, err := store.inner.Tags(ctx)
		if calls.Add(1) == 2 {
			entered <- list
			select {
			case <-hold:
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		return list, err
	}
	mustAdd(t, store, Tag{Name: "a", Step: 5})
	cfg := testConfig(t, store)
	cfg.RefreshInterval = 5 * time.Millisecond
	g, _ := startGenerator(t, cfg)
	select {
	case <-entered:
	case <-time.After(10 * time.Second):
		t.Fatal("no second refresh")
	}
	mustAdd(t, store, Tag{Name: "late", Step: 5})
	fill(t, g, "late", 1) // looked up and made resident
	refreshes := g.Stats().Refreshes
	close(hold)
	waitFor(t, "the held refresh to finish", func() bool { return g.Stats().Refreshes > refreshes })
	if g.bufferOf("late") == nil {
		t.Fatal("the refresh that read the list before late existed dropped it")
	}
	if got := fill(t, g, "late", 1)[0]; got != 2 {
		t.Fatalf("next ID of late = %d, want 2 from the same buffer", got)
	}
}
