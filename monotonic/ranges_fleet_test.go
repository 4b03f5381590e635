package monotonic

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/leafbus/leafbus/internal/durable"
	"github.com/leafbus/leafbus/internal/testutil"
	"github.com/leafbus/leafbus/wire"
)

const testFingerprint = "f412d2d97e6120bb37a45c97"

// optsBucket opens e's <prefix>_tagopts from a connection of the test's own.
func optsBucket(t testing.TB, e *env) (jetstream.JetStream, jetstream.KeyValue) {
	t.Helper()
	js, err := jetstream.New(e.connect(e.urls, "test"))
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(context.Background(), e.prefix+"_tagopts")
	if err != nil {
		t.Fatal(err)
	}
	return js, kv
}

// valueOf reads tag's value in kv; ok=false when it has none.
func valueOf(t testing.TB, kv jetstream.KeyValue, tag string) (tagOptions, bool) {
	t.Helper()
	e, err := kv.Get(context.Background(), tag)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return tagOptions{}, false
	}
	if err != nil {
		t.Fatal(err)
	}
	var o tagOptions
	if err := json.Unmarshal(e.Value(), &o); err != nil {
		return tagOptions{}, true
	}
	return o, true
}

// servesWith waits until every node serves tag with range want.
func servesWith(t testing.TB, tag string, want wire.TagRange, nodes ...*node) {
	t.Helper()
	for _, n := range nodes {
		testutil.Eventually(t, 10*time.Second, n.name+" serves "+tag+" as "+want.String(), func() bool {
			r, err := n.mgr.TagRange(tag)
			return err == nil && r == want
		})
	}
}

// TestRangesOutliveTheirValue: a range written by SetRange is served by every
// dispenser once it returned and remembered in their data dirs; it survives its key
// deleted, its value overwritten by a writer that knows no ranges, and the whole
// bucket lost with a dispenser restarted, each time written back; and SetMonotonic
// keeps it.
func TestRangesOutliveTheirValue(t *testing.T) {
	e := newEnv(t)
	a := e.startNode("d1", false, nil)
	b := e.startNode("d2", false, nil)
	// b's data dir is slow to write: SetRange must still find it serving the tag.
	b.mgr.memory.file.Write = func(path string, data []byte) error {
		time.Sleep(300 * time.Millisecond)
		return durable.WriteFile(path, data)
	}
	js, kv := optsBucket(t, e)
	ctx := testutil.Context(t, 30*time.Second)
	opaque := wire.TagRange{Bits: 53, Opaque: true, Key: testFingerprint}
	if err := a.mgr.SetRange(ctx, "inv", opaque); err != nil {
		t.Fatalf("SetRange: %v", err)
	}
	// Every dispenser confirmed the value only once its data dir held the range: none
	// refuses the tag for that right after SetRange returned.
	for _, n := range []*node{a, b} {
		if r, err := n.mgr.TagRange("inv"); r != opaque || err != nil {
			t.Fatalf("%s: TagRange right after SetRange returned = %v, %v; want %v", n.name, r, err, opaque)
		}
	}
	servesWith(t, "inv", opaque, a, b)
	for _, n := range []string{"d1", "d2"} {
		if _, ranges := rememberedRanges(t, e, n); ranges["inv"] != opaque {
			t.Fatalf("%s remembers %v, want inv %v", n, ranges, opaque)
		}
	}

	// Deleted: a loss, written back.
	if err := kv.Delete(ctx, "inv"); err != nil {
		t.Fatal(err)
	}
	servesWith(t, "inv", opaque, a, b)
	testutil.Eventually(t, 10*time.Second, "the deleted range written back", func() bool {
		o, ok := valueOf(t, kv, "inv")
		return ok && o.TagRange == opaque
	})

	// Overwritten by a writer that knows no ranges ({"monotonic":false}): written back.
	if _, err := kv.Put(ctx, "inv", []byte(`{"monotonic":false}`)); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, "the overwritten range written back", func() bool {
		o, ok := valueOf(t, kv, "inv")
		return ok && o.TagRange == opaque
	})
	servesWith(t, "inv", opaque, a, b)

	// SetMonotonic keeps the range, of this tag and of a capped one.
	if err := a.mgr.SetRange(ctx, "web", wire.TagRange{Bits: 53}); err != nil {
		t.Fatal(err)
	}
	if err := a.mgr.SetMonotonic(ctx, "web", true); err != nil {
		t.Fatal(err)
	}
	if o, _ := valueOf(t, kv, "web"); !o.Monotonic || o.TagRange != (wire.TagRange{Bits: 53}) {
		t.Fatalf("web after SetMonotonic = %+v, want monotonic with 53 bits", o)
	}

	// The bucket lost, and a dispenser restarted meanwhile: its memory serves the range.
	b.stop()
	if err := js.DeleteKeyValue(ctx, e.prefix+"_tagopts"); err != nil {
		t.Fatal(err)
	}
	b = e.startNode("d2", false, nil)
	servesWith(t, "inv", opaque, a, b)
	servesWith(t, "web", wire.TagRange{Bits: 53}, a, b)
	_, kv = optsBucket(t, e)
	testutil.Eventually(t, 10*time.Second, "the lost bucket's ranges written back", func() bool {
		inv, ok1 := valueOf(t, kv, "inv")
		web, ok2 := valueOf(t, kv, "web")
		return ok1 && ok2 && inv.TagRange == opaque && web.TagRange == wire.TagRange{Bits: 53} && web.Monotonic
	})
}

