package workerid

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/leafbus/leafbus/internal/testutil"
	"github.com/leafbus/leafbus/snowflake"
)

// kvWatchConsumer returns the name of the consumer watching key of bucket, "" when none
// does (yet).
func kvWatchConsumer(tb testing.TB, js jetstream.JetStream, bucket, key string) string {
	tb.Helper()
	ctx := testutil.Context(tb, 5*time.Second)
	st, err := js.Stream(ctx, "KV_"+bucket)
	must(tb, "bind the bucket's stream", err)
	name := ""
	lister := st.ListConsumers(ctx)
	for ci := range lister.Info() {
		if ci.Config.FilterSubject == "$KV."+bucket+"."+key {
			name = ci.Name
		}
	}
	must(tb, "list consumers", lister.Err())
	return name
}

// kvChangeTime is when the server stored the last change of key: the time a change made
// by the test took effect.
func kvChangeTime(tb testing.TB, js jetstream.JetStream, bucket, key string) time.Time {
	tb.Helper()
	ctx := testutil.Context(tb, 5*time.Second)
	st, err := js.Stream(ctx, "KV_"+bucket)
	must(tb, "bind the bucket's stream", err)
	m, err := st.GetLastMsgForSubject(ctx, "$KV."+bucket+"."+key)
	must(tb, "read the last change of "+key, err)
	return m.Time
}

// waitKVWatch waits until a watch on lease key 0 of leaf_leases has a consumer, and
// returns its name.
func waitKVWatch(tb testing.TB, js jetstream.JetStream) string {
	tb.Helper()
	var name string
	testutil.Eventually(tb, 5*time.Second, "the lease watch's consumer", func() bool {
		name = kvWatchConsumer(tb, js, "leaf_leases", "0")
		return name != ""
	})
	return name
}

// A KV lease key deleted, purged or rewritten under its holder stops the holder within
// issue 12's 100 ms, for good: its heartbeat ends with ErrLeaseLost.
func TestKVLeaseWatchStopsHolder(t *testing.T) {
	tests := []struct {
		name   string
		change func(ctx context.Context, kv jetstream.KeyValue) error
	}{
		{"deleted", func(ctx context.Context, kv jetstream.KeyValue) error { return kv.Delete(ctx, "0") }},
		{"purged", func(ctx context.Context, kv jetstream.KeyValue) error { return kv.Purge(ctx, "0") }},
		{"rewritten by another node", func(ctx context.Context, kv jetstream.KeyValue) error {
			_, err := kv.Put(ctx, "0", []byte(`{"node_id":"intruder","token":"not-the-holders"}`))
			return err
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			env := startJS(t)
			ctx := testutil.Context(t, 30*time.Second)
			lease := acquire(t, openKVRegistry(t, env.js, kvConfig("holder", kvMaxWorkerID(0))))
			h := startWatchedHolder(t, lease)
			h.waitWatched(t)
			kv, err := env.js.KeyValue(ctx, "leaf_leases")
			must(t, "bind leases bucket", err)

			refusalAfter(t, h.gen, ErrLeaseLost, func() time.Time {
				must(t, "change the lease key", tt.change(ctx, kv))
				return kvChangeTime(t, env.js, "leaf_leases", "0")
			})
			h.waitRunLost(t)
		})
	}
}

// The holder's own renewals, the key written again after it expired, and its own
// release at a clean stop are not changes under it.
func TestKVLeaseWatchIgnoresOwnWrites(t *testing.T) {
	env := startJS(t)
	lease := acquire(t, openKVRegistry(t, env.js, kvConfig("holder", kvShortTTL)))
	gen := &fakeGen{}
	h := testHeartbeat(t, heartbeatConfig(func(c *HeartbeatConfig) {
		c.Lease, c.Generator, c.Interval = lease, gen, 250*time.Millisecond
	}))
	stop, done := runHeartbeat(t, h)
	testutil.Eventually(t, 10*time.Second, "the lease watch to see the lease", func() bool { return h.Stats().LeaseWatched })
	// Eight renewals of the holder's own key: eight more revisions of it.
	ctx := testutil.Context(t, 30*time.Second)
	kv, err := env.js.KeyValue(ctx, "leaf_leases")
	must(t, "bind leases bucket", err)
	key := strconv.FormatInt(lease.WorkerID(), 10)
	revision := func() uint64 {
		e, err := kv.Get(ctx, key)
		must(t, "get the lease key", err)
		return e.Revision()
	}
	first := revision()
	testutil.Eventually(t, 20*time.Second, "eight renewals of the lease key", func() bool { return revision() >= first+8 })
	select {
	case <-done:
		t.Fatalf("Run ended while the holder renewed its own lease: %v", stop())
	default:
	}
	if _, susp := gen.state(); susp != nil {
		t.Fatalf("generator suspended while the holder renewed its own lease: %v", susp)
	}
	must(t, "Run at a clean stop (it releases the lease)", stop())
	if gen.sawSuspension(ErrLeaseLost) {
		t.Fatalf("suspensions %v: the release counted as a loss", gen.history)
	}
}

