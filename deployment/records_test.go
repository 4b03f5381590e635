package deployment

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/leafbus/leafbus/internal/testutil"
	"github.com/leafbus/leafbus/testenv"
	"github.com/leafbus/leafbus/wire"
)

func TestMain(m *testing.M) { testenv.Main(m) }

var when = time.Date(2026, 11, 24, 10, 0, 0, 0, time.UTC)

// openRecords starts a NATS server and opens the records of prefix leaf on it.
func openRecords(tb testing.TB) (*Records, jetstream.JetStream) {
	tb.Helper()
	js, err := jetstream.New(testenv.StartNATS(tb).Connect(tb))
	if err != nil {
		tb.Fatal(err)
	}
	r, err := Open(testutil.Context(tb, 10*time.Second), js, "leaf", 1)
	if err != nil {
		tb.Fatalf("Open: %v", err)
	}
	return r, js
}

func prodOwn() Own { return Own{mysqlStore, zkReg("leaf-prod", 0, 1023), leafLayout} }

func TestCheck(t *testing.T) {
	t.Parallel()
	r, js := openRecords(t)
	ctx := testutil.Context(t, 30*time.Second)
	if r.Bucket() != "leaf_deployment" {
		t.Errorf("Bucket() = %q, want leaf_deployment", r.Bucket())
	}

	// The first dispenser writes the record.
	first, outcome, err := Check(ctx, r, prodOwn(), "disp-1", when)
	if err != nil || outcome != Created {
		t.Fatalf("first Check = %v, %v; want Created", outcome, err)
	}
	kv, err := js.KeyValue(ctx, "leaf_deployment")
	if err != nil {
		t.Fatal(err)
	}
	stored, err := kv.Get(ctx, "deployment")
	if err != nil {
		t.Fatal(err)
	}
	want := `{"version":1,"segment_store":{"kind":"mysql","identity":"mysql db1:3306/leaf"},` +
		`"worker_registries":[{"kind":"zk","identity":"zk /snowflake/leaf-prod","worker_id_min":0,"worker_id_max":1023}],` +
		`"snowflake":{"epoch":1288834974657,"time_bits":41,"worker_bits":10,"sequence_bits":12},` +
		`"monotonic_tags":[],"written_by":"disp-1","written_at":"2026-11-24T10:00:00.000Z","reason":"first start"}`
	if string(stored.Value()) != want || stored.Revision() != first.Revision {
		t.Fatalf("stored record (revision %d):\n got %s\nwant %s (revision %d)", stored.Revision(), stored.Value(), want, first.Revision)
	}

	// The next one with the same configuration checks and writes nothing.
	if e, outcome, err := Check(ctx, r, prodOwn(), "disp-2", when.Add(time.Hour)); err != nil || outcome != Checked || e.Revision != first.Revision {
		t.Fatalf("second Check = %v (revision %d), %v; want Checked at revision %d", outcome, e.Revision, err, first.Revision)
	}

	// A default-flag node is refused, naming the flags.
	_, _, err = Check(ctx, r, Own{kvStore, kvReg(0, 1023), leafLayout}, "newcomer", when)
	var mismatch *MismatchError
	if !errors.As(err, &mismatch) || !errors.Is(err, ErrMismatch) || len(mismatch.Differences) != 2 ||
		!strings.Contains(err.Error(), "--segment-store mysql") || !strings.Contains(err.Error(), "--zk-name leaf-prod") {
		t.Fatalf("Check of a default-flag node = %v, want a MismatchError naming --segment-store mysql and --zk-name leaf-prod", err)
	}

	// A registry for worker IDs nobody uses is added.
	dc2 := Own{mysqlStore, zkReg("leaf-prod", 0, 1023), leafLayout}
	dc2.Registry = kvReg(1024, 2047)
	dc2.Layout.WorkerBits, dc2.Layout.SequenceBits = 11, 11
	if _, _, err := Check(ctx, r, dc2, "dc2", when); !errors.Is(err, ErrMismatch) {
		t.Fatalf("Check with another layout = %v, want ErrMismatch", err)
	}
	dc2.Layout = leafLayout
	dc2.Registry = kvReg(0, 1023)
	if _, _, err := Check(ctx, r, dc2, "dc2", when); !errors.Is(err, ErrMismatch) {
		t.Fatalf("Check with an overlapping registry = %v, want ErrMismatch", err)
	}
	// Shrink the recorded registry so that there is room (as `deployment set` would).
	e, err := r.Get(ctx)
	if err != nil {
		t.Fatal(err)
	}
	e.Record.WorkerRegistries[0].WorkerIDMax = 511
	if _, err := r.Update(ctx, e.Record, e.Revision); err != nil {
		t.Fatal(err)
	}
	dc2.Registry = kvReg(512, 1023)
	added, outcome, err := Check(ctx, r, dc2, "dc2", when)
	if err != nil || outcome != AddedRegistry {
		t.Fatalf("Check of a free range = %v, %v; want AddedRegistry", outcome, err)
	}
	if got := added.Record.WorkerRegistries; len(got) != 2 || got[1] != dc2.Registry || added.Record.WrittenBy != "dc2" {
		t.Fatalf("record after the add: %+v", added.Record)
	}
	if _, outcome, err := Check(ctx, r, dc2, "dc2", when); err != nil || outcome != Checked {
		t.Fatalf("Check after the add = %v, %v; want Checked", outcome, err)
	}
}

