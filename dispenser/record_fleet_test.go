package dispenser

import (
	"context"
	"encoding/hex"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/leafbus/leafbus/client"
	"github.com/leafbus/leafbus/deployment"
	"github.com/leafbus/leafbus/internal/testutil"
	"github.com/leafbus/leafbus/opaque"
	"github.com/leafbus/leafbus/testenv"
	"github.com/leafbus/leafbus/wire"
)

// Issue 30, "the record follows the fleet": what the deployment record says never
// stops a running dispenser, and never makes one serve a tag otherwise than its own
// state says. Each test runs a load through clients of the running dispensers while the
// record is attacked and counts the IDs served twice.

// recordLoad is clients asking for one segment tag until stopped, keeping every ID and
// every error.
type recordLoad struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	mu     sync.Mutex
	ids    []int64
	errs   []error
}

func startRecordLoad(t *testing.T, tag string, clients ...*client.Client) *recordLoad {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	l := &recordLoad{cancel: cancel}
	for _, c := range clients {
		l.wg.Go(func() {
			for ctx.Err() == nil {
				rctx, rcancel := context.WithTimeout(ctx, 5*time.Second)
				id, err := c.Segment(rctx, tag)
				rcancel()
				l.mu.Lock()
				if err == nil {
					l.ids = append(l.ids, id)
				} else if ctx.Err() == nil {
					l.errs = append(l.errs, err)
				}
				l.mu.Unlock()
			}
		})
	}
	t.Cleanup(l.stop)
	return l
}

func (l *recordLoad) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.ids)
}

// waitMore waits until n more IDs than now were served.
func (l *recordLoad) waitMore(t *testing.T, n int, what string) {
	t.Helper()
	want := l.count() + n
	testutil.Eventually(t, 30*time.Second, what, func() bool { return l.count() >= want })
}

func (l *recordLoad) stop() {
	l.cancel()
	l.wg.Wait()
}

// check stops the load and fails the test on an ID served twice or an error.
func (l *recordLoad) check(t *testing.T) {
	t.Helper()
	l.stop()
	l.mu.Lock()
	defer l.mu.Unlock()
	if dups := testutil.Duplicates(l.ids); len(dups) > 0 {
		t.Errorf("%d IDs served twice of %d: %v", len(dups), len(l.ids), dups[:min(len(dups), 10)])
	}
	if len(l.errs) > 0 {
		t.Errorf("%d requests failed of %d, the first: %v", len(l.errs), len(l.ids)+len(l.errs), l.errs[0])
	}
	t.Logf("%d IDs, %d errors", len(l.ids), len(l.errs))
}

// stillRuns fails the test when a dispenser's Run has returned.
func stillRuns(t *testing.T, name string, done <-chan error) {
	t.Helper()
	select {
	case err := <-done:
		t.Fatalf("the running dispenser %s stopped: %v", name, err)
	default:
	}
}

