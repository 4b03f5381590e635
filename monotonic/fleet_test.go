package monotonic

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"

	"github.com/leafbus/leafbus/internal/testutil"
	"github.com/leafbus/leafbus/wire"
)

// earlyMarkerKV is a real bucket whose watchers send their "initial values done"
// marker after the first `after` entries and hold the rest back for `hold`, as a
// nats.go watcher does on a busy server whose consumer's pending count is stale
// (internal/kvbucket's test makes the marker come early the same way).
type earlyMarkerKV struct {
	jetstream.KeyValue
	after int
	hold  time.Duration
}

func (kv earlyMarkerKV) WatchAll(ctx context.Context, opts ...jetstream.WatchOpt) (jetstream.KeyWatcher, error) {
	w, err := kv.KeyValue.WatchAll(ctx, opts...)
	if err != nil {
		return nil, err
	}
	ew := &earlyWatcher{KeyWatcher: w, out: make(chan jetstream.KeyValueEntry, 64)}
	go ew.relay(kv.after, kv.hold) // ends when w's channel closes (Stop)
	return ew, nil
}

type earlyWatcher struct {
	jetstream.KeyWatcher
	out chan jetstream.KeyValueEntry
}

func (w *earlyWatcher) Updates() <-chan jetstream.KeyValueEntry { return w.out }

func (w *earlyWatcher) relay(after int, hold time.Duration) {
	defer close(w.out)
	n := 0
	for e := range w.KeyWatcher.Updates() {
		if e == nil {
			continue // the real marker: this watcher sent its own
		}
		if n == after {
			w.out <- nil
			time.Sleep(hold)
		}
		w.out <- e
		n++
	}
}

// TestWatchCompleteEarlyMarker: the marks and leases watches of a dispenser whose
// watchers send their marker after the first entry, holding the rest back for seconds.
// When Ready closes, every mark and the live lease are in its view all the same: no
// campaign starts on a view that misses a mark (which would serve a monotonic tag as
// an ordinary one) or a live lease.
func TestWatchCompleteEarlyMarker(t *testing.T) {
	e := newEnv(t)
	js, err := jetstream.New(e.connect(e.urls, "writer"))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	opts, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: e.prefix + "_tagopts", History: 5})
	if err != nil {
		t.Fatal(err)
	}
	leaders, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: e.prefix + "_leaders", TTL: recordTTL(e.ttl)})
	if err != nil {
		t.Fatal(err)
	}
	const marks = 150
	for i := range marks {
		if _, err := opts.Put(ctx, fmt.Sprintf("t%03d", i), []byte(`{"monotonic":true}`)); err != nil {
			t.Fatal(err)
		}
	}
	rec, _ := json.Marshal(leaseRecord{Node: "elsewhere", Instance: "ELSEWHERE", Subject: "_INBOX.elsewhere", TTLMs: e.ttl.Milliseconds()})
	if _, err := leaders.Put(ctx, "t000", rec); err != nil {
		t.Fatal(err)
	}
	const hold = 5 * time.Second
	e.wrapOpts = func(kv jetstream.KeyValue) jetstream.KeyValue { return earlyMarkerKV{kv, 1, hold} }
	e.wrapLeaders = func(_ string, kv jetstream.KeyValue) jetstream.KeyValue { return earlyMarkerKV{kv, 0, hold} }
	started := time.Now()
	n := e.startNode("d1", false, nil)
	if waited := time.Since(started); waited >= hold {
		t.Fatalf("ready after %v: the test needs it ready while the watchers still hold entries back (%v)", waited, hold)
	}
	var missing []string
	for i := range marks {
		tag := fmt.Sprintf("t%03d", i)
		if mono, err := n.mgr.IsMonotonic(tag); err != nil || !mono {
			missing = append(missing, tag)
		}
	}
	if len(missing) > 0 {
		t.Fatalf("at Ready, %d of %d marked tags are not monotonic (watch marker came early): %v", len(missing), marks, missing[:min(len(missing), 10)])
	}
	n.mgr.mu.Lock()
	h := n.mgr.holders["t000"]
	n.mgr.mu.Unlock()
	if h == nil || h.rec.Instance != "ELSEWHERE" {
		t.Fatalf("at Ready, the live lease of t000 is not in the view: %+v", h)
	}
	if role := n.role("t000"); role == "leader" || role == "starting" {
		t.Fatalf("t000 led by the new dispenser (%s) while another's lease is live", role)
	}
}