// TestCheckFirstStartsRace starts many first dispensers at once, half of them with
// another store: exactly one writes the record, the others compare with it.
func TestCheckFirstStartsRace(t *testing.T) {
	t.Parallel()
	r, _ := openRecords(t)
	ctx := testutil.Context(t, 30*time.Second)
	const n = 8
	type result struct {
		own     Own
		outcome Outcome
		err     error
	}
	results := make([]result, n)
	var wg sync.WaitGroup
	for i := range n {
		own := prodOwn()
		if i%2 == 1 {
			own.Store = kvStore
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, outcome, err := Check(ctx, r, own, fmt.Sprintf("disp-%d", i), when)
			results[i] = result{own, outcome, err}
		}()
	}
	wg.Wait()
	e, err := r.Get(ctx)
	if err != nil {
		t.Fatal(err)
	}
	created := 0
	for i, res := range results {
		if res.outcome == Created && res.err == nil {
			created++
		}
		fits := res.own.Store == e.Record.SegmentStore
		switch {
		case fits && res.err != nil:
			t.Errorf("dispenser %d fits the record but Check = %v", i, res.err)
		case !fits && !errors.Is(res.err, ErrMismatch):
			t.Errorf("dispenser %d does not fit the record but Check = %v, %v", i, res.outcome, res.err)
		}
	}
	if created != 1 {
		t.Errorf("%d dispensers created the record, want 1", created)
	}
}

func TestCheckCorruptRecord(t *testing.T) {
	t.Parallel()
	r, js := openRecords(t)
	ctx := testutil.Context(t, 30*time.Second)
	kv, err := js.KeyValue(ctx, "leaf_deployment")
	if err != nil {
		t.Fatal(err)
	}
	for _, value := range []string{`garbage`, `{"version":2}`, `{"version":1}`} {
		if _, err := kv.Put(ctx, "deployment", []byte(value)); err != nil {
			t.Fatal(err)
		}
		_, _, err := Check(ctx, r, prodOwn(), "disp-1", when)
		if !errors.Is(err, ErrCorrupt) || !strings.Contains(err.Error(), "leaf_deployment") {
			t.Errorf("Check over %s = %v, want ErrCorrupt naming the bucket", value, err)
		}
		raw, _, err := r.Raw(ctx)
		if err != nil || string(raw) != value {
			t.Errorf("Raw = %q, %v; want %q", raw, err, value)
		}
	}
	// A deleted record is no record: the next start writes one.
	if err := kv.Delete(ctx, "deployment"); err != nil {
		t.Fatal(err)
	}
	if _, outcome, err := Check(ctx, r, prodOwn(), "disp-1", when); err != nil || outcome != Created {
		t.Errorf("Check after a delete = %v, %v; want Created", outcome, err)
	}
}

