package monotonic

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/leafbus/leafbus/internal/testutil"
	"github.com/leafbus/leafbus/wire"
)

// faultRun runs load on the tag "ordered" of three dispensers behind proxies, applies
// fault to the leader once 100 requests were answered, and keeps the load going until
// 100 requests sent after the fault were answered (at most after). It checks the
// promise over everything the clients got and returns the recorder and when (on its
// clock) the fault happened.
func faultRun(t *testing.T, e *env, fault func(nodes []*node, leader *node), after time.Duration) (*recorder, time.Duration, []*node, *node) {
	t.Helper()
	nodes, leader, clients := start3(e, true, 50)
	rec := newRecorder()
	ctx, cancel := context.WithCancel(context.Background())
	wait := rec.load(ctx, clients, wire.Subjects{Prefix: e.prefix}.IDs(wire.Segment, "ordered"), 12, 5)
	rec.waitAnswers(t, 0, 100, 20*time.Second)
	at := rec.since()
	fault(nodes, leader)
	rec.waitAnswers(t, rec.since(), 100, after+10*e.ttl)
	cancel()
	wait()
	t.Log(rec.summary())
	rec.check(t)
	return rec, at, nodes, leader
}

// TestLeaderKilled: the leader's connections are cut at once, as by kill -9, without
// releasing its lease. Another dispenser leads within 2 x TTL and the promise holds
// throughout.
func TestLeaderKilled(t *testing.T) {
	e := newEnv(t)
	rec, at, nodes, leader := faultRun(t, e, func(_ []*node, leader *node) { leader.kill() }, 3*e.ttl)
	answered, ok := rec.answeredAfter(at)
	if !ok {
		t.Fatalf("no answer after the leader was killed: %s", rec.summary())
	}
	failover := answered - at
	t.Logf("failover after kill: %v (lease TTL %v, %.2f x TTL)", failover, e.ttl, failover.Seconds()/e.ttl.Seconds())
	if failover > 2*e.ttl {
		t.Errorf("failover took %v, want at most 2 x TTL = %v", failover, 2*e.ttl)
	}
	var others []*node
	for _, n := range nodes {
		if n != leader {
			others = append(others, n)
		}
	}
	leaderOf(t, "ordered", time.Second, others...)
}

// TestLeaderPaused: every byte to and from the leader is held for 1.5 x TTL, as when
// its process is stopped (SIGSTOP) past its lease, then let through (SIGCONT): the
// requests it held arrive late and the answers it had sent leave late. Another
// dispenser leads meanwhile; the old leader serves nothing from its old term after its
// lease ran out, and the promise holds throughout.
func TestLeaderPaused(t *testing.T) {
	e := newEnv(t)
	var oldTerm *term
	var served uint64 // the old term's requests when the held bytes were let through
	rec, at, _, leader := faultRun(t, e, func(_ []*node, leader *node) {
		oldTerm = leader.term("ordered")
		leader.proxy.Pause()
		time.Sleep(3 * e.ttl / 2)
		served = oldTerm.served.Load()
		leader.proxy.Resume() // the requests it held arrive now, its lease long gone
	}, 2*e.ttl)
	testutil.Eventually(t, 10*e.ttl, "the paused leader no longer serving from its old term", func() bool {
		return !oldTerm.serving(leader.mgr.now()) && leader.term("ordered") != oldTerm
	})
	if answered, ok := rec.answeredAfter(at); ok {
		t.Logf("answers again %v after the pause began (lease TTL %v)", answered-at, e.ttl)
	} else {
		t.Fatalf("no answer after the pause: %s", rec.summary())
	}
	if got := oldTerm.served.Load(); got != served {
		t.Fatalf("the old term served %d requests after the pause, its lease gone", got-served)
	}
}

// term returns n's current term of tag, or nil.
func (n *node) term(tag string) *term {
	if ts := (*n.mgr.states.Load())[tag]; ts != nil {
		return ts.term.Load()
	}
	return nil
}