// laggingKV is a real bucket whose watchers deliver every entry after their marker
// lag late, as the watch of a dispenser on a slow link does.
type laggingKV struct {
	jetstream.KeyValue
	lag time.Duration
}

func (kv laggingKV) WatchAll(ctx context.Context, opts ...jetstream.WatchOpt) (jetstream.KeyWatcher, error) {
	w, err := kv.KeyValue.WatchAll(ctx, opts...)
	if err != nil {
		return nil, err
	}
	lw := &earlyWatcher{KeyWatcher: w, out: make(chan jetstream.KeyValueEntry, 64)}
	go func() {
		defer close(lw.out)
		live := false
		for e := range w.Updates() {
			if live {
				time.Sleep(kv.lag)
			}
			live = live || e == nil
			lw.out <- e
		}
	}()
	return lw, nil
}

// TestMarkWaitsForEveryDispenser: marking a tag answers only once every dispenser took
// the mark in, here one whose watch delivers a second late: right after the answer, it
// serves the tag as monotonic, not from its own buffers. So the promise holds from the
// answer on, and a leader needs no settling time.
func TestMarkWaitsForEveryDispenser(t *testing.T) {
	e := newEnv(t)
	d1 := e.startNode("d1", false, nil)
	const lag = time.Second
	e.wrapOpts = func(kv jetstream.KeyValue) jetstream.KeyValue { return laggingKV{kv, lag} }
	d2 := e.startNode("d2", false, nil)
	nc := e.connect(e.urls, "client")
	step := int64(10)
	if _, err := admin(t, nc, e.prefix, "add", wire.AddTagRequest{Tag: "late", Step: &step}); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	on := true
	if _, err := admin(t, nc, e.prefix, "update", wire.UpdateTagRequest{Tag: "late", Monotonic: &on}); err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	for _, n := range []*node{d1, d2} {
		if mono, err := n.mgr.IsMonotonic("late"); err != nil || !mono {
			t.Fatalf("%s right after the mark was answered (%v): IsMonotonic = %v, %v; want true", n.name, took, mono, err)
		}
	}
	t.Logf("mark answered in %v, with one dispenser's watch %v late", took, lag)
	if took >= e.ttl/2+e.renew {
		t.Fatalf("mark answered in %v: waited out its bound (%v) rather than the late dispenser", took, e.ttl/2)
	}
}

