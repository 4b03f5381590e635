package core

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/leafbus/leafbus/internal/testutil"
	"github.com/leafbus/leafbus/segment"
	"github.com/leafbus/leafbus/snowflake"
	"github.com/leafbus/leafbus/wire"
	"github.com/leafbus/leafbus/workerid"
)

// TestWaitBounds: a request that would wait while MaxWaiting already wait is refused at
// once with ErrOverloaded (a 503, counted); one whose source runs out of time gets a 503
// that says how long it waited; one whose source answers in time gets its IDs.
func TestWaitBounds(t *testing.T) {
	src := testutil.NewStalledSegments()
	c := newCore(t, func(cfg *Config) { cfg.Segments, cfg.MaxWaiting, cfg.WaitMax = src, 1, 200*time.Millisecond })
	first := make(chan Answer, 1)
	if err := c.Wait(segReq("orders", 1), func(a Answer) { first <- a }); err != nil {
		t.Fatalf("first Wait: %v", err)
	}
	err := c.Wait(segReq("orders", 1), func(Answer) { t.Error("done called after a refused Wait") })
	if !errors.Is(err, ErrOverloaded) || codeOrZero(err) != 503 {
		t.Fatalf("second Wait with MaxWaiting 1 = %v, want ErrOverloaded (503)", err)
	}
	if a := <-first; codeOrZero(a.Err) != 503 || !strings.Contains(a.Err.Error(), "within 200ms") {
		t.Fatalf("a wait that ran out = %v, want a 503 saying it waited 200ms", a.Err)
	}
	st := c.Stats(wire.Segment)
	if st.Overloaded != 1 || st.Waited != 1 || st.WaitErrors != 1 || !strings.Contains(st.LastUnavailable, "within") {
		t.Fatalf("stats %+v; want 1 overloaded, 1 waited with an error, the last 503's text", st)
	}
	close(src.Release)
	if ids, err := get(t, c, segReq("orders", 3)); err != nil || fmt.Sprint(ids) != "[1 2 3]" {
		t.Fatalf("a wait answered in time = %v, %v; want [1 2 3]", ids, err)
	}
}

// TestGetAbandoned: a caller whose context ends while it waits gets a 503 at once; the
// answer that comes later is dropped (its IDs a gap).
func TestGetAbandoned(t *testing.T) {
	src := testutil.NewStalledSegments()
	c := newCore(t, func(cfg *Config) { cfg.Segments, cfg.WaitMax = src, 5*time.Second })
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	a := c.Get(ctx, segReq("orders", 1), make([]int64, 1))
	if codeOrZero(a.Err) != 503 || !errors.Is(a.Err, context.DeadlineExceeded) {
		t.Fatalf("Get abandoned by its caller = %v, want a 503 wrapping the context's error", a.Err)
	}
	close(src.Release)
}

// TestNoSources: a core without a source answers 503 for its kind, and its admin calls
// 503 without a tag store.
func TestNoSources(t *testing.T) {
	c := newCore(t, func(*Config) {})
	for _, r := range []Request{segReq("orders", 1), sfReq(1)} {
		if _, err := get(t, c, r); codeOrZero(err) != 503 {
			t.Errorf("%v without a source = %v, want a 503", r.Kind, err)
		}
	}
	if err := c.Admin(func(context.Context) { t.Error("admin call ran without a tag store") }); codeOrZero(err) != 503 {
		t.Errorf("Admin without a tag store = %v, want a 503", err)
	}
}

// TestCodeOf: the packages' sentinels and the wire classes map to their codes, the
// first class wins, and anything else is a 500 whose text says nothing.
func TestCodeOf(t *testing.T) {
	for _, tt := range []struct {
		err  error
		want int
	}{
		{wire.BadRequest("count %q", "x"), 400},
		{fmt.Errorf("tag: %w", segment.ErrInvalidTag), 400},
		{snowflake.ErrInvalidID, 400},
		{fmt.Errorf("x: %w", segment.ErrTagNotFound), 404},
		{wire.ErrNotFound, 404},
		{segment.ErrTagExists, 409},
		{segment.ErrStoreWentBack, 503},
		{snowflake.ErrClockBackwards, 503},
		{snowflake.ErrTimestampOverflow, 503},
		{snowflake.ErrCeiling, 503},
		{snowflake.ErrSuspended, 503},
		{workerid.ErrLeaseLost, 503},
		{ErrOverloaded, 503},
		{fmt.Errorf("%w and %w", segment.ErrTagNotFound, wire.ErrUnavailable), 404},
		{errors.New("boom"), 500},
	} {
		code, desc := CodeOf(tt.err)
		if code != tt.want {
			t.Errorf("CodeOf(%v) = %d, want %d", tt.err, code, tt.want)
		}
		if code == 500 && desc != "internal error" {
			t.Errorf("CodeOf(%v) describes a 500 as %q: the wire must not carry internal details", tt.err, desc)
		}
	}
}

// TestTakeAllocatesNothing: a request answered from memory allocates nothing on every
// path Take takes (a pool's reply, a monotonic tag's leader, an ordinary tag's buffers,
// an opaque or narrow tag's shaping, the snowflake generator), since the NATS face calls
// it on its delivery goroutine.
func TestTakeAllocatesNothing(t *testing.T) {
	if testutil.RaceEnabled {
		t.Skip("the race detector allocates")
	}
	sfs, err := snowflake.New(snowflake.Config{WorkerID: 1})
	if err != nil {
		t.Fatal(err)
	}
	pool := readyReply([]byte("1\n2"))
	ranges := &fakeRanges{ranges: map[string]wire.TagRange{"inv": opaque53, "web": capped40}}
	c := newCore(t, func(cfg *Config) {
		cfg.Segments, cfg.Snowflakes, cfg.Batches = fixedSegments{}, sfs, pool
		cfg.Monotonic = &fakeMonotonic{marks: map[string]bool{"ordered": true}, inMemory: true}
		cfg.Shaper, cfg.TagRanges = newShaper(t, ranges, testKey), ranges
	})
	dst := make([]int64, 100)
	for _, r := range []Request{segReq("orders", 10), segReq("ordered", 10), sfReq(10), segReq("pooled", 2),
		segReq("inv", 10), segReq("inv", 100), segReq("web", 10)} {
		if n := testing.AllocsPerRun(1000, func() {
			if a, ok := c.Take(r, dst[:r.Count]); !ok || a.Err != nil {
				t.Fatalf("Take(%+v) = %+v, %v", r, a, ok)
			}
		}); n != 0 {
			t.Errorf("Take(%+v): %v allocations, want 0", r, n)
		}
	}
}

// readyReply has a ready-made reply for tag "pooled" only.
type readyReply []byte

func (p readyReply) Take(_ wire.Kind, tag string, _ int, _ wire.Encoding) ([]byte, bool) {
	return p, tag == "pooled"
}
