package pools

import (
	"context"
	"errors"
	"slices"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leafbus/leafbus/bus"
	"github.com/leafbus/leafbus/testenv"
)

// TestConsumerLateAck: a batch whose ack was confirmed, but later than half the ack
// wait, is dropped (acked, so never redelivered: a gap), and Next keeps looking.
func TestConsumerLateAck(t *testing.T) {
	ns := testenv.StartNATS(t)
	js := newJS(t, ns)
	spec := Spec{Kind: bus.SegmentKind, Tag: "orders", Size: 10, Depth: 2}
	s := mustNewStream(t, StreamConfig{JetStream: js, Specs: []Spec{spec}, Segments: &countingSource{}})
	runStream(t, s)
	waitCount(t, js, "leaf.pool.segment.orders", 2)

	c := mustConsumer(t, js, bus.SegmentKind, "orders")
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

func TestFetchNoPool(t *testing.T) {
	ns := testenv.StartNATS(t)
	js := newJS(t, ns)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := Fetch(ctx, js, "leaf", bus.SegmentKind, "nothing"); !errors.Is(err, ErrNoPool) {
		t.Fatalf("Fetch without a stream: %v, want ErrNoPool", err)
	}
	s := mustNewStream(t, StreamConfig{JetStream: js, Specs: []Spec{{Kind: bus.SegmentKind, Tag: "orders", Size: 10, Depth: 1}}, Segments: &countingSource{}})
	runStream(t, s)
	waitCount(t, js, "leaf.pool.segment.orders", 1)
	if _, err := Fetch(ctx, js, "leaf", bus.SegmentKind, "other"); !errors.Is(err, ErrNoPool) {
		t.Fatalf("Fetch of a pool without a consumer: %v, want ErrNoPool", err)
	}
	ids, err := Fetch(ctx, js, "leaf", bus.SegmentKind, "orders")
	if err != nil || len(ids) != 10 || ids[0] != 1 {
		t.Fatalf("Fetch(orders): %v, %v; want 1..10", ids, err)
	}
}

func TestParseBatch(t *testing.T) {
	tests := []struct {
		name    string
		body    string
		want    []int64
		wantErr bool
	}{
		{"OK", "1\n2\n30", []int64{1, 2, 30}, false},
		{"OKOne", "9223372036854775807", []int64{9223372036854775807}, false},
		{"ErrEmpty", "", nil, true},
		{"ErrTrailingNewline", "1\n2\n", nil, true},
		{"ErrEmptyLine", "1\n\n2", nil, true},
		{"ErrNotIncreasing", "2\n2", nil, true},
		{"ErrZero", "0\n1", nil, true},
		{"ErrSign", "+1\n2", nil, true},
		{"ErrText", "1\nx", nil, true},
		{"ErrOverflow", "9223372036854775808", nil, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseBatch([]byte(tt.body))
			if (err != nil) != tt.wantErr || !slices.Equal(got, tt.want) {
				t.Fatalf("parseBatch(%q) = %v, %v; want %v, error %v", tt.body, got, err, tt.want, tt.wantErr)
			}
		})
	}
}

// BenchmarkConsumerNext: one job taking 10,000-ID batches (fetch, confirmed ack, parse)
// while one dispenser tops the pool up; ns/op is per batch, ns/ID per ID.
func BenchmarkConsumerNext(b *testing.B) {
	b.ReportAllocs()
	const size = 10_000
	ns := testenv.StartNATS(b)
	js := newJS(b, ns)
	s := mustNewStream(b, StreamConfig{JetStream: js, Specs: []Spec{{Kind: bus.SegmentKind, Tag: "bench", Size: size, Depth: 16}}, Segments: &countingSource{}})
	runStream(b, s)
	waitCount(b, js, "leaf.pool.segment.bench", 16)
	c := mustConsumer(b, newJS(b, ns), bus.SegmentKind, "bench")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := c.Next(ctx); err != nil {
			b.Fatalf("Next: %v", err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*size), "ns/ID")
}