// TestMemoryAcrossLostMarks: a dispenser that led a monotonic tag is stopped, the marks
// bucket is deleted, and it starts again on the same data dir: it still serves the tag
// as monotonic (no lease is left to say so: it released it), and writes the mark back,
// so that a dispenser with an empty data dir and `tag list` see it too.
func TestMemoryAcrossLostMarks(t *testing.T) {
	e := newEnv(t)
	d1 := e.startNode("d1", false, nil)
	nc := e.connect(e.urls, "client")
	addMonotonic(t, nc, e.prefix, "ordered", 10)
	leaderOf(t, "ordered", 3*e.ttl, d1)
	subject := wire.Subjects{Prefix: e.prefix}.IDs(wire.Segment, "ordered")
	before, _, err := request(nc, subject, 3, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	d1.stop()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if err := js.DeleteKeyValue(context.Background(), e.prefix+"_tagopts"); err != nil {
		t.Fatal(err)
	}

	again := e.startNode("d1", false, nil)
	if mono, err := again.mgr.IsMonotonic("ordered"); err != nil || !mono {
		t.Fatalf("restarted on its data dir after the marks were lost: IsMonotonic = %v, %v; want true", mono, err)
	}
	leaderOf(t, "ordered", 3*e.ttl, again)
	after, _, err := request(nc, subject, 3, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if after[0] <= before[2] {
		t.Fatalf("after the restart %v, not above %v", after, before)
	}
	opts, err := js.KeyValue(context.Background(), e.prefix+"_tagopts")
	if err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 5*time.Second, "the mark written back", func() bool {
		e, err := opts.Get(context.Background(), "ordered")
		return err == nil && string(e.Value()) == `{"monotonic":true}`
	})
	fresh := e.startNode("d2", false, nil)
	if mono, err := fresh.mgr.IsMonotonic("ordered"); err != nil || !mono {
		t.Fatalf("a dispenser with an empty data dir: IsMonotonic = %v, %v; want true from the mark written back", mono, err)
	}
	list := tagList(t, nc, e.prefix)
	if !list["ordered"] {
		t.Fatalf("tag list after the marks were lost: %v; want ordered monotonic", list)
	}
}

// tagList asks the admin list and returns each tag's monotonic flag.
func tagList(t testing.TB, nc *nats.Conn, prefix string) map[string]bool {
	t.Helper()
	msg, err := nc.Request(wire.Subjects{Prefix: prefix}.AdminTags("list"), nil, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var tags []wire.TagInfo
	if err := json.Unmarshal(msg.Data, &tags); err != nil {
		t.Fatalf("tag list %q: %v", msg.Data, err)
	}
	out := map[string]bool{}
	for _, info := range tags {
		out[info.Tag] = info.Monotonic
	}
	return out
}

// TestMarkedOrdinaryIsForgotten: `tag update --monotonic=false` is the operator's word:
// every dispenser forgets the tag (its memory file no longer holds it), so a later loss
// of the marks bucket does not bring the mark back, while a delete of the key by hand
// is a loss like any other, and the mark is written back.
func TestMarkedOrdinaryIsForgotten(t *testing.T) {
	e := newEnv(t)
	nodes, _, clients := start3(e, false, 10)
	js, err := jetstream.New(clients[0])
	if err != nil {
		t.Fatal(err)
	}
	opts, err := js.KeyValue(context.Background(), e.prefix+"_tagopts")
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		testutil.Eventually(t, 5*time.Second, n.name+" remembers ordered", func() bool { return remembered(t, e, n.name)["ordered"] })
	}

	// A delete of the key: a loss, written back.
	if err := opts.Delete(context.Background(), "ordered"); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 5*time.Second, "the deleted mark written back", func() bool {
		e, err := opts.Get(context.Background(), "ordered")
		return err == nil && string(e.Value()) == `{"monotonic":true}`
	})

	off := false
	if _, err := admin(t, clients[0], e.prefix, "update", wire.UpdateTagRequest{Tag: "ordered", Monotonic: &off}); err != nil {
		t.Fatal(err)
	}
	for _, n := range nodes {
		testutil.Eventually(t, 10*time.Second, n.name+" forgets ordered", func() bool {
			mono, _ := n.mgr.IsMonotonic("ordered")
			return !mono && !remembered(t, e, n.name)["ordered"]
		})
	}
	// Now the bucket goes: nothing brings the mark back.
	if err := js.DeleteKeyValue(context.Background(), e.prefix+"_tagopts"); err != nil {
		t.Fatal(err)
	}
	nodes[0].stop()
	again := e.startNode(nodes[0].name, false, nil)
	if mono, err := again.mgr.IsMonotonic("ordered"); err != nil || mono {
		t.Fatalf("IsMonotonic after it was marked ordinary and the bucket lost = %v, %v; want false", mono, err)
	}
	if list := tagList(t, clients[0], e.prefix); list["ordered"] {
		t.Fatalf("tag list shows ordered monotonic after it was marked ordinary")
	}
}

// TestMarkOrdinaryAnswersOnceOrdinary: the update that marks a led tag ordinary is
// answered once the dispenser that answers serves the tag as an ordinary tag (its
// leader gave the lease back), so a request right after it gets IDs, not a 503.
func TestMarkOrdinaryAnswersOnceOrdinary(t *testing.T) {
	e := newEnv(t)
	n := e.startNode("d1", false, nil)
	nc := e.connect(e.urls, "client")
	addMonotonic(t, nc, e.prefix, "ordered", 10)
	leaderOf(t, "ordered", 3*e.ttl, n)
	off := false
	if _, err := admin(t, nc, e.prefix, "update", wire.UpdateTagRequest{Tag: "ordered", Monotonic: &off}); err != nil {
		t.Fatal(err)
	}
	if mono, err := n.mgr.IsMonotonic("ordered"); err != nil || mono {
		t.Fatalf("IsMonotonic right after the update to ordinary was answered = %v, %v; want false", mono, err)
	}
	if _, code, err := request(nc, wire.Subjects{Prefix: e.prefix}.IDs(wire.Segment, "ordered"), 2, 5*time.Second); err != nil {
		t.Fatalf("request right after the update to ordinary = %d, %v; want IDs", code, err)
	}
}