// TestGracefulHandover: a leader that stops releases its lease after it stopped
// serving, and another dispenser leads at once, without waiting out a lease.
func TestGracefulHandover(t *testing.T) {
	e := newEnv(t)
	var stopped time.Time
	rec, _, _, _ := faultRun(t, e, func(_ []*node, leader *node) {
		leader.stop()
		stopped = time.Now()
	}, 3*e.ttl)
	// Requests sent once the old leader is gone can only be served by a new one (the
	// stopping leader still answers what it holds, so the fault's start says nothing).
	since := stopped.Sub(rec.start)
	answered, ok := rec.answeredAfter(since)
	if !ok {
		t.Fatalf("no answer to a request sent after the leader stopped: %s", rec.summary())
	}
	t.Logf("handover after a graceful stop: %v (lease TTL %v)", answered-since, e.ttl)
	// A lease taken over without its release waits a whole TTL of silence and then half
	// a TTL more; a released one is taken at once. Under a TTL tells the two apart on a
	// loaded machine.
	if answered-since >= e.ttl {
		t.Errorf("handover took %v, want well under the lease TTL %v: the released record was not taken over at once", answered-since, e.ttl)
	}
}

// shiftClock is the system clock plus an offset a test moves forward.
type shiftClock struct{ offset atomic.Int64 }

func (c *shiftClock) now() time.Time       { return time.Now().Add(time.Duration(c.offset.Load())) }
func (c *shiftClock) skip(d time.Duration) { c.offset.Add(int64(d)) }

// TestPausedLeaderNeedsNewLease: the leader's clock jumps past its lease at once, as it
// does for a process resumed after a pause, before its renewal loop has run: the very
// next request gets nothing from the old term, and IDs come again only from a new
// lease, with a fresh segment above everything the store had granted.
func TestPausedLeaderNeedsNewLease(t *testing.T) {
	e := newEnv(t)
	clock := &shiftClock{}
	leader := e.startNode("d1", false, func(c *Config) { c.Now = clock.now })
	nc := e.connect(e.urls, "client")
	addMonotonic(t, nc, e.prefix, "ordered", 10)
	leaderOf(t, "ordered", 3*e.ttl, leader)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	before := make([]int64, 3)
	if err := leader.mgr.Fill(ctx, "ordered", before); err != nil {
		t.Fatal(err)
	}
	old := leader.term("ordered")
	served := old.served.Load()
	infoBefore, err := admin(t, nc, e.prefix, "update", wire.UpdateTagRequest{Tag: "ordered", Monotonic: ptr(true)})
	if err != nil {
		t.Fatal(err)
	}

	clock.skip(e.ttl)
	if ok, err := leader.mgr.TryFill("ordered", make([]int64, 1)); ok || err != nil {
		t.Fatalf("TryFill right after the pause = %v, %v; want false", ok, err)
	}
	after := make([]int64, 3)
	testutil.Eventually(t, 3*e.ttl, "IDs from a new lease", func() bool {
		return leader.mgr.Fill(ctx, "ordered", after) == nil
	})
	if old.served.Load() != served {
		t.Fatalf("the old term served %d more requests after its lease ran out", old.served.Load()-served)
	}
	if leader.term("ordered") == old || leader.mgr.Stats().Tags[0].Terms < 2 {
		t.Fatalf("IDs %v came without a new lease", after)
	}
	if after[0] < infoBefore.MaxID {
		t.Fatalf("first ID of the new lease %d is below the store's max_id %d before the pause: not a fresh segment", after[0], infoBefore.MaxID)
	}
	t.Logf("before the pause %v, after %v (store max_id before %d)", before, after, infoBefore.MaxID)
}

func ptr[T any](v T) *T { return &v }

// blockingKV is a KV bucket whose writes fail while blocked, as when a leader cannot
// reach JetStream while everything else about it works.
type blockingKV struct {
	jetstream.KeyValue
	blocked atomic.Bool
}

var errBlocked = errors.New("test: KV writes blocked")

func (b *blockingKV) Update(ctx context.Context, key string, value []byte, rev uint64) (uint64, error) {
	if b.blocked.Load() {
		return 0, errBlocked
	}
	return b.KeyValue.Update(ctx, key, value, rev)
}