// Fail safe: while NATS is down the watch cannot see the lease, so the holder stops
// issuing at once (not at TTL/2), and issues again once the watch, set up afresh, sees
// the lease is still its own.
func TestKVLeaseWatchNATSDown(t *testing.T) {
	env := startJS(t)
	lease := acquire(t, openKVRegistry(t, env.js, kvConfig("holder", kvMaxWorkerID(0))))
	h := startWatchedHolder(t, lease)
	h.waitWatched(t)

	latency := refusalAfter(t, h.gen, ErrLeaseUnverified, now(env.srv.Stop))
	t.Logf("NATS stopped: the holder refused %s later", latency.Round(10*time.Microsecond))
	env.srv.Start()
	start := time.Now()
	testutil.Eventually(t, 15*time.Second, "the holder to issue again", func() bool {
		_, err := h.gen.Next()
		return err == nil
	})
	t.Logf("NATS started again: the holder issued again %s later", time.Since(start).Round(time.Millisecond))
	if st := h.hb.Stats(); st.LeaseLost {
		t.Fatalf("Stats() = %+v: a NATS restart lost the lease", st)
	}
}

// Fail safe: a watch that stops delivering without its connection dropping (its
// consumer deleted on the server) is noticed when it misses the holder's own renewal,
// and set up again.
func TestKVLeaseWatchStalled(t *testing.T) {
	env := startJS(t)
	lease := acquire(t, openKVRegistry(t, env.js, kvConfig("holder", kvMaxWorkerID(0))))
	gen := &fakeGen{}
	h := testHeartbeat(t, heartbeatConfig(func(c *HeartbeatConfig) {
		c.Lease, c.Generator, c.Interval = lease, gen, 250*time.Millisecond
	}))
	runHeartbeat(t, h)
	testutil.Eventually(t, 10*time.Second, "the lease watch to see the lease", func() bool { return h.Stats().LeaseWatched })
	first := waitKVWatch(t, env.js)
	ctx := testutil.Context(t, 30*time.Second)
	st, err := env.js.Stream(ctx, "KV_leaf_leases")
	must(t, "bind the bucket's stream", err)
	must(t, "delete the watch's consumer", st.DeleteConsumer(ctx, first))
	testutil.Eventually(t, 3*kvWatchStale, "a new watch consumer", func() bool {
		name := kvWatchConsumer(t, env.js, "leaf_leases", "0")
		return name != "" && name != first
	})
	testutil.Eventually(t, 5*time.Second, "the generator to issue", func() bool {
		_, susp := gen.state()
		return susp == nil
	})
	testutil.Eventually(t, 5*time.Second, "the new watch to see the lease", func() bool { return h.Stats().LeaseWatched })
	if !gen.sawSuspension(ErrLeaseUnverified) {
		t.Fatalf("suspensions %v: the stalled watch never suspended the generator", gen.history)
	}
	if st := h.Stats(); st.LeaseLost {
		t.Fatalf("Stats() = %+v: a stalled watch lost the lease", st)
	}
}

// The ID is safe with a watching holder: after the key is deleted another node takes
// the ID, and by then the first holder has stopped.
func TestKVLeaseWatchTakeover(t *testing.T) {
	env := startJS(t)
	ctx := testutil.Context(t, 30*time.Second)
	lease := acquire(t, openKVRegistry(t, env.js, kvConfig("a", kvMaxWorkerID(0))))
	h := startWatchedHolder(t, lease)
	h.waitWatched(t)
	kv, err := env.js.KeyValue(ctx, "leaf_leases")
	must(t, "bind leases bucket", err)
	must(t, "delete the lease key", kv.Delete(ctx, "0"))
	other := acquire(t, openKVRegistry(t, env.js, kvConfig("b", kvMaxWorkerID(0))))
	if other.WorkerID() != lease.WorkerID() || other.Recorded() == 0 {
		t.Fatalf("b got worker ID %d with record %d, want a's %d with a's record", other.WorkerID(), other.Recorded(), lease.WorkerID())
	}
	// b's guard waits past a's record + interval + borrow-max (4 s) before b issues; a
	// must have stopped long before.
	testutil.Eventually(t, time.Second, "a to refuse", func() bool {
		_, err = h.gen.Next()
		return err != nil
	})
	if !errors.Is(err, snowflake.ErrSuspended) || !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("a's Next once b holds its worker ID: %v, want ErrSuspended and ErrLeaseLost", err)
	}
	h.waitRunLost(t)
}