// TestRangeConflictRefused: a value naming another opaque range than the one a
// dispenser remembers (another key, another width, no longer opaque but capped) makes
// it refuse the tag (503), and it serves again once the value is put right; a
// dispenser with no memory takes the deployment record's range.
func TestRangeConflictRefused(t *testing.T) {
	e := newEnv(t)
	a := e.startNode("d1", false, nil)
	_, kv := optsBucket(t, e)
	ctx := testutil.Context(t, 30*time.Second)
	opaque := wire.TagRange{Bits: 53, Opaque: true, Key: testFingerprint}
	if err := a.mgr.SetRange(ctx, "inv", opaque); err != nil {
		t.Fatal(err)
	}
	servesWith(t, "inv", opaque, a)
	good, _ := kv.Get(ctx, "inv")
	for _, bad := range []string{
		`{"monotonic":false,"bits":53,"opaque":true,"key":"0123456789abcdef01234567"}`,
		`{"monotonic":false,"bits":63,"opaque":true,"key":"` + testFingerprint + `"}`,
		`{"monotonic":false,"bits":53}`,
	} {
		if _, err := kv.Put(ctx, "inv", []byte(bad)); err != nil {
			t.Fatal(err)
		}
		testutil.Eventually(t, 10*time.Second, "inv refused with the value "+bad, func() bool {
			_, err := a.mgr.TagRange("inv")
			return errors.Is(err, ErrRangeConflict) && errors.Is(err, wire.ErrUnavailable)
		})
		if err := a.mgr.SetRange(ctx, "inv", wire.TagRange{Bits: 53}); !errors.Is(err, ErrRangeConflict) {
			t.Fatalf("SetRange of a cap over a remembered opaque range = %v, want ErrRangeConflict", err)
		}
		if _, err := kv.Put(ctx, "inv", good.Value()); err != nil {
			t.Fatal(err)
		}
		servesWith(t, "inv", opaque, a)
	}

	// A fresh dispenser, with the value gone before it started, takes the record's.
	a.stop()
	if err := kv.Delete(ctx, "inv"); err != nil {
		t.Fatal(err)
	}
	c := e.startNode("d3", false, func(*Config) {})
	if r, err := c.mgr.TagRange("inv"); err != nil || !r.IsDefault() {
		t.Fatalf("a fresh dispenser that knows nothing of inv: TagRange = %v, %v; want the default", r, err)
	}
	c.mgr.SetRecordedRanges([]wire.DeployedRange{{Tag: "inv", TagRange: opaque}})
	servesWith(t, "inv", opaque, c)
	testutil.Eventually(t, 10*time.Second, "the record's range written back", func() bool {
		o, ok := valueOf(t, kv, "inv")
		return ok && o.TagRange == opaque
	})
}

