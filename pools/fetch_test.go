package pools

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/leafbus/leafbus/client"
	"github.com/leafbus/leafbus/internal/testutil"
	"github.com/leafbus/leafbus/testenv"
	"github.com/leafbus/leafbus/wire"
)

func TestFetchNoPool(t *testing.T) {
	ns := testenv.StartNATS(t)
	js := newJS(t, ns)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := client.Fetch(ctx, js, "leaf", wire.Segment, "nothing"); !errors.Is(err, client.ErrNoPool) {
		t.Fatalf("Fetch without a stream: %v, want client.ErrNoPool", err)
	}
	s := mustNewStream(t, StreamConfig{JetStream: js, Specs: []Spec{{Kind: wire.Segment, Tag: "orders", Size: 10, Depth: 1}}, Segments: &countingSource{}})
	testutil.Run(t, "Stream.Run", s.Run)
	waitCount(t, js, "leaf.pool.segment.orders", 1)
	if _, err := client.Fetch(ctx, js, "leaf", wire.Segment, "other"); !errors.Is(err, client.ErrNoPool) {
		t.Fatalf("Fetch of a pool without a consumer: %v, want client.ErrNoPool", err)
	}
	ids, err := client.Fetch(ctx, js, "leaf", wire.Segment, "orders")
	if err != nil || len(ids) != 10 || ids[0] != 1 {
		t.Fatalf("Fetch(orders): %v, %v; want 1..10", ids, err)
	}
}

// BenchmarkConsumerNext: one job taking 10,000-ID batches (fetch, confirmed ack, parse)
// while one dispenser tops the pool up; ns/op is per batch, ns/ID per ID.
func BenchmarkConsumerNext(b *testing.B) {
	b.ReportAllocs()
	const size = 10_000
	ns := testenv.StartNATS(b)
	js := newJS(b, ns)
	s := mustNewStream(b, StreamConfig{JetStream: js, Specs: []Spec{{Kind: wire.Segment, Tag: "bench", Size: size, Depth: 16}}, Segments: &countingSource{}})
	testutil.Run(b, "Stream.Run", s.Run)
	waitCount(b, js, "leaf.pool.segment.bench", 16)
	c := mustConsumer(b, newJS(b, ns), wire.Segment, "bench")
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
