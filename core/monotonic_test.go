package core

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/leafbus/leafbus/internal/testutil"
	"github.com/leafbus/leafbus/segment"
	"github.com/leafbus/leafbus/snowflake"
	"github.com/leafbus/leafbus/wire"
)

// fakeMonotonic marks tags in memory and hands out IDs from 7000 up: from TryFill when
// inMemory, else from Fill.
type fakeMonotonic struct {
	mu       sync.Mutex
	marks    map[string]bool
	next     int64
	inMemory bool
	notReady bool
	fillErr  error // Fill's answer, when set
	fills    int
	ready    chan struct{} // Ready; nil: loaded, or stopped (a 503 at once)
}

func (f *fakeMonotonic) Ready() <-chan struct{} {
	if f.ready == nil {
		closed := make(chan struct{})
		close(closed)
		return closed
	}
	return f.ready
}

func (f *fakeMonotonic) IsMonotonic(tag string) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.notReady {
		return false, fmt.Errorf("%w: marks not loaded", wire.ErrUnavailable)
	}
	if tag == "ORDERED" {
		return false, wire.BadRequest("differs only in case from %q", "ordered")
	}
	return f.marks[tag], nil
}

func (f *fakeMonotonic) take(dst []int64) {
	for i := range dst {
		dst[i] = 7000 + f.next
		f.next++
	}
}

func (f *fakeMonotonic) TryFill(_ string, dst []int64) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.inMemory {
		return false, nil
	}
	f.take(dst)
	return true, nil
}

func (f *fakeMonotonic) Fill(_ context.Context, _ string, dst []int64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fills++
	if f.fillErr != nil {
		return f.fillErr
	}
	f.take(dst)
	return nil
}

func (f *fakeMonotonic) SetMonotonic(_ context.Context, tag string, on bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.marks[tag] = on
	return nil
}

func (f *fakeMonotonic) MonotonicTags(context.Context) (map[string]bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string]bool{}
	for k, v := range f.marks {
		if v {
			out[k] = true
		}
	}
	return out, nil
}

// everyBatch has a ready batch (IDs 1..n) for any request.
type everyBatch struct{}

func (everyBatch) Take(_ wire.Kind, _ string, n int, enc wire.Encoding) ([]byte, bool) {
	ids := make([]int64, n)
	for i := range ids {
		ids[i] = int64(i + 1)
	}
	return wire.AppendIDs(nil, ids, enc), true
}

// fixedSegments hands out 100, 101, ... for any tag, in memory.
type fixedSegments struct{}

func (fixedSegments) TryFill(_ string, dst []int64) (bool, error) {
	for i := range dst {
		dst[i] = int64(100 + i)
	}
	return true, nil
}
func (s fixedSegments) Fill(_ context.Context, tag string, dst []int64) error {
	_, err := s.TryFill(tag, dst)
	return err
}

// get answers r through Take and, when it must wait, Wait: Get's way, with the IDs
// copied out of the core's slice.
func get(t *testing.T, c *Core, r Request) ([]int64, error) {
	t.Helper()
	a := c.Get(context.Background(), r, make([]int64, r.Count))
	defer a.Release()
	if a.Err != nil {
		return nil, a.Err
	}
	if a.Reply != nil {
		ids, err := wire.DecodeIDs(nil, a.Reply, r.Encoding)
		if err != nil {
			t.Fatalf("ready-made reply %q: %v", a.Reply, err)
		}
		return ids, nil
	}
	return slices.Clone(a.IDs), nil
}

func newCore(t *testing.T, set func(*Config)) *Core {
	t.Helper()
	cfg := DefaultConfig()
	set(&cfg)
	c, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)
	return c
}

func segReq(tag string, n int) Request {
	return Request{Kind: wire.Segment, Tag: tag, Count: n}
}