func TestSetMonotonic(t *testing.T) {
	t.Parallel()
	r, _ := openRecords(t)
	ctx := testutil.Context(t, 30*time.Second)
	if err := SetMonotonic(ctx, r, "orders", true, "disp-1", when); !errors.Is(err, ErrNoRecord) {
		t.Fatalf("SetMonotonic without a record = %v, want ErrNoRecord", err)
	}
	if _, _, err := Check(ctx, r, prodOwn(), "disp-1", when); err != nil {
		t.Fatal(err)
	}
	tags := func() []string {
		e, err := r.Get(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return e.Record.MonotonicTags
	}
	for _, step := range []struct {
		tag  string
		on   bool
		want []string
	}{
		{"users", true, []string{"users"}},
		{"orders", true, []string{"orders", "users"}},
		{"orders", true, []string{"orders", "users"}},
		{"users", false, []string{"orders"}},
		{"nobody", false, []string{"orders"}},
	} {
		if err := SetMonotonic(ctx, r, step.tag, step.on, "disp-1", when); err != nil {
			t.Fatalf("SetMonotonic(%s, %v): %v", step.tag, step.on, err)
		}
		if got := tags(); !slices.Equal(got, step.want) {
			t.Fatalf("after SetMonotonic(%s, %v): tags %v, want %v", step.tag, step.on, got, step.want)
		}
	}
	if err := SetMonotonic(ctx, r, "bad\x01tag", true, "disp-1", when); err == nil {
		t.Errorf("SetMonotonic of an invalid tag: no error")
	}
	if err := AddMonotonic(ctx, r, []string{"b", "a", "orders"}, "disp-2", when); err != nil {
		t.Fatal(err)
	}
	if got := tags(); !slices.Equal(got, []string{"a", "b", "orders"}) {
		t.Fatalf("after AddMonotonic: %v", got)
	}

	// Concurrent marks all land (compare-and-set).
	var wg sync.WaitGroup
	for i := range 10 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := SetMonotonic(ctx, r, fmt.Sprintf("t%d", i), true, "disp", when); err != nil {
				t.Errorf("SetMonotonic t%d: %v", i, err)
			}
		}()
	}
	wg.Wait()
	if got := tags(); len(got) != 13 {
		t.Errorf("after 10 concurrent marks: %d tags %v, want 13", len(got), got)
	}
}