// remembered reads the memory file of dispenser name.
func remembered(t testing.TB, e *env, name string) map[string]bool {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(e.dataDir(name), "monotonic.tags"))
	if err != nil {
		t.Fatal(err)
	}
	tags, _, err := decodeMemory(data)
	if err != nil {
		t.Fatal(err)
	}
	return tags
}

// TestLiveLeaseIsMonotonic: a tag with a live lease record is monotonic to a dispenser
// that has no mark of it and remembers nothing (it would otherwise serve it from its
// own buffers while another dispenser leads it); once the record stays unchanged for a
// lease TTL its leader has stopped, and the tag is ordinary again there.
func TestLiveLeaseIsMonotonic(t *testing.T) {
	e := newEnv(t)
	n := e.startNode("d1", false, nil)
	nc := e.connect(e.urls, "writer")
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	leaders, err := js.KeyValue(context.Background(), e.prefix+"_leaders")
	if err != nil {
		t.Fatal(err)
	}
	rec, _ := json.Marshal(leaseRecord{Node: "elsewhere", Instance: "ELSEWHERE", Subject: nc.NewInbox(), TTLMs: e.ttl.Milliseconds()})
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { // renews like a leader
		defer wg.Done()
		tick := time.NewTicker(e.renew)
		defer tick.Stop()
		for {
			_, _ = leaders.Put(context.Background(), "held", rec)
			select {
			case <-stop:
				return
			case <-tick.C:
			}
		}
	}()
	testutil.Eventually(t, 5*time.Second, "held monotonic by its live lease", func() bool {
		mono, err := n.mgr.IsMonotonic("held")
		return err == nil && mono
	})
	if role := n.role("held"); role == "leader" || role == "starting" {
		t.Fatalf("a tag without a mark was led here (%s)", role)
	}
	close(stop)
	wg.Wait()
	stopped := time.Now()
	testutil.Eventually(t, 3*e.ttl, "held ordinary once its record went silent", func() bool {
		mono, err := n.mgr.IsMonotonic("held")
		return err == nil && !mono
	})
	if took := time.Since(stopped); took < e.ttl-e.renew {
		t.Fatalf("held ordinary %v after its last renewal, before a lease TTL (%v) of silence", took, e.ttl)
	}
	if remembered(t, e, "d1")["held"] {
		t.Fatal("a tag monotonic by a lease alone was remembered")
	}
}

// forger writes lease records for a tag, naming an inbox of its own that answers every
// forwarded message with the same low IDs, as a party that can write the bucket might;
// with ping, it also answers $SRV.PING for the instance it names, as if it were a
// dispenser.
type forger struct {
	nc       *nats.Conn
	kv       jetstream.KeyValue
	instance string
	inbox    string
	subs     []*nats.Subscription
	stop     chan struct{}
	done     sync.WaitGroup
	answered atomic.Int64 // forwarded messages it answered
}

func startForger(t *testing.T, e *env, tag string, ping bool) *forger {
	t.Helper()
	f := &forger{nc: e.connect(e.urls, "forger"), instance: "FORGED" + strings.ToUpper(tag), stop: make(chan struct{})}
	js, err := jetstream.New(f.nc)
	if err != nil {
		t.Fatal(err)
	}
	if f.kv, err = js.KeyValue(context.Background(), e.prefix+"_leaders"); err != nil {
		t.Fatal(err)
	}
	f.inbox = f.nc.NewInbox()
	sub, err := f.nc.Subscribe(f.inbox, func(m *nats.Msg) {
		total := 0
		for field := range strings.FieldsSeq(string(m.Data)) {
			var n int
			fmt.Sscan(field, &n)
			total += n
		}
		ids := make([]int64, total)
		for i := range ids {
			ids[i] = int64(i + 1) // the same low IDs every time
		}
		f.answered.Add(1)
		_ = m.Respond(wire.AppendIDs(nil, ids, wire.Binary))
	})
	if err != nil {
		t.Fatal(err)
	}
	f.subs = append(f.subs, sub)
	if ping {
		subject, _ := micro.ControlSubject(micro.PingVerb, e.prefix, f.instance)
		sub, err := f.nc.Subscribe(subject, func(m *nats.Msg) {
			b, _ := json.Marshal(micro.Ping{ServiceIdentity: micro.ServiceIdentity{Name: e.prefix, ID: f.instance, Version: "0.0.1"}, Type: micro.PingResponseType})
			_ = m.Respond(b)
		})
		if err != nil {
			t.Fatal(err)
		}
		f.subs = append(f.subs, sub)
	}
	rec, _ := json.Marshal(leaseRecord{Node: "forger", Instance: f.instance, Subject: f.inbox, TTLMs: time.Hour.Milliseconds()})
	f.done.Add(1)
	go func() {
		defer f.done.Done()
		tick := time.NewTicker(e.renew)
		defer tick.Stop()
		for {
			_, _ = f.kv.Put(context.Background(), tag, rec) // over any record: no compare-and-set
			select {
			case <-f.stop:
				return
			case <-tick.C:
			}
		}
	}()
	return f
}

