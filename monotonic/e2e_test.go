package monotonic

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/leafbus/leafbus/internal/testutil"
	"github.com/leafbus/leafbus/testenv"
	"github.com/leafbus/leafbus/wire"
)

// start3 starts three dispensers on e (through proxies when asked), adds the monotonic
// tag "ordered" with step, waits for its leader, and returns the nodes, the leader and
// three client connections.
func start3(e *env, proxies bool, step int64) ([]*node, *node, []*nats.Conn) {
	e.t.Helper()
	return startN(e, 3, proxies, step)
}

// startN is start3 with n dispensers.
func startN(e *env, n int, proxies bool, step int64) ([]*node, *node, []*nats.Conn) {
	e.t.Helper()
	var nodes []*node
	for i := range n {
		name := fmt.Sprintf("d%d", i+1)
		nodes = append(nodes, e.startNode(name, proxies, nil))
	}
	var clients []*nats.Conn
	for _, name := range []string{"c1", "c2", "c3"} {
		clients = append(clients, e.connect(e.urls, name))
	}
	addMonotonic(e.t, clients[0], e.prefix, "ordered", step)
	leader := leaderOf(e.t, "ordered", 3*e.ttl, nodes...)
	return nodes, leader, clients
}

// TestPromiseAcrossDispensers: many clients on three dispensers, each request landing
// on any of them; every reply is checked against every reply received before it was
// sent. Small segments make the leader switch segments often.
func TestPromiseAcrossDispensers(t *testing.T) {
	e := newEnv(t)
	nodes, leader, clients := start3(e, false, 50)
	rec := newRecorder()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	rec.load(ctx, clients, wire.Subjects{Prefix: e.prefix}.IDs(wire.Segment, "ordered"), 12, 5)()
	t.Log(rec.summary())
	if n := rec.check(t); n < 500 {
		t.Fatalf("only %d replies in 3s", n)
	}
	if rec.errorsOf(503) > 0 || rec.errorsOf(0) > 0 {
		t.Fatalf("errors with a steady leader: %s", rec.summary())
	}
	for _, n := range nodes {
		st := n.mgr.Stats().Tags[0]
		t.Logf("%s: %+v", n.name, st)
		if n != leader && st.Forwarded == 0 {
			t.Errorf("follower %s forwarded nothing", n.name)
		}
	}
}