// TestSetRange: the record's tag ranges follow the admin calls (sorted, the default
// removed), an opaque entry never changes, AddRanges adds only what is missing, Replace
// keeps them, and a record with ranges still reads back.
func TestSetRange(t *testing.T) {
	t.Parallel()
	r, _ := openRecords(t)
	ctx := testutil.Context(t, 30*time.Second)
	const fp = "f412d2d97e6120bb37a45c97"
	opaque := wire.TagRange{Bits: 53, Opaque: true, Key: fp}
	if err := SetRange(ctx, r, "inv", opaque, "disp-1", when); !errors.Is(err, ErrNoRecord) {
		t.Fatalf("SetRange without a record = %v, want ErrNoRecord", err)
	}
	if _, _, err := Check(ctx, r, prodOwn(), "disp-1", when); err != nil {
		t.Fatal(err)
	}
	ranges := func() string {
		e, err := r.Get(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return fmt.Sprint(e.Record.TagRanges)
	}
	for _, step := range []struct {
		tag     string
		rng     wire.TagRange
		want    string
		wantErr error
	}{
		{"web", wire.TagRange{Bits: 53}, "[web: 53 bits]", nil},
		{"web", opaque, "[web: 53 bits]", ErrRangeFixed},
		{"inv", opaque, "[inv: opaque, 53 bits, key " + fp + " web: 53 bits]", nil},
		{"inv", opaque, "[inv: opaque, 53 bits, key " + fp + " web: 53 bits]", nil},
		{"web", wire.TagRange{Bits: 40}, "[inv: opaque, 53 bits, key " + fp + " web: 40 bits]", nil},
		{"web", wire.TagRange{Bits: 63}, "[inv: opaque, 53 bits, key " + fp + "]", nil},
		{"inv", wire.TagRange{Bits: 53}, "[inv: opaque, 53 bits, key " + fp + "]", ErrRangeFixed},
		{"inv", wire.TagRange{}, "[inv: opaque, 53 bits, key " + fp + "]", ErrRangeFixed},
		{"plain", wire.TagRange{Bits: 63, Opaque: true, Key: fp}, "[inv: opaque, 53 bits, key " + fp + " plain: opaque, 63 bits, key " + fp + "]", nil},
	} {
		err := SetRange(ctx, r, step.tag, step.rng, "disp-1", when)
		if !errors.Is(err, step.wantErr) || (err == nil) != (step.wantErr == nil) {
			t.Fatalf("SetRange(%s, %v) = %v, want %v", step.tag, step.rng, err, step.wantErr)
		}
		if got := ranges(); got != step.want {
			t.Fatalf("after SetRange(%s, %v): %s, want %s", step.tag, step.rng, got, step.want)
		}
	}
	if err := AddRanges(ctx, r, map[string]wire.TagRange{"inv": {Bits: 20}, "app": {Bits: 53}, "dflt": {}}, "disp-2", when); err != nil {
		t.Fatal(err)
	}
	if got, want := ranges(), "[app: 53 bits inv: opaque, 53 bits, key "+fp+" plain: opaque, 63 bits, key "+fp+"]"; got != want {
		t.Fatalf("after AddRanges: %s, want %s", got, want)
	}
	e, err := r.Get(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if next := Replace(&e.Record, prodOwn(), false, "disp-3", when); fmt.Sprint(next.TagRanges) != fmt.Sprint(e.Record.TagRanges) {
		t.Fatalf("Replace lost the tag ranges: %v", next.TagRanges)
	}
}

// waitErr waits up to d for Run's result.
func waitErr(tb testing.TB, done <-chan error, d time.Duration) error {
	tb.Helper()
	select {
	case err := <-done:
		return err
	case <-time.After(d):
		tb.Fatalf("Watch.Run did not return within %v", d)
		return nil
	}
}

func TestWatch(t *testing.T) {
	t.Parallel()
	r, js := openRecords(t)
	ctx := testutil.Context(t, time.Minute)
	own := prodOwn()
	first, _, err := Check(ctx, r, own, "disp-1", when)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var seen []wire.Deployment
	w := &Watch{Records: r, Own: own, Node: "disp-1", Last: first, Every: 20 * time.Millisecond, Logger: testutil.Logger(t),
		Seen: func(_ context.Context, rec wire.Deployment) {
			mu.Lock()
			seen = append(seen, rec)
			mu.Unlock()
		}}
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan error, 1)
	go func() { done <- w.Run(wctx) }()
	kv, err := js.KeyValue(ctx, "leaf_deployment")
	if err != nil {
		t.Fatal(err)
	}
	current := func() Entry {
		e, err := r.Get(ctx)
		if err != nil {
			t.Fatal(err)
		}
		return e
	}

	// Deleted: written again as last read.
	if err := kv.Delete(ctx, "deployment"); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, "the deleted record written again", func() bool {
		e, err := r.Get(ctx)
		return err == nil && e.Record.SegmentStore == own.Store && strings.Contains(e.Record.Reason, "was gone")
	})

	// Its registry dropped: added again.
	e := current()
	e.Record.WorkerRegistries = []wire.DeployedRegistry{zkReg("leaf-prod", 512, 1023)}
	if _, err := r.Update(ctx, e.Record, e.Revision); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, "the registry added again", func() bool {
		return len(current().Record.WorkerRegistries) == 2
	})
	mu.Lock()
	if len(seen) == 0 {
		t.Errorf("Seen was never called")
	}
	mu.Unlock()

	// Garbage: refused, and the record this dispenser runs under written back.
	if _, err := kv.Put(ctx, "deployment", []byte("garbage")); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, "the garbage written over", func() bool {
		e, err := r.Get(ctx)
		return err == nil && e.Record.SegmentStore == own.Store
	})

	// Changed so that this dispenser no longer fits (issue 30: it stopped): the change
	// is refused, the record written back, and Run goes on.
	refusals := w.Refusals()
	rec := NewRecord(Own{kvStore, zkReg("leaf-prod", 0, 1023), leafLayout}, []string{"orders"}, "operator", when, "deployment set")
	if _, err := kv.Put(ctx, "deployment", mustMarshal(t, rec)); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, "the contradicting record written over", func() bool {
		e, err := r.Get(ctx)
		return err == nil && e.Record.SegmentStore == own.Store && strings.Contains(e.Record.Reason, "contradicts was refused") &&
			slices.Equal(e.Record.MonotonicTags, []string{"orders"})
	})
	if w.Refusals() <= refusals {
		t.Errorf("Refusals = %d after a refused change, was %d", w.Refusals(), refusals)
	}
	select {
	case err := <-done:
		t.Fatalf("Watch.Run returned: %v", err)
	default:
	}
	stop()
	if err := waitErr(t, done, 10*time.Second); err != nil {
		t.Errorf("Watch.Run after ctx ended = %v, want nil", err)
	}
}

// TestWatchTwoFleets: a record this dispenser contradicts but a live dispenser fits is
// not written over (two fleets disagree, and this one cannot tell which is wrong): it
// is reported (Problem) and Run goes on.
func TestWatchTwoFleets(t *testing.T) {
	t.Parallel()
	r, js := openRecords(t)
	ctx := testutil.Context(t, time.Minute)
	own := prodOwn()
	first, _, err := Check(ctx, r, own, "disp-1", when)
	if err != nil {
		t.Fatal(err)
	}
	other := Own{kvStore, kvReg(0, 1023), leafLayout}
	w := &Watch{Records: r, Own: own, Node: "disp-1", Last: first, Every: 20 * time.Millisecond, Logger: testutil.Logger(t),
		Peers: func(context.Context) ([]Peer, error) {
			return []Peer{{NodeID: "kv-1", Instance: "x", Own: other, known: true}}, nil
		}}
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	done := make(chan error, 1)
	go func() { done <- w.Run(wctx) }()
	kv, err := js.KeyValue(ctx, "leaf_deployment")
	if err != nil {
		t.Fatal(err)
	}
	rev, err := kv.Put(ctx, "deployment", mustMarshal(t, NewRecord(other, nil, "kv-1", when, "first start")))
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, "the disagreement reported", func() bool {
		return strings.Contains(w.Problem(), "two fleets disagree") && strings.Contains(w.Problem(), "kv-1")
	})
	if e, err := r.Get(ctx); err != nil || e.Revision != rev {
		t.Errorf("record at %d, %v: want the other fleet's revision %d left alone", e.Revision, err, rev)
	}
	select {
	case err := <-done:
		t.Fatalf("Watch.Run returned: %v", err)
	default:
	}
}