func (b *blockingKV) Create(ctx context.Context, key string, value []byte, opts ...jetstream.KVCreateOpt) (uint64, error) {
	if b.blocked.Load() {
		return 0, errBlocked
	}
	return b.KeyValue.Create(ctx, key, value, opts...)
}

// TestRenewalsBlocked: the leader's lease writes fail while it keeps receiving and
// forwarding requests. It must stop serving at half the TTL, before anyone may take
// the lease over (a whole TTL of silence); the promise holds throughout, and after
// the writes work again it follows the new leader.
func TestRenewalsBlocked(t *testing.T) {
	e := newEnv(t)
	kvs := map[string]*blockingKV{}
	e.wrapLeaders = func(node string, kv jetstream.KeyValue) jetstream.KeyValue {
		kvs[node] = &blockingKV{KeyValue: kv}
		return kvs[node]
	}
	_, leader, clients := start3(e, false, 50)
	rec := newRecorder()
	ctx, cancel := context.WithCancel(context.Background())
	wait := rec.load(ctx, clients, wire.Subjects{Prefix: e.prefix}.IDs(wire.Segment, "ordered"), 12, 5)
	rec.waitAnswers(t, 0, 100, 20*time.Second)
	old := leader.term("ordered")
	at := rec.since()
	kvs[leader.name].blocked.Store(true)
	// Its last renewal that succeeded was sent at most a renew interval ago: by TTL/2
	// after that the term stops serving, and serves nothing from then on.
	stops := e.ttl/2 + e.renew
	time.Sleep(stops)
	servedAtStop := old.served.Load()
	time.Sleep(2*e.ttl - stops)
	if got := old.served.Load(); got != servedAtStop {
		t.Errorf("the term whose renewals failed served %d requests more than TTL/2 after its last renewal", got-servedAtStop)
	}
	kvs[leader.name].blocked.Store(false)
	rec.waitAnswers(t, rec.since(), 100, 10*e.ttl)
	cancel()
	wait()
	t.Log(rec.summary())
	rec.check(t)
	if old.serving(leader.mgr.now()) {
		t.Fatal("the leader whose renewals failed still serves its term")
	}
	answered, ok := rec.answeredAfter(at + e.ttl/2)
	if !ok {
		t.Fatalf("no answer after the leader's renewals failed: %s", rec.summary())
	}
	t.Logf("answers again %v after the renewals began to fail (lease TTL %v)", answered-at, e.ttl)
}

// TestLeasesBucketLost: the leases bucket is deleted under running dispensers (an
// operator, or a JetStream that lost its store). The renewals fail, so the leader stops
// serving; the watch finds the bucket gone and creates it again, and a leader serves
// the tag again, in order, without a restart.
func TestLeasesBucketLost(t *testing.T) {
	e := newEnv(t)
	nodes, leader, clients := start3(e, false, 50)
	subject := wire.Subjects{Prefix: e.prefix}.IDs(wire.Segment, "ordered")
	before, _, err := request(clients[0], subject, 1, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(clients[0])
	if err != nil {
		t.Fatal(err)
	}
	if err := js.DeleteKeyValue(context.Background(), leader.mgr.leadersCfg.Bucket); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 10*e.ttl, "the leases bucket created again", func() bool {
		_, err := js.KeyValue(context.Background(), leader.mgr.leadersCfg.Bucket)
		return err == nil
	})
	// The old term ends TTL/2 after its last renewal; a leader serving after a TTL has
	// taken its lease in the new bucket.
	time.Sleep(e.ttl)
	var after []int64
	testutil.Eventually(t, 10*e.ttl, "the tag served again after its leases bucket was lost", func() bool {
		after, _, err = request(clients[1], subject, 1, time.Second)
		return err == nil
	})
	if after[0] <= before[0] {
		t.Fatalf("first ID after the bucket came back = %d, not above %d", after[0], before[0])
	}
	leaderOf(t, "ordered", 3*e.ttl, nodes...)
	if st, err := js.KeyValue(context.Background(), leader.mgr.leadersCfg.Bucket); err != nil {
		t.Fatal(err)
	} else if _, err := st.Get(context.Background(), "ordered"); err != nil {
		t.Fatalf("no lease record in the new bucket: %v", err)
	}
}