// TestMarkLifecycle: a tag marked while the dispensers run gets a leader; a mark
// without a row in the store answers 404 through the leader and through a follower;
// unmarking releases the lease and the tag is served as an ordinary one again, and
// marking it again, once the released record expired, brings a new leader whose first
// ID is above everything served.
func TestMarkLifecycle(t *testing.T) {
	e := newEnv(t)
	nodes, leader, clients := start3(e, false, 10)
	subject := wire.Subjects{Prefix: e.prefix}.IDs(wire.Segment, "ordered")

	if err := nodes[0].mgr.SetMonotonic(context.Background(), "ghost", true); err != nil {
		t.Fatal(err)
	}
	leaderOf(t, "ghost", 3*e.ttl, nodes...)
	for i := range 6 { // lands on the leader and on followers
		if _, code, err := request(clients[i%3], wire.Subjects{Prefix: e.prefix}.IDs(wire.Segment, "ghost"), 1, 5*time.Second); code != 404 {
			t.Fatalf("request of a marked tag missing from the store = %d, %v; want 404", code, err)
		}
	}

	var highest int64
	for range 10 {
		ids, _, err := request(clients[0], subject, 2, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		highest = ids[1]
	}
	off := false
	if info, err := admin(t, clients[0], e.prefix, "update", wire.UpdateTagRequest{Tag: "ordered", Monotonic: &off}); err != nil || info.Monotonic {
		t.Fatalf("unmark = %+v, %v", info, err)
	}
	// Each dispenser sees the change through its watch, the one that answered the admin
	// request too: until then a request may still be forwarded, and refused (503).
	testutil.Eventually(t, 5*time.Second, "every dispenser sees the tag ordinary and the lease released", func() bool {
		for _, n := range nodes {
			if mono, _ := n.mgr.IsMonotonic("ordered"); mono {
				return false
			}
		}
		e, err := leader.mgr.leaders.Get(context.Background(), "ordered")
		var rec leaseRecord
		return err == nil && json.Unmarshal(e.Value(), &rec) == nil && rec.Released
	})
	for i := range 10 { // ordinary now: any dispenser, from its own buffers
		ids, _, err := request(clients[i%3], subject, 1, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		highest = max(highest, ids[0])
	}
	// The released record expires meanwhile (the bucket keeps records for recordTTL),
	// which no watch reports: the views still show it, and the dispensers must find out
	// that it is gone.
	testutil.Eventually(t, recordTTL(e.ttl)+10*time.Second, "the released lease record to expire", func() bool {
		_, err := leader.mgr.leaders.Get(context.Background(), "ordered")
		return errors.Is(err, jetstream.ErrKeyNotFound)
	})
	on := true
	if _, err := admin(t, clients[0], e.prefix, "update", wire.UpdateTagRequest{Tag: "ordered", Monotonic: &on}); err != nil {
		t.Fatal(err)
	}
	leaderOf(t, "ordered", 3*e.ttl, nodes...)
	ids, _, err := request(clients[2], subject, 1, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if ids[0] <= highest {
		t.Fatalf("first ID after marking again %d: want above every ID served before, %d", ids[0], highest)
	}
}

// heldMarkKV is a real <prefix>_tagopts bucket whose watchers hold back the value that
// marks tag monotonic (or, with monotonic false, ordinary), and every entry after it,
// until let is closed: the marks watch of a dispenser that lags its leases watch.
type heldMarkKV struct {
	jetstream.KeyValue
	tag       string
	monotonic bool
	let       <-chan struct{}
}

func (kv heldMarkKV) WatchAll(ctx context.Context, opts ...jetstream.WatchOpt) (jetstream.KeyWatcher, error) {
	w, err := kv.KeyValue.WatchAll(ctx, opts...)
	if err != nil {
		return nil, err
	}
	hw := &earlyWatcher{KeyWatcher: w, out: make(chan jetstream.KeyValueEntry, 64)}
	go func() { // ends when w's channel closes (Stop), once let is closed
		defer close(hw.out)
		for e := range w.Updates() {
			var o tagOptions
			if e != nil && e.Key() == wire.TagKey(kv.tag) && json.Unmarshal(e.Value(), &o) == nil && o.Monotonic == kv.monotonic {
				<-kv.let
			}
			hw.out <- e
		}
	}()
	return hw, nil
}

// TestMarkAfterLeaseIsRemembered: a dispenser whose leases watch shows it a tag's live
// lease before its marks watch shows it the tag's mark follows the tag from the lease
// alone; once the mark arrives, it writes the tag into its memory (so that after a
// restart with the marks bucket lost it still serves the tag as monotonic) before it
// may ever lead it.
func TestMarkAfterLeaseIsRemembered(t *testing.T) {
	e := newEnv(t)
	d1 := e.startNode("d1", false, nil)
	let := make(chan struct{})
	var letOnce sync.Once
	letMark := func() { letOnce.Do(func() { close(let) }) }
	defer letMark()
	e.wrapOpts = func(kv jetstream.KeyValue) jetstream.KeyValue { return heldMarkKV{kv, "ordered", true, let} }
	d2 := e.startNode("d2", false, nil)

	marked := make(chan error, 1)
	go func() { marked <- d1.mgr.SetMonotonic(context.Background(), "ordered", true) }()
	leaderOf(t, "ordered", 3*e.ttl, d1)
	testutil.Eventually(t, 3*e.ttl, "d2 follows d1 on the lease alone", func() bool { return d2.role("ordered") == "follower" })
	if remembered(t, e, "d2")["ordered"] {
		t.Fatal("d2 remembers ordered before its mark reached it")
	}
	letMark()
	if err := <-marked; err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 3*e.ttl, "d2 remembers ordered once its mark arrived", func() bool { return remembered(t, e, "d2")["ordered"] })
}

// answerLostKV is a real <prefix>_leaders bucket whose first write of a live lease
// record of tag calls sent, waits until the writer's ctx ends, and only then is stored:
// a write that reached the server after its writer stopped waiting for the answer.
type answerLostKV struct {
	jetstream.KeyValue
	tag  string
	once *sync.Once
	sent func()
}

func (kv answerLostKV) Update(ctx context.Context, key string, value []byte, rev uint64) (uint64, error) {
	var rec leaseRecord
	first := false
	if key == wire.TagKey(kv.tag) && json.Unmarshal(value, &rec) == nil && !rec.Released {
		kv.once.Do(func() { first = true })
	}
	if !first {
		return kv.KeyValue.Update(ctx, key, value, rev)
	}
	kv.sent()
	<-ctx.Done()
	wctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := kv.KeyValue.Update(wctx, key, value, rev); err != nil {
		return 0, err
	}
	return 0, ctx.Err()
}

// TestLeaseWrittenAsTagTurnsOrdinary: a tag is marked ordinary; a follower whose
// marks watch lags sees the leader's released record first, takes the lease, and the
// mark reaches it while that write is under way: its campaign ends (the tag is ordinary
// and nobody holds it), and the write is stored after it stopped waiting for the
// answer. That record of its own, which no term serves, must not keep the tag
// monotonic: the dispenser gives it back, and the tag is ordinary everywhere with a
// released lease record, as TestMarkLifecycle expects.
func TestLeaseWrittenAsTagTurnsOrdinary(t *testing.T) {
	e := newEnv(t)
	d1 := e.startNode("d1", false, nil)
	nc := e.connect(e.urls, "client")
	addMonotonic(t, nc, e.prefix, "ordered", 10)
	leaderOf(t, "ordered", 3*e.ttl, d1)

	let := make(chan struct{})
	var letOnce sync.Once
	letMark := func() { letOnce.Do(func() { close(let) }) }
	defer letMark()
	e.wrapOpts = func(kv jetstream.KeyValue) jetstream.KeyValue { return heldMarkKV{kv, "ordered", false, let} }
	e.wrapLeaders = func(_ string, kv jetstream.KeyValue) jetstream.KeyValue {
		return answerLostKV{KeyValue: kv, tag: "ordered", once: new(sync.Once), sent: letMark}
	}
	d2 := e.startNode("d2", false, nil)
	testutil.Eventually(t, 3*e.ttl, "d2 follows d1", func() bool { return d2.role("ordered") == "follower" })

	if err := d1.mgr.SetMonotonic(context.Background(), "ordered", false); err != nil {
		t.Fatal(err)
	}
	select {
	case <-let:
	case <-time.After(3 * e.ttl):
		t.Fatal("d2 did not take the lease its leader released while its marks watch held the mark back")
	}
	testutil.Eventually(t, 3*e.ttl, "both dispensers serve the tag as ordinary and its lease record is released", func() bool {
		for _, n := range []*node{d1, d2} {
			if mono, _ := n.mgr.IsMonotonic("ordered"); mono {
				return false
			}
		}
		e, err := d1.mgr.leaders.Get(context.Background(), "ordered")
		var rec leaseRecord
		return err == nil && json.Unmarshal(e.Value(), &rec) == nil && rec.Released
	})
}

// TestPromiseMySQLStore: the same promise with Leaf's leaf_alloc in MariaDB as the
// segment store (the mark lives in KV either way), and a request whose tag differs only
// in case from the monotonic one, which MySQL takes for the same row, is refused by the
// store (segment.ErrTagSpelling), never served out of order.
func TestPromiseMySQLStore(t *testing.T) {
	e := newEnv(t)
	e.mysqlDSN = testenv.MariaDB(t).NewDatabase(t)
	_, _, clients := start3(e, false, 20)
	if _, code, err := request(clients[0], wire.Subjects{Prefix: e.prefix}.IDs(wire.Segment, "Ordered"), 1, 5*time.Second); code != 400 {
		t.Fatalf("request of Ordered beside monotonic ordered = %d, %v; want 400", code, err)
	}
	rec := newRecorder()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	rec.load(ctx, clients, wire.Subjects{Prefix: e.prefix}.IDs(wire.Segment, "ordered"), 12, 5)()
	t.Log(rec.summary())
	if n := rec.check(t); n < 200 {
		t.Fatalf("only %d replies in 2s", n)
	}
}

// TestCheckerCatchesOrdinaryTag runs the same load on an ordinary tag of the same
// three dispensers: each serves it from segments of its own, so replies go back and
// forth across dispensers, and the checker must say so. It shows the checker can see
// what the monotonic tests say never happens.
func TestCheckerCatchesOrdinaryTag(t *testing.T) {
	e := newEnv(t)
	_, _, clients := start3(e, false, 50)
	step := int64(50)
	if _, err := admin(t, clients[0], e.prefix, "add", wire.AddTagRequest{Tag: "plain", Step: &step}); err != nil {
		t.Fatal(err)
	}
	rec := newRecorder()
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	rec.load(ctx, clients, wire.Subjects{Prefix: e.prefix}.IDs(wire.Segment, "plain"), 12, 5)()
	dups, broken, examples := rec.verify()
	t.Logf("%s; %d out of order, e.g. %v", rec.summary(), broken, examples[:min(1, len(examples))])
	if dups != 0 || broken == 0 {
		t.Fatalf("ordinary tag on three dispensers: %d duplicates, %d replies out of order; want 0 and some", dups, broken)
	}
}