// TestCheckLiveFleet: no record, but live dispensers answer: CheckLive writes none and
// says it waits for them (ErrFleetLive, naming them); with none live it creates it; an
// ask that fails creates nothing.
func TestCheckLiveFleet(t *testing.T) {
	t.Parallel()
	r, _ := openRecords(t)
	ctx := testutil.Context(t, time.Minute)
	live := []Peer{{NodeID: "m1", Instance: "i1", Own: prodOwn(), known: true}}
	newcomer := Own{kvStore, kvReg(0, 1023), leafLayout}
	_, _, err := CheckLive(ctx, r, newcomer, "newcomer", when, func(context.Context) ([]Peer, error) { return live, nil })
	if !errors.Is(err, ErrFleetLive) || !strings.Contains(err.Error(), `"m1"`) {
		t.Fatalf("CheckLive beside a live fleet = %v, want ErrFleetLive naming m1", err)
	}
	_, _, err = CheckLive(ctx, r, newcomer, "newcomer", when, func(context.Context) ([]Peer, error) { return nil, errors.New("no route") })
	if err == nil || errors.Is(err, ErrFleetLive) {
		t.Fatalf("CheckLive when the fleet cannot be asked = %v, want the ask's error", err)
	}
	if _, err := r.Get(ctx); !errors.Is(err, ErrNoRecord) {
		t.Fatalf("a record was written: %v", err)
	}
	if _, outcome, err := CheckLive(ctx, r, newcomer, "newcomer", when, func(context.Context) ([]Peer, error) { return nil, nil }); err != nil || outcome != Created {
		t.Fatalf("CheckLive with no live dispenser = %v, %v; want Created", outcome, err)
	}
	if got := Contradicting(live, NewRecord(newcomer, nil, "op", when, "set")); len(got) != 1 {
		t.Errorf("Contradicting = %v, want m1", got)
	}
	if got := Contradicting(live, NewRecord(prodOwn(), nil, "op", when, "set")); len(got) != 0 {
		t.Errorf("Contradicting = %v, want none", got)
	}
	// What a dispenser publishes reads back as itself.
	own := prodOwn()
	p, err := parsePeer([]byte(`{"id":"i9","metadata":{"node_id":"n9","deployment":` + strconv.Quote(own.Meta()) + `}}`))
	if err != nil || !p.Known() || p.Own != own || p.NodeID != "n9" {
		t.Errorf("parsePeer(Meta) = %+v, %v; want %+v", p, err, own)
	}
}

func TestWatchBucketLost(t *testing.T) {
	t.Parallel()
	r, js := openRecords(t)
	ctx := testutil.Context(t, time.Minute)
	own := prodOwn()
	first, _, err := Check(ctx, r, own, "disp-1", when)
	if err != nil {
		t.Fatal(err)
	}
	w := &Watch{Records: r, Own: own, Node: "disp-1", Last: first, Every: 20 * time.Millisecond, Logger: testutil.Logger(t)}
	wctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Run(wctx) }()
	if err := js.DeleteKeyValue(ctx, "leaf_deployment"); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*time.Second, "the bucket and record written again", func() bool {
		kv, err := js.KeyValue(ctx, "leaf_deployment")
		if err != nil {
			return false
		}
		e, err := kv.Get(ctx, "deployment")
		return err == nil && strings.Contains(string(e.Value()), "was gone")
	})
	stop()
	if err := waitErr(t, done, 10*time.Second); err != nil {
		t.Errorf("Watch.Run after ctx ended = %v, want nil", err)
	}
}

func mustMarshal(tb testing.TB, rec wire.Deployment) []byte {
	tb.Helper()
	b, err := rec.Marshal()
	if err != nil {
		tb.Fatal(err)
	}
	return b
}
