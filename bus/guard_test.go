package bus

import (
	"context"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/leafbus/leafbus/core"
	"github.com/leafbus/leafbus/segment"
	"github.com/leafbus/leafbus/snowflake"
	"github.com/leafbus/leafbus/testenv"
)

// startGuardedService runs a service with segment tag "orders" and snowflake IDs on a
// fresh NATS server with JetStream, and returns the server and a plain client.
func startGuardedService(t *testing.T) (*testenv.NATS, *nats.Conn, *Service) {
	t.Helper()
	ns := testenv.StartNATS(t)
	ctx, cancel := context.WithCancel(context.Background())
	store := segment.NewInmemStore()
	if _, err := store.AddTag(ctx, segment.Tag{Name: "orders", MaxID: 1, Step: 1000}); err != nil {
		t.Fatalf("AddTag: %v", err)
	}
	segCfg := segment.DefaultConfig()
	segCfg.Store = store
	segs, err := segment.New(segCfg)
	if err != nil {
		t.Fatalf("segment.New: %v", err)
	}
	ran := make(chan struct{})
	go func() { defer close(ran); segs.Run(ctx) }()
	select {
	case <-segs.Ready():
	case <-time.After(5 * time.Second):
		t.Fatal("segment generator not ready within 5s")
	}
	sfs, err := snowflake.New(snowflake.Config{WorkerID: 1})
	if err != nil {
		t.Fatalf("snowflake.New: %v", err)
	}
	cfg := DefaultConfig()
	cfg.Core = newCore(t, func(c *core.Config) { c.Segments, c.Snowflakes, c.Tags = segs, sfs, store })
	svc, err := New(ns.Connect(t), cfg)
	if err != nil {
		t.Fatalf("bus.New: %v", err)
	}
	t.Cleanup(func() {
		if err := svc.Stop(); err != nil {
			t.Errorf("service stop: %v", err)
		}
		cancel()
		<-ran
	})
	return ns, ns.Connect(t), svc
}