// leave stops rewriting the record and answering.
func (f *forger) leave() {
	close(f.stop)
	f.done.Wait()
	for _, s := range f.subs {
		_ = s.Unsubscribe()
	}
}

// TestForgedLeaderRecord: under load on three dispensers, a lease record is written
// over the leader's again and again, naming an inbox that answers every forwarded
// message with the same low IDs, and a ttl_ms of an hour. No ID out of order or twice
// reaches a client, and once the forger leaves, the tag is served again within about
// the dispensers' own lease TTL (not the record's hour). With Unverified the record's
// instance answers no $SRV: nothing is forwarded to it. With Verified it answers $SRV
// as if it were a dispenser: its answers are refused, and counted.
func TestForgedLeaderRecord(t *testing.T) {
	for _, tt := range []struct {
		name string
		ping bool
	}{{"Unverified", false}, {"Verified", true}} {
		t.Run(tt.name, func(t *testing.T) {
			e := newEnv(t)
			nodes, _, clients := start3(e, false, 50)
			rec := newRecorder()
			ctx, cancel := context.WithCancel(context.Background())
			wait := rec.load(ctx, clients, wire.Subjects{Prefix: e.prefix}.IDs(wire.Segment, "ordered"), 12, 5)
			time.Sleep(500 * time.Millisecond)
			f := startForger(t, e, "ordered", tt.ping)
			time.Sleep(2 * e.ttl)
			f.leave()
			left := rec.since()
			time.Sleep(2 * e.ttl)
			cancel()
			wait()
			t.Log(rec.summary())
			rec.check(t)
			answered, ok := rec.answeredAfter(left)
			if !ok {
				t.Fatalf("no answer after the forger left: %s", rec.summary())
			}
			t.Logf("served again %v after the forger left (lease TTL %v)", answered-left, e.ttl)
			if answered-left > e.ttl+e.ttl/2 {
				t.Errorf("served again %v after the forger left; want about one lease TTL (%v) at most", answered-left, e.ttl)
			}
			var refused, unverified uint64
			for _, n := range nodes {
				for _, st := range n.mgr.Stats().Tags {
					refused += st.RefusedAnswers
					unverified += st.Unverified
				}
			}
			forged := f.answered.Load()
			t.Logf("forwarded to the forger %d times; refused answers %d, unverified records %d", forged, refused, unverified)
			switch {
			case !tt.ping && (unverified == 0 || forged != 0):
				t.Errorf("unverified forged record: found unverified %d times, forwarded to %d times; want some and none", unverified, forged)
			case tt.ping && (forged == 0 || refused == 0):
				t.Errorf("verified forger: answered %d forwarded messages, %d refused; want some of each", forged, refused)
			}
		})
	}
}

