package segment

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestTagStats: the figures of one tag follow its loads: the current and next segment,
// the step, IDs issued, loads, failed store calls with their last error (cleared by the
// next success), and the time spent in the store.
func TestTagStats(t *testing.T) {
	store := newHookStore()
	var failing atomic.Bool
	store.TakeFn = func(ctx context.Context, tag string, step int64) (Tag, error) {
		if failing.Load() {
			return Tag{}, errBoom
		}
		time.Sleep(time.Millisecond) // a store call takes time
		return store.inner.Take(ctx, tag, step)
	}
	mustAdd(t, store, Tag{Name: "b", Step: 10}, Tag{Name: "a", Step: 10})
	cfg := testConfig(t, store)
	cfg.MaxStep = 10
	g, _ := startGenerator(t, cfg)

	if got := g.TagStats(); len(got) != 2 || got[0].Tag != "a" || got[1].Tag != "b" || got[0].Loads != 0 || got[0].NextReady {
		t.Fatalf("TagStats before any request = %+v, want a and b, sorted, nothing loaded", got)
	}
	fill(t, g, "a", 3) // [1,11), and past 10% of it [11,21) is loaded ahead
	waitFor(t, "the next segment of a", func() bool { return g.TagStats()[0].NextReady })
	a := g.TagStats()[0]
	want := TagStats{
		Tag: "a", Current: Window{Value: 4, Max: 11, Step: 10}, Next: Window{Value: 11, Max: 21, Step: 10},
		NextReady: true, Step: 10, Issued: 3, Loads: 2,
	}
	if a.Tag != want.Tag || a.Current != want.Current || a.Next != want.Next || a.NextReady != want.NextReady ||
		a.Step != want.Step || a.Issued != want.Issued || a.Loads != want.Loads || a.LoadErrors != 0 || a.LastError != "" {
		t.Fatalf("TagStats()[a] = %+v\nwant %+v", a, want)
	}
	if a.LoadTime < 2*time.Millisecond || a.LastLoad.IsZero() {
		t.Errorf("TagStats()[a]: LoadTime %v, LastLoad %v; want at least two store calls of 1ms, and a time", a.LoadTime, a.LastLoad)
	}

	failing.Store(true)
	fill(t, g, "a", 9) // spends [1,11) and takes 11 and 12 of [11,21): its next load fails
	waitFor(t, "a failed load", func() bool { return g.TagStats()[0].LoadErrors > 0 })
	a = g.TagStats()[0]
	if !strings.Contains(a.LastError, errBoom.Error()) || a.NextReady || a.Current.Value != 13 || a.Issued != 12 {
		t.Fatalf("TagStats()[a] while the store fails = %+v, want the error, no next segment, current at 13, 12 issued", a)
	}
	failing.Store(false)
	waitFor(t, "a loads again", func() bool { return g.TagStats()[0].NextReady })
	if a = g.TagStats()[0]; a.LastError != "" || a.Loads != 3 {
		t.Fatalf("TagStats()[a] after recovery = %+v, want 3 loads and no error", a)
	}
	if b := g.TagStats()[1]; b.Loads != 0 || b.Issued != 0 {
		t.Errorf("TagStats()[b] = %+v, want untouched", b)
	}
}