// TestReplyGuardDropsForbiddenTargets aims each endpoint's reply at every kind of
// subject a reply must never reach and checks that nothing is published there, that
// the real JetStream state is untouched, and that each drop is counted; a request
// with an ordinary inbox right after still gets its answer (the handler of an endpoint
// runs serially, so by then the forbidden one was handled).
func TestReplyGuardDropsForbiddenTargets(t *testing.T) {
	ns, nc, svc := startGuardedService(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("jetstream.New: %v", err)
	}
	segKV, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "leaf_segments"})
	if err != nil {
		t.Fatalf("create leaf_segments: %v", err)
	}
	if _, err := segKV.Put(ctx, "orders", []byte(`{"max_id":5000}`)); err != nil {
		t.Fatalf("put: %v", err)
	}
	if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "leaf_leases"}); err != nil {
		t.Fatalf("create leaf_leases: %v", err)
	}
	targets := []string{
		"$KV.leaf_segments.orders",
		"$JS.API.STREAM.PURGE.KV_leaf_leases",
		"$JS.API.STREAM.DELETE.KV_leaf_segments",
		"$SYS.REQ.SERVER.PING",
		"$SRV.PING",
		"$O.store.C.x",
		"leaf.segment.orders",
		"leaf.pool.segment.orders",
		"leaf.admin.tags.update",
	}
	requests := []struct{ endpoint, subject, body string }{
		{"segment", "leaf.segment.orders", ""},
		{"snowflake", "leaf.snowflake.any", "3"},
		{"decode", "leaf.decode.snowflake", "1860000000000000000"},
		{"tags-update", "leaf.admin.tags.update", `{"tag":"orders","step":1}`},
	}
	// A witness on every forbidden subject: whatever reaches it is a reply that got out.
	leaked := make(chan *nats.Msg, 64)
	witness := ns.Connect(t)
	for _, target := range targets {
		if _, err := witness.ChanSubscribe(target, leaked); err != nil {
			t.Fatalf("subscribe %s: %v", target, err)
		}
	}
	if err := witness.Flush(); err != nil {
		t.Fatal(err)
	}
	for _, r := range requests {
		for _, target := range targets {
			if err := nc.PublishRequest(r.subject, target, []byte(r.body)); err != nil {
				t.Fatalf("publish %s reply %s: %v", r.subject, target, err)
			}
		}
		// The same endpoint still answers an inbox.
		if r.endpoint != "tags-update" {
			if _, err := nc.Request(r.subject, []byte(r.body), 5*time.Second); err != nil {
				t.Fatalf("%s with an inbox: %v", r.subject, err)
			}
		}
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	// Every forbidden request is counted once it was handled; wait for the counts.
	deadline := time.Now().Add(10 * time.Second)
	for _, r := range requests {
		refused := &svc.endpoint(r.endpoint).refused
		for refused.Load() < uint64(len(targets)) {
			if time.Now().After(deadline) {
				t.Fatalf("endpoint %s: %d refused replies counted, want %d", r.endpoint, refused.Load(), len(targets))
			}
			time.Sleep(5 * time.Millisecond)
		}
	}
	if err := witness.Flush(); err != nil {
		t.Fatal(err)
	}
	// The witness also sees this test's own requests on the prefix's subjects; those
	// carry a reply subject, and a dispenser's reply never does.
	for len(leaked) > 0 {
		if m := <-leaked; m.Reply == "" {
			t.Fatalf("a reply reached %s (body %q, headers %v)", m.Subject, m.Data, m.Header)
		}
	}
	// The stores are as they were: the tag row, the leases bucket, the step.
	e, err := segKV.Get(ctx, "orders")
	if err != nil || string(e.Value()) != `{"max_id":5000}` || e.Revision() != 1 {
		t.Errorf("leaf_segments orders after the deputy replies: %v, %v; want the original value at revision 1", e, err)
	}
	if _, err := js.KeyValue(ctx, "leaf_leases"); err != nil {
		t.Errorf("leaf_leases after the deputy replies: %v", err)
	}
	if st := svc.endpointStats(svc.endpoint("segment")); st == nil || st.(map[string]any)["refused_replies"] != uint64(len(targets)) {
		t.Errorf("segment endpoint stats %v: want refused_replies %d", st, len(targets))
	}
	// The update asked with forbidden replies never ran: each was dropped before it.
	tags, err := svc.core.ListTags(ctx)
	if err != nil || len(tags) != 1 || tags[0].Step != 1000 {
		t.Errorf("tags after dropped updates: %+v, %v; want orders with step 1000", tags, err)
	}
}

// TestReplyGuardLogsAtARate: a flood of refused replies gives one log line per period
// that says how many were dropped, not one line each.
func TestReplyGuardLogsAtARate(t *testing.T) {
	var lines []uint64
	now := int64(0)
	g := &replyGuard{
		allowed:  func(string) bool { return false },
		logEvery: time.Minute,
		nowNanos: func() int64 { return now },
		log:      func(_, _, _ string, n uint64) { lines = append(lines, n) },
	}
	var refused atomic.Uint64
	for i := range 10 {
		now = int64(time.Minute) + int64(i)*int64(time.Second)
		if g.allow("segment", &refused, "leaf.segment.orders", "$KV.x."+strconv.Itoa(i)) {
			t.Fatal("a refused reply allowed")
		}
	}
	now = 3 * int64(time.Minute)
	if g.allow("segment", &refused, "leaf.segment.orders", "$JS.y") {
		t.Fatal("a refused reply allowed")
	}
	if refused.Load() != 11 {
		t.Errorf("refused %d, want 11", refused.Load())
	}
	if len(lines) != 2 || lines[0] != 1 || lines[1] != 10 {
		t.Errorf("log lines with counts %v, want [1 10]", lines)
	}
}
