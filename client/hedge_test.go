package client_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/leafbus/leafbus/client"
	"github.com/leafbus/leafbus/testenv"
	"github.com/leafbus/leafbus/wire"
)

// TestHedgingAroundAHungDispenser: of two members of the queue group one takes requests
// and never answers (a paused process). With hedging every request is answered, the
// hung member costing only the hedge delay; without it, the requests NATS routes to the
// hung member time out.
func TestHedgingAroundAHungDispenser(t *testing.T) {
	ns := testenv.StartNATS(t)
	hung := ns.Connect(t)
	if _, err := hung.QueueSubscribe(wire.Subjects{Prefix: wire.DefaultPrefix}.IDsWildcard(wire.Segment), "leaf", func(*nats.Msg) {}); err != nil {
		t.Fatal(err)
	}
	alive := ns.Connect(t)
	next := int64(0)
	if _, err := alive.QueueSubscribe(wire.Subjects{Prefix: wire.DefaultPrefix}.IDsWildcard(wire.Segment), "leaf", func(m *nats.Msg) {
		next++                                                          // one subscription's callbacks run one at a time
		enc, _ := wire.ParseEncoding(m.Header.Get(wire.EncodingHeader)) // as PROTOCOL.md says
		_ = m.Respond(wire.AppendIDs(nil, []int64{next}, enc))
	}); err != nil {
		t.Fatal(err)
	}
	for _, nc := range []*nats.Conn{hung, alive} {
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	const requests = 100
	hedged, err := client.NewClient(ns.Connect(t), client.WithHedge(10*time.Millisecond), client.WithTimeout(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int64]bool{}
	for i := range requests {
		id, err := hedged.Segment(context.Background(), "orders")
		if err != nil {
			t.Fatalf("hedged request %d: %v", i, err)
		}
		if seen[id] {
			t.Fatalf("ID %d twice", id)
		}
		seen[id] = true
	}
	if hedged.Hedged() == 0 {
		t.Errorf("no request was sent again, yet half go to the hung member")
	}
	t.Logf("%d requests, %d sent again", requests, hedged.Hedged())

	plain, err := client.NewClient(ns.Connect(t), client.WithHedge(0), client.WithTimeout(100*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	timeouts := 0
	for range 20 {
		if _, err := plain.Segment(context.Background(), "orders"); errors.Is(err, context.DeadlineExceeded) {
			timeouts++
		}
	}
	if timeouts == 0 {
		t.Errorf("without hedging no request timed out: the test does not exercise the hung member")
	}
}

// TestHedgingNeverRepeatsAdmin: an admin call is sent once, even when unanswered.
func TestHedgingNeverRepeatsAdmin(t *testing.T) {
	ns := testenv.StartNATS(t)
	watcher := ns.Connect(t)
	got := make(chan *nats.Msg, 10)
	if _, err := watcher.ChanSubscribe("leaf.admin.tags.list", got); err != nil {
		t.Fatal(err)
	}
	if err := watcher.Flush(); err != nil {
		t.Fatal(err)
	}
	c, err := client.NewClient(ns.Connect(t), client.WithHedge(5*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if _, err := c.Tags(ctx); err == nil {
		t.Fatal("Tags with nobody answering succeeded")
	}
	if n := len(got); n != 1 {
		t.Errorf("the admin request was sent %d times, want once", n)
	}
}

// TestHedgingReturnsAHeldAnswer: a dispenser that holds requests while its store is down
// and then answers 503 is answered with that 503, not with a timeout, however many
// copies the hedging sent meanwhile.
func TestHedgingReturnsAHeldAnswer(t *testing.T) {
	ns := testenv.StartNATS(t)
	slow := ns.Connect(t)
	if _, err := slow.QueueSubscribe(wire.Subjects{Prefix: wire.DefaultPrefix}.IDsWildcard(wire.Segment), "leaf", func(m *nats.Msg) {
		go func() {
			time.Sleep(300 * time.Millisecond)
			reply := nats.NewMsg(m.Reply)
			reply.Header.Set(wire.ServiceErrorCodeHeader, "503")
			reply.Header.Set(wire.ServiceErrorHeader, "no segment within 300ms")
			_ = slow.PublishMsg(reply)
		}()
	}); err != nil {
		t.Fatal(err)
	}
	if err := slow.Flush(); err != nil {
		t.Fatal(err)
	}
	c, err := client.NewClient(ns.Connect(t), client.WithHedge(20*time.Millisecond), client.WithTimeout(30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, err = c.Segment(context.Background(), "orders")
	if !errors.Is(err, wire.ErrUnavailable) {
		t.Fatalf("Segment = %v after %v, want the dispenser's 503", err, time.Since(start))
	}
	t.Logf("503 after %v with %d copies", time.Since(start), c.Hedged())
}

// TestNoRespondersAskedOnceMore: a request that reaches no member of the queue group
// (a server that briefly knows none while the cluster changes) is asked once more after
// the hedge delay, and gets its answer from a dispenser that came meanwhile; with none,
// the answer is still ErrNoResponders, a hedge delay later.
func TestNoRespondersAskedOnceMore(t *testing.T) {
	ns := testenv.StartNATS(t)
	const hedge = 100 * time.Millisecond
	c, err := client.NewClient(ns.Connect(t), client.WithHedge(hedge), client.WithTimeout(5*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	if _, err := c.Segment(context.Background(), "orders"); !errors.Is(err, nats.ErrNoResponders) {
		t.Fatalf("with no dispenser: %v, want nats.ErrNoResponders", err)
	}
	if took := time.Since(began); took > 20*hedge {
		t.Errorf("with no dispenser the answer took %v", took)
	}
	late := ns.Connect(t)
	time.AfterFunc(hedge/3, func() {
		_, _ = late.QueueSubscribe(wire.Subjects{Prefix: wire.DefaultPrefix}.IDsWildcard(wire.Segment), "leaf", func(m *nats.Msg) {
			enc, _ := wire.ParseEncoding(m.Header.Get(wire.EncodingHeader))
			_ = m.Respond(wire.AppendIDs(nil, []int64{42}, enc))
		})
		_ = late.Flush()
	})
	if id, err := c.Segment(context.Background(), "orders"); err != nil || id != 42 {
		t.Fatalf("a dispenser arriving within the hedge delay: %d, %v; want 42", id, err)
	}
}