// TestSetRangeNeedsEveryDispenser: while a dispenser that knows no ranges runs (its
// presence record lists no features, as an earlier version's), SetRange refuses and
// names it; once it is gone, the range is written.
func TestSetRangeNeedsEveryDispenser(t *testing.T) {
	e := newEnv(t)
	a := e.startNode("d1", false, nil)
	js, err := jetstream.New(e.connect(e.urls, "old"))
	if err != nil {
		t.Fatal(err)
	}
	ctx := testutil.Context(t, 30*time.Second)
	leaders, err := js.KeyValue(ctx, e.prefix+"_leaders")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := leaders.Put(ctx, presencePrefix+"oldinstance", []byte(`{"node":"old-node","marks":999999}`)); err != nil {
		t.Fatal(err)
	}
	err = a.mgr.SetRange(ctx, "inv", wire.TagRange{Bits: 53})
	if !errors.Is(err, ErrRangesUnknown) || !errors.Is(err, wire.ErrUnavailable) || !strings.Contains(err.Error(), "old-node") {
		t.Fatalf("SetRange beside a dispenser that knows no ranges = %v; want ErrRangesUnknown naming old-node", err)
	}
	if _, ok := valueOf(t, optsBucketKV(t, js, e), "inv"); ok {
		t.Fatal("SetRange refused, yet it wrote a value")
	}
	if err := leaders.Delete(ctx, presencePrefix+"oldinstance"); err != nil {
		t.Fatal(err)
	}
	if err := a.mgr.SetRange(ctx, "inv", wire.TagRange{Bits: 53}); err != nil {
		t.Fatalf("SetRange once every dispenser knows ranges: %v", err)
	}
}

func optsBucketKV(t testing.TB, js jetstream.JetStream, e *env) jetstream.KeyValue {
	t.Helper()
	kv, err := js.KeyValue(context.Background(), e.prefix+"_tagopts")
	if err != nil {
		t.Fatal(err)
	}
	return kv
}

// rememberedRanges reads the memory file of dispenser name: its monotonic tags and ranges.
func rememberedRanges(t testing.TB, e *env, name string) (map[string]bool, map[string]wire.TagRange) {
	t.Helper()
	m, err := openMemory(e.dataDir(name) + "/monotonic.tags")
	if err != nil {
		t.Fatal(err)
	}
	return m.all(), m.allRanges()
}

// TestOpaqueRangeNeedsEveryKey: while a dispenser without the ID key runs (started before
// any opaque tag needed one), or one with another key, an opaque range is refused (409)
// naming it and nothing is written; a narrow range, which needs no key, is not; once
// the dispenser is gone, the opaque range is written.
func TestOpaqueRangeNeedsEveryKey(t *testing.T) {
	e := newEnv(t)
	withKey := func(fp string) func(*Config) { return func(c *Config) { c.IDKey = fp } }
	a := e.startNode("keyed", false, withKey(testFingerprint))
	ctx := testutil.Context(t, 60*time.Second)
	js, err := jetstream.New(a.nc)
	if err != nil {
		t.Fatal(err)
	}
	opaque := wire.TagRange{Bits: 53, Opaque: true, Key: testFingerprint}
	for _, other := range []struct{ node, key, says string }{
		{"keyless", "", "keyless (no ID key"},
		{"otherkey", strings.Repeat("b", len(testFingerprint)), `otherkey (key fingerprint "bbbb`},
	} {
		b := e.startNode(other.node, false, withKey(other.key))
		err := a.mgr.SetRange(ctx, "inv", opaque)
		if !errors.Is(err, ErrKeyMissing) || !errors.Is(err, wire.ErrConflict) || !strings.Contains(err.Error(), other.says) {
			t.Fatalf("an opaque range beside %s = %v; want ErrKeyMissing (409) saying %q", other.node, err, other.says)
		}
		if _, ok := valueOf(t, optsBucketKV(t, js, e), "inv"); ok {
			t.Fatal("an opaque range was refused, yet it was written")
		}
		if err := a.mgr.SetRange(ctx, "narrow-"+other.node, wire.TagRange{Bits: 40}); err != nil {
			t.Fatalf("a narrow range beside %s: %v, want it written (it needs no key)", other.node, err)
		}
		b.stop()
	}
	if err := a.mgr.SetRange(ctx, "inv", opaque); err != nil {
		t.Fatalf("an opaque range once every dispenser holds its key: %v", err)
	}
}
