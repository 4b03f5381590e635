package client

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/leafbus/leafbus/testenv"
	"github.com/leafbus/leafbus/wire"
)

// testAckWait is the pool consumer's ack wait here: short, so the test is quick.
const testAckWait = 2 * time.Second

// poolWithBatches makes the pool stream of prefix "leaf" by hand, as the dispensers
// lay it out (PROTOCOL.md "Bulk batches"), with the consumer of segment:tag holding n
// batches of ten IDs.
func poolWithBatches(tb testing.TB, tag string, n int) jetstream.JetStream {
	tb.Helper()
	ns := testenv.StartNATS(tb)
	nc := ns.Connect(tb)
	js, err := jetstream.New(nc)
	if err != nil {
		tb.Fatalf("jetstream.New: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sub := wire.Subjects{Prefix: "leaf"}
	st, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: sub.PoolStream(), Subjects: []string{"leaf.pool.>"}, Retention: jetstream.WorkQueuePolicy})
	if err != nil {
		tb.Fatalf("create pool stream: %v", err)
	}
	subject := sub.Pool(wire.Segment, tag)
	if _, err := st.CreateConsumer(ctx, jetstream.ConsumerConfig{Durable: wire.PoolConsumer(wire.Segment, tag), FilterSubject: subject, AckPolicy: jetstream.AckExplicitPolicy, AckWait: testAckWait}); err != nil {
		tb.Fatalf("create pool consumer: %v", err)
	}
	for i := range n {
		ids := make([]int64, 10)
		for j := range ids {
			ids[j] = int64(i*10 + j + 1)
		}
		if _, err := js.Publish(ctx, subject, wire.AppendIDs(nil, ids, wire.Text)); err != nil {
			tb.Fatalf("publish batch %d: %v", i, err)
		}
	}
	return js
}

// TestConsumerLateAck: a batch whose ack was confirmed, but later than half the ack
// wait, is dropped (acked, so never redelivered: a gap), and Next keeps looking.
func TestConsumerLateAck(t *testing.T) {
	js := poolWithBatches(t, "orders", 2)
	ctx0, cancel0 := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel0()
	c, err := NewConsumer(ctx0, js, "leaf", wire.Segment, "orders")
	if err != nil {
		t.Fatalf("NewConsumer: %v", err)
	}
	if c.window != testAckWait/2 {
		t.Fatalf("window %v, want half the ack wait %v", c.window, testAckWait/2)
	}
	// A clock on which the ack's confirmation always lands at the window's end.
	var calls atomic.Int64
	c.since = func(time.Time) time.Duration {
		if calls.Add(1)%2 == 0 {
			return c.window
		}
		return 0
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if ids, err := c.Next(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Next with late acks: got %d IDs, %v; want context.DeadlineExceeded", len(ids), err)
	}
	st := c.Stats()
	if st.Dropped == 0 || st.Used != 0 {
		t.Fatalf("Consumer.Stats: %+v, want some dropped, none used", st)
	}
	ictx, icancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer icancel()
	info, err := c.cons.Info(ictx)
	if err != nil {
		t.Fatalf("consumer info: %v", err)
	}
	// Every dropped batch was acked, in delivery order. The last pull, cut short by the
	// deadline, may have left one more delivered and unacked: it comes back after the
	// ack wait, to be used once.
	if info.AckFloor.Consumer != st.Dropped || info.NumAckPending > 1 || info.NumRedelivered != 0 {
		t.Errorf("consumer info: ack floor %d, %d ack pending, %d redelivered; want %d (the dropped batches), at most 1, 0",
			info.AckFloor.Consumer, info.NumAckPending, info.NumRedelivered, st.Dropped)
	}
}