// TestMonotonicRouting: a monotonic tag is served by Monotonic only, never by a pool
// or the ordinary segments; an ordinary tag is served as before; the answer of
// IsMonotonic is the answer to every segment request while it fails; snowflake
// requests do not depend on the marks.
func TestMonotonicRouting(t *testing.T) {
	mono := &fakeMonotonic{marks: map[string]bool{"ordered": true}}
	sfs, err := snowflake.New(snowflake.Config{WorkerID: 1})
	if err != nil {
		t.Fatal(err)
	}
	c := newCore(t, func(cfg *Config) {
		cfg.Segments, cfg.Snowflakes, cfg.Batches, cfg.Monotonic = fixedSegments{}, sfs, everyBatch{}, mono
	})
	unavailable := fmt.Errorf("%w: no leader", wire.ErrUnavailable)
	for _, tt := range []struct {
		name     string
		r        Request
		inMemory bool
		notReady bool
		fillErr  error
		want     []int64
		wantCode int
	}{
		{"OrdinaryFromPool", segReq("orders", 2), true, false, nil, []int64{1, 2}, 0},
		{"MonotonicInMemory", segReq("ordered", 2), true, false, nil, []int64{7000, 7001}, 0},
		{"MonotonicWaits", segReq("ordered", 2), false, false, nil, []int64{7002, 7003}, 0},
		{"ErrMonotonicWaits", segReq("ordered", 2), false, false, unavailable, nil, 503},
		{"ErrCaseFold", segReq("ORDERED", 2), true, false, nil, nil, 400},
		{"ErrNotReady", segReq("orders", 2), true, true, nil, nil, 503},
		{"SnowflakeWhileNotReady", Request{Kind: wire.Snowflake, Tag: "orders", Count: 2}, true, true, nil, nil, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			mono.mu.Lock()
			mono.inMemory, mono.notReady, mono.fillErr = tt.inMemory, tt.notReady, tt.fillErr
			mono.mu.Unlock()
			got, err := get(t, c, tt.r)
			if code := codeOrZero(err); code != tt.wantCode {
				t.Fatalf("%+v: %v, code %d; want code %d", tt.r, err, code, tt.wantCode)
			}
			if tt.want != nil && !slices.Equal(got, tt.want) {
				t.Fatalf("%+v = %v, want %v", tt.r, got, tt.want)
			}
			if tt.r.Kind == wire.Snowflake && len(got) != 2 {
				t.Fatalf("%+v = %v, want 2 snowflake IDs", tt.r, got)
			}
		})
	}
	if mono.fills != 2 {
		t.Fatalf("Monotonic.Fill called %d times, want twice (the requests not in memory)", mono.fills)
	}
}