// TestFreshTagServedAtOnce: a tag added monotonic is served as soon as the add was
// answered, without a 503 and without waiting half a lease TTL: its first lease is a
// released record SetMonotonic writes, and every dispenser took the mark in before the
// add was answered. The lease TTL is long (10 s), so that a wait of half of it shows.
func TestFreshTagServedAtOnce(t *testing.T) {
	e := newEnv(t)
	e.ttl, e.renew = 10*time.Second, time.Second
	var nodes []*node
	for i := range 3 {
		nodes = append(nodes, e.startNode(fmt.Sprintf("d%d", i+1), false, nil))
	}
	clients := []*nats.Conn{e.connect(e.urls, "c1"), e.connect(e.urls, "c2"), e.connect(e.urls, "c3")}
	added := time.Now()
	addMonotonic(t, clients[0], e.prefix, "fresh", 20)
	t.Logf("add answered in %v", time.Since(added))
	rec := newRecorder()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	rec.load(ctx, clients, wire.Subjects{Prefix: e.prefix}.IDs(wire.Segment, "fresh"), 12, 5)()
	t.Log(rec.summary())
	rec.check(t)
	if rec.errorsOf(503) > 0 || rec.errorsOf(0) > 0 {
		t.Fatalf("errors on a fresh monotonic tag: %s", rec.summary())
	}
	first, ok := rec.answeredAfter(0)
	if !ok || first > e.ttl/4 {
		t.Fatalf("first answer %v after the load began (ok %v); want well under half a lease TTL (%v)", first, ok, e.ttl/2)
	}
	t.Logf("first answer %v after the add was answered", first)
	leaderOf(t, "fresh", time.Second, nodes...)
}

// TestMarkServedTagUnderLoad: an ordinary tag, served by three dispensers from their
// own buffers under load (small segments, so that requests often wait for a load), is
// marked monotonic while the load goes on. Every reply to a request sent after the
// mark was answered lies above every reply received before that request was sent,
// ordinary ones included, and its first leader settles: it serves no earlier than half
// a lease TTL after it saw the mark, since dispensers that served the tag may still
// answer ordinary requests they took before (a fresh tag's leader serves at once,
// TestFreshTagServedAtOnce).
func TestMarkServedTagUnderLoad(t *testing.T) {
	e := newEnv(t)
	var nodes []*node
	for i := range 3 {
		nodes = append(nodes, e.startNode(fmt.Sprintf("d%d", i+1), false, nil))
	}
	clients := []*nats.Conn{e.connect(e.urls, "c1"), e.connect(e.urls, "c2"), e.connect(e.urls, "c3")}
	step := int64(5)
	if _, err := admin(t, clients[0], e.prefix, "add", wire.AddTagRequest{Tag: "plain", Step: &step}); err != nil {
		t.Fatal(err)
	}
	rec := newRecorder()
	ctx, cancel := context.WithCancel(context.Background())
	wait := rec.load(ctx, clients, wire.Subjects{Prefix: e.prefix}.IDs(wire.Segment, "plain"), 12, 5)
	time.Sleep(time.Second)
	on := true
	marked := time.Now()
	if _, err := admin(t, clients[0], e.prefix, "update", wire.UpdateTagRequest{Tag: "plain", Monotonic: &on}); err != nil {
		t.Fatal(err)
	}
	answered := rec.since()
	t.Logf("mark answered in %v", time.Since(marked))
	leader := leaderOf(t, "plain", 3*e.ttl, nodes...)
	first := leader.term("plain")
	time.Sleep(e.ttl)
	cancel()
	wait()
	t.Log(rec.summary())
	if broken := rec.brokenAfter(answered); len(broken) > 0 {
		t.Fatalf("%d replies to requests sent after the mark was answered are not above a reply received before they were sent: %v", len(broken), broken[:min(len(broken), 5)])
	}
	if first == nil {
		t.Fatal("no term of the leader")
	}
	if settled := first.startsAt() - first.fenceFrom; settled < e.ttl/4 {
		t.Fatalf("the first term of a tag served as ordinary starts %v after its lease allowed: want it to settle (about half a lease TTL, %v)", settled, e.ttl/2)
	}
}