// TestRecordPurgedNewcomerWaits is issue 30's first attack: the record's key purged,
// then a dispenser with default flags (its own KV store) started on the NATS of a
// MySQL deployment. It wrote a record of its own, the two MySQL dispensers exited and
// the newcomer served the tag from 1. Now the newcomer sees the live fleet, does not
// write a record, waits for the fleet to write it back and is refused against it,
// naming --segment-store mysql; the fleet serves on with no error and no ID twice.
func TestRecordPurgedNewcomerWaits(t *testing.T) {
	t.Parallel()
	srv := testenv.StartNATS(t)
	dsn := testenv.MariaDB(t).NewDatabase(t)
	// The fleet reads the record every 4 s: long enough for a newcomer to start
	// before it writes the record back (which the newcomer now waits for).
	every := withDeploymentEvery(4 * time.Second)
	m1, err := newTest(t, withMySQL(fleetNode(t, srv.URL(), "m1"), dsn), WithTags(sampleTag()), every)
	if err != nil {
		t.Fatal(err)
	}
	done1 := runNode(t, m1)
	m2, err := newTest(t, withMySQL(fleetNode(t, srv.URL(), "m2"), dsn), every)
	if err != nil {
		t.Fatal(err)
	}
	done2 := runNode(t, m2)
	_, c1 := exactClient(t, m1)
	_, c2 := exactClient(t, m2)
	load := startRecordLoad(t, SampleTagName, c1, c2)
	load.waitMore(t, 500, "IDs before the attack")

	ctx := testutil.Context(t, time.Minute)
	js, err := jetstream.New(srv.Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(ctx, "leaf_deployment")
	if err != nil {
		t.Fatal(err)
	}
	if err := kv.Purge(ctx, wire.DeploymentKey); err != nil {
		t.Fatal(err)
	}
	newcomer := fleetNode(t, srv.URL(), "newcomer")
	newcomer.StartTimeout = 20 * time.Second
	d, err := newTest(t, newcomer)
	if err == nil {
		t.Fatalf("a dispenser with its own KV store started beside a live MySQL fleet (%s)", d.ClientURL())
	}
	if !errors.Is(err, deployment.ErrMismatch) || !strings.Contains(err.Error(), "--segment-store mysql") {
		t.Fatalf("the newcomer: %v, want ErrMismatch naming --segment-store mysql", err)
	}
	if rec := readRecord(t, srv); rec.SegmentStore.Kind != "mysql" {
		t.Fatalf("record after the attack: %+v; want the fleet's MySQL store", rec)
	}
	load.waitMore(t, 500, "IDs after the attack")
	stillRuns(t, "m1", done1)
	stillRuns(t, "m2", done2)
	load.check(t)
	if got := m1.watch.Refusals() + m2.watch.Refusals(); got == 0 {
		t.Errorf("no dispenser counted the record written back")
	}
}

// TestRecordChangedIsRefused is issue 30's third attack: a record naming another store
// written over the fleet's (as `nats kv put` would) stopped every dispenser within 4 s.
// Now the fleet refuses it: it keeps serving, says so (/readyz detail, the metric) and
// writes the record it runs under back over it.
func TestRecordChangedIsRefused(t *testing.T) {
	t.Parallel()
	srv := testenv.StartNATS(t)
	every := withDeploymentEvery(100 * time.Millisecond)
	a, err := newTest(t, fleetNode(t, srv.URL(), "a"), every)
	if err != nil {
		t.Fatal(err)
	}
	doneA := runNode(t, a)
	b, err := newTest(t, fleetNode(t, srv.URL(), "b"), every)
	if err != nil {
		t.Fatal(err)
	}
	doneB := runNode(t, b)
	_, ca := exactClient(t, a)
	_, cb := exactClient(t, b)
	load := startRecordLoad(t, SampleTagName, ca, cb)
	load.waitMore(t, 300, "IDs before the attack")

	forged := readRecord(t, srv)
	forged.SegmentStore = wire.DeployedStore{Kind: "mysql", Identity: "mysql db.example:3306/leaf"}
	forged.WrittenBy = "attacker"
	writeRecord(t, srv, forged)
	testutil.Eventually(t, 20*time.Second, "the fleet's record written back", func() bool {
		rec := readRecord(t, srv)
		return rec.SegmentStore.Kind == "kv" && rec.WrittenBy != "attacker"
	})
	load.waitMore(t, 300, "IDs after the attack")
	stillRuns(t, "a", doneA)
	stillRuns(t, "b", doneB)
	load.check(t)
	if got := a.deploymentState().Refusals + b.deploymentState().Refusals; got == 0 {
		t.Errorf("the metric counts no refused record")
	}

	// Each forged revision is refused (and counted) once.
	writeRecord(t, srv, forged)
	testutil.Eventually(t, 20*time.Second, "the second forged record refused", func() bool {
		return a.watch.Refusals()+b.watch.Refusals() >= 2
	})
}

// TestRecordRangeForOrdinaryTag is issue 30's second attack: an opaque range for an
// ordinary tag added to the record made every dispenser serve the tag through the
// permutation (406,577 repeats). The running dispenser refuses the entry (it served the
// tag without it), says so, serves the tag as before and writes the record back
// without it; a dispenser that starts beside it then starts, and serves the tag as an
// ordinary one too.
func TestRecordRangeForOrdinaryTag(t *testing.T) {
	t.Parallel()
	srv := testenv.StartNATS(t)
	key := []byte("the deployment's ID key, 32 bytes")
	withKey := func(cfg Config) Config {
		cfg.IDKey = hex.EncodeToString(key)
		return cfg
	}
	a, err := newTest(t, withKey(fleetNode(t, srv.URL(), "a")), withDeploymentEvery(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	doneA := runNode(t, a)
	_, ca := exactClient(t, a)
	load := startRecordLoad(t, SampleTagName, ca)
	load.waitMore(t, 300, "IDs before the attack")

	forged := readRecord(t, srv)
	forged.TagRanges = append(forged.TagRanges, wire.DeployedRange{Tag: SampleTagName,
		TagRange: wire.TagRange{Bits: 53, Opaque: true, Key: opaque.Fingerprint(key)}})
	forged.WrittenBy = "attacker"
	writeRecord(t, srv, forged)
	testutil.Eventually(t, 20*time.Second, "the record's range taken out again", func() bool {
		return len(readRecord(t, srv).TagRanges) == 0
	})
	load.waitMore(t, 300, "IDs after the attack")
	stillRuns(t, "a", doneA)

	b, err := newTest(t, withKey(fleetNode(t, srv.URL(), "b")))
	if err != nil {
		t.Fatalf("a dispenser started after the attack: %v", err)
	}
	runNode(t, b)
	_, cb := exactClient(t, b)
	load.mu.Lock()
	last := slicesMax(load.ids)
	load.mu.Unlock()
	ctx := testutil.Context(t, 10*time.Second)
	for range 20 {
		id, err := cb.Segment(ctx, SampleTagName)
		if err != nil {
			t.Fatal(err)
		}
		if id > last+100_000 {
			t.Fatalf("ID %d after IDs up to %d: the tag is served through the permutation", id, last)
		}
	}
	load.check(t)
	load.mu.Lock()
	defer load.mu.Unlock()
	if top := slicesMax(load.ids); top > int64(len(load.ids))+100_000 {
		t.Errorf("the highest ID %d of %d: the tag was served through the permutation", top, len(load.ids))
	}
}

func slicesMax(ids []int64) int64 {
	var top int64
	for _, id := range ids {
		top = max(top, id)
	}
	return top
}

// TestRecordNoKeyNoServing is issue 30's "no key, no serving": a dispenser without the
// ID key, or with another, beside a deployment with an opaque tag, joined the queue
// group, said WARN, reported ready and answered 503 for the tag. It refuses to start,
// naming the fingerprint it needs and the flag and variable that give the key.
func TestRecordNoKeyNoServing(t *testing.T) {
	t.Parallel()
	srv := testenv.StartNATS(t)
	key := []byte("the deployment's ID key, 32 bytes")
	cfg := fleetNode(t, srv.URL(), "a")
	cfg.IDKey = hex.EncodeToString(key)
	a, err := newTest(t, cfg)
	if err != nil {
		t.Fatal(err)
	}
	runNode(t, a)
	_, ca := exactClient(t, a)
	ctx := testutil.Context(t, 30*time.Second)
	step, on := int64(100), true
	if _, err := ca.AddTag(ctx, wire.AddTagRequest{Tag: "inv", Step: &step, Opaque: &on}); err != nil {
		t.Fatal(err)
	}
	fp := opaque.Fingerprint(key)
	for name, idKey := range map[string]string{"none": "", "other": hex.EncodeToString([]byte("another ID key of 32 bytes, wrong"))} {
		c := fleetNode(t, srv.URL(), "key-"+name)
		c.IDKey = idKey
		wantRefused(t, c, "ID key of opaque tags", fp, "--id-key-file", IDKeyEnv)
	}
	if _, err := ca.Segment(ctx, "inv"); err != nil {
		t.Errorf("the dispenser with the key after the refusals: %v", err)
	}
}

// TestRecordRangeBeingSet: an admin call writes a tag's range to the record first and
// to the tag's options after. A watch read between the two neither refuses the entry
// nor writes the record back without it; the read after the second write takes it in.
// (A forged entry is still refused, at its second read: TestRecordRangeForOrdinaryTag.)
func TestRecordRangeBeingSet(t *testing.T) {
	t.Parallel()
	srv := testenv.StartNATS(t)
	a, err := newTest(t, fleetNode(t, srv.URL(), "a"), withDeploymentEvery(time.Hour))
	if err != nil {
		t.Fatal(err)
	}
	runNode(t, a)
	_, c := exactClient(t, a)
	ctx := testutil.Context(t, 30*time.Second)
	step := int64(100)
	if _, err := c.AddTag(ctx, wire.AddTagRequest{Tag: "orders", Step: &step}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Segment(ctx, "orders"); err != nil {
		t.Fatal(err)
	}
	narrow := wire.TagRange{Bits: 40}
	if err := deployment.SetRange(ctx, a.records, "orders", narrow, "a", time.Now()); err != nil {
		t.Fatal(err)
	}
	check := func(when string) {
		t.Helper()
		a.remarkMonotonic(ctx, readRecord(t, srv))
		if p := a.deploymentProblems(); len(p) > 0 {
			t.Fatalf("%s: the range being set is refused: %v", when, p)
		}
		if got := readRecord(t, srv).TagRanges; len(got) != 1 || got[0].TagRange.Normal() != narrow.Normal() {
			t.Fatalf("%s: the record's tag ranges = %v; want orders at 40 bits", when, got)
		}
	}
	check("between the record and the tag's options")
	if err := a.mono.SetRange(ctx, "orders", narrow); err != nil {
		t.Fatal(err)
	}
	check("after both")
	check("at the next read")
}