// TestMonotonicWaitsForMarks: segment requests that come while the marks load (a
// dispenser just started) wait for them and are answered once they are in: from
// Monotonic for a monotonic tag, from the pool or buffers for the others. A request
// whose wait runs out first gets a 503 that says why.
func TestMonotonicWaitsForMarks(t *testing.T) {
	mono := &fakeMonotonic{marks: map[string]bool{"ordered": true}, notReady: true, ready: make(chan struct{})}
	c := newCore(t, func(cfg *Config) {
		cfg.Segments, cfg.Batches, cfg.Monotonic = fixedSegments{}, everyBatch{}, mono
	})
	if _, ok := c.Take(segReq("orders", 2), make([]int64, 2)); ok {
		t.Fatal("Take answered a segment request while the marks load; want it to wait")
	}
	type answer struct {
		ids []int64
		err error
	}
	answers := map[string]chan answer{"orders": make(chan answer, 1), "ordered": make(chan answer, 1)}
	for tag, ch := range answers {
		err := c.Wait(segReq(tag, 2), func(a Answer) {
			defer a.Release()
			ch <- answer{slices.Clone(a.IDs), a.Err}
		})
		if err != nil {
			t.Fatalf("Wait(%s): %v", tag, err)
		}
	}
	testutil.Eventually(t, 5*time.Second, "both requests waiting", func() bool { return c.Stats(wire.Segment).Waited == 2 })
	mono.mu.Lock()
	mono.notReady = false
	close(mono.ready)
	mono.mu.Unlock()
	for tag, want := range map[string][]int64{"orders": {100, 101}, "ordered": {7000, 7001}} {
		select {
		case a := <-answers[tag]:
			if a.err != nil || !slices.Equal(a.ids, want) {
				t.Errorf("request for %s while the marks load = %v, %v; want %v once they are in", tag, a.ids, a.err, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("request for %s: no answer within 10s", tag)
		}
	}

	never := &fakeMonotonic{marks: map[string]bool{}, notReady: true, ready: make(chan struct{})}
	c = newCore(t, func(cfg *Config) {
		cfg.Segments, cfg.Monotonic, cfg.WaitMax = fixedSegments{}, never, 50*time.Millisecond
	})
	_, err := get(t, c, segReq("orders", 1))
	if code := codeOrZero(err); code != 503 || !strings.Contains(err.Error(), "marks did not load") {
		t.Fatalf("a request whose wait for the marks runs out = %v (code %d); want a 503 naming the marks", err, code)
	}
}

// TestMonotonicAdmin: add, update and list carry the mark; an update may change only
// the mark; a core without monotonic tags refuses to set it.
func TestMonotonicAdmin(t *testing.T) {
	ctx := context.Background()
	store := segment.NewInmemStore()
	mono := &fakeMonotonic{marks: map[string]bool{"stale": true}}
	c := newCore(t, func(cfg *Config) { cfg.Tags, cfg.Monotonic = store, mono })
	off := newCore(t, func(cfg *Config) { cfg.Tags = store })
	step := func(n int64) *int64 { return &n }
	flag := func(b bool) *bool { return &b }
	add := func(c *Core, r wire.AddTagRequest) (wire.TagInfo, error) { return c.AddTag(ctx, r) }
	update := func(c *Core, r wire.UpdateTagRequest) (wire.TagInfo, error) { return c.UpdateTag(ctx, r) }
	for _, tt := range []struct {
		name    string
		call    func() (wire.TagInfo, error)
		want    bool // the reply's monotonic
		wantErr int
	}{
		{"AddOK", func() (wire.TagInfo, error) {
			return add(c, wire.AddTagRequest{Tag: "ordered", Step: step(10), Monotonic: flag(true)})
		}, true, 0},
		{"AddStaleMarkCleared", func() (wire.TagInfo, error) { return add(c, wire.AddTagRequest{Tag: "stale", Step: step(10)}) }, false, 0},
		{"AddErrOff", func() (wire.TagInfo, error) {
			return add(off, wire.AddTagRequest{Tag: "x", Step: step(10), Monotonic: flag(true)})
		}, false, 503},
		{"AddOffFalseOK", func() (wire.TagInfo, error) {
			return add(off, wire.AddTagRequest{Tag: "y", Step: step(10), Monotonic: flag(false)})
		}, false, 0},
		{"UpdateOnlyMark", func() (wire.TagInfo, error) {
			return update(c, wire.UpdateTagRequest{Tag: "stale", Monotonic: flag(true)})
		}, true, 0},
		{"UpdateStepKeepsMark", func() (wire.TagInfo, error) { return update(c, wire.UpdateTagRequest{Tag: "stale", Step: step(20)}) }, true, 0},
		{"UpdateClears", func() (wire.TagInfo, error) {
			return update(c, wire.UpdateTagRequest{Tag: "ordered", Monotonic: flag(false)})
		}, false, 0},
		{"UpdateErrMissing", func() (wire.TagInfo, error) {
			return update(c, wire.UpdateTagRequest{Tag: "nope", Monotonic: flag(true)})
		}, false, 404},
		{"UpdateErrOff", func() (wire.TagInfo, error) {
			return update(off, wire.UpdateTagRequest{Tag: "stale", Monotonic: flag(true)})
		}, false, 503},
		// A tag of any of Leaf's names is marked like any other (package monotonic keys
		// its marks and leases by the tag's KV key).
		{"AddLeafTagMonotonic", func() (wire.TagInfo, error) {
			return add(c, wire.AddTagRequest{Tag: "com.acme.order", Step: step(10), Monotonic: flag(true)})
		}, true, 0},
		{"AddLeafTag", func() (wire.TagInfo, error) {
			return add(c, wire.AddTagRequest{Tag: "order:create 订单", Step: step(10), Monotonic: flag(false)})
		}, false, 0},
		{"UpdateLeafTagMonotonic", func() (wire.TagInfo, error) {
			return update(c, wire.UpdateTagRequest{Tag: "order:create 订单", Monotonic: flag(true)})
		}, true, 0},
		{"UpdateLeafTag", func() (wire.TagInfo, error) {
			return update(c, wire.UpdateTagRequest{Tag: "order:create 订单", Step: step(20), Monotonic: flag(false)})
		}, false, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			info, err := tt.call()
			if code := codeOrZero(err); code != tt.wantErr {
				t.Fatalf("%v, %v; want code %d", info, err, tt.wantErr)
			}
			if err == nil && info.Monotonic != tt.want {
				t.Fatalf("%+v, want monotonic %v", info, tt.want)
			}
		})
	}
	list, err := c.ListTags(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, info := range list {
		got[info.Tag] = info.Monotonic
	}
	if want := map[string]bool{"ordered": false, "com.acme.order": true, "order:create 订单": false, "stale": true, "y": false}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("list = %v, want %v", got, want)
	}
	if mono.marks["nope"] {
		t.Fatal("the update of a missing tag wrote its mark")
	}
}

func codeOrZero(err error) int {
	if err == nil {
		return 0
	}
	code, _ := CodeOf(err)
	return code
}