// TestVerifiedLeaderCached: a follower asks $SRV about a leader once per term, not per
// request: a steady load forwarded by two followers costs a few pings in all.
func TestVerifiedLeaderCached(t *testing.T) {
	e := newEnv(t)
	_, leader, clients := start3(e, false, 50)
	var pings atomic.Int64
	spy, err := clients[0].Subscribe("$SRV.PING."+e.prefix+".>", func(*nats.Msg) { pings.Add(1) })
	if err != nil {
		t.Fatal(err)
	}
	defer spy.Unsubscribe()
	if err := clients[0].Flush(); err != nil {
		t.Fatal(err)
	}
	before := pings.Load()
	rec := newRecorder()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	rec.load(ctx, clients, wire.Subjects{Prefix: e.prefix}.IDs(wire.Segment, "ordered"), 12, 5)()
	replies := rec.check(t)
	got := pings.Load() - before
	t.Logf("%s; %d pings of a leader instance during the load; leader %s served %d", rec.summary(), got, leader.name, leader.mgr.Stats().Tags[0].Served)
	if replies < 100 || got > 4 {
		t.Fatalf("%d $SRV pings during a steady load of %d replies: want at least 100 replies, and the leader verified once per term, not per request", got, replies)
	}
}

func TestCheckAnswer(t *testing.T) {
	for _, tt := range []struct {
		name  string
		ids   []int64
		want  int
		floor int64
		ok    bool
	}{
		{"OK", []int64{11, 12, 15}, 3, 10, true},
		{"OKFromZero", []int64{1}, 1, 0, true},
		{"ErrShort", []int64{11, 12}, 3, 10, false},
		{"ErrLong", []int64{11, 12, 13, 14}, 3, 10, false},
		{"ErrAtFloor", []int64{10, 11}, 2, 10, false},
		{"ErrBelowFloor", []int64{3, 4}, 2, 10, false},
		{"ErrNotIncreasing", []int64{11, 13, 12}, 3, 10, false},
		{"ErrRepeated", []int64{11, 11}, 2, 10, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			err := checkAnswer(tt.ids, tt.want, tt.floor)
			if (err == nil) != tt.ok || (err != nil && !errors.Is(err, errBadAnswer)) {
				t.Fatalf("checkAnswer(%v, %d, %d) = %v; want ok %v", tt.ids, tt.want, tt.floor, err, tt.ok)
			}
		})
	}
}

func TestValidInstance(t *testing.T) {
	for in, want := range map[string]bool{
		"": false, "abcDEF0123": true, "a.b": false, "a*": false, ">": false, "a b": false,
		strings.Repeat("a", 64): true, strings.Repeat("a", 65): false,
	} {
		if got := validInstance(in); got != want {
			t.Errorf("validInstance(%q) = %v, want %v", in, got, want)
		}
	}
}

// TestLeafNamedTagMonotonic: a tag of any of Leaf's names (a dot, a colon, Chinese) is
// marked monotonic and served in order by three dispensers: its mark and its lease live
// under the tag's KV key, followers name it in the Leaf-Tag header as its subject token,
// and when its leader stops another takes the lease over, in order still.
func TestLeafNamedTagMonotonic(t *testing.T) {
	e := newEnv(t)
	var nodes []*node
	for i := range 3 {
		nodes = append(nodes, e.startNode(fmt.Sprintf("d%d", i+1), false, nil))
	}
	const tag = "com.acme.order:订单"
	clients := []*nats.Conn{e.connect(e.urls, "c1"), e.connect(e.urls, "c2"), e.connect(e.urls, "c3")}
	addMonotonic(t, clients[0], e.prefix, tag, 20)
	subject := wire.Subjects{Prefix: e.prefix}.IDs(wire.Segment, tag)
	rec := newRecorder()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	rec.load(ctx, clients, subject, 12, 5)()
	leader := leaderOf(t, tag, 5*time.Second, nodes...)
	if _, err := leader.mgr.leaders.Get(context.Background(), wire.TagKey(tag)); err != nil {
		t.Fatalf("the lease of %q under its KV key %q: %v", tag, wire.TagKey(tag), err)
	}
	if _, err := leader.mgr.opts.Get(context.Background(), wire.TagKey(tag)); err != nil {
		t.Fatalf("the mark of %q under its KV key %q: %v", tag, wire.TagKey(tag), err)
	}
	leader.stop()
	var rest []*node
	for _, n := range nodes {
		if n != leader {
			rest = append(rest, n)
		}
	}
	leaderOf(t, tag, 10*time.Second, rest...)
	ctx2, cancel2 := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel2()
	rec.load(ctx2, clients, subject, 12, 5)()
	t.Log(rec.summary())
	if replies := rec.check(t); replies == 0 {
		t.Fatal("no reply for the tag")
	}
}
