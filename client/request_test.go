package client_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/leafbus/leafbus/client"
	"github.com/leafbus/leafbus/internal/testutil"
	"github.com/leafbus/leafbus/testenv"
	"github.com/leafbus/leafbus/wire"
)

// TestRequestHeaders: a request for one ID carries no header at all, whatever the
// client's encoding, and reads the text reply; a batch asks for the client's encoding
// (a header only for binary) and reads that.
func TestRequestHeaders(t *testing.T) {
	ns := testenv.StartNATS(t)
	responder := ns.Connect(t)
	var mu sync.Mutex
	var headers []nats.Header
	next := int64(0)
	if _, err := responder.Subscribe(wire.Subjects{Prefix: wire.DefaultPrefix}.IDsWildcard(wire.Segment), func(m *nats.Msg) {
		mu.Lock()
		headers = append(headers, m.Header)
		mu.Unlock()
		enc, err := wire.ParseEncoding(m.Header.Get(wire.EncodingHeader))
		if err != nil {
			t.Errorf("request with encoding header %q", m.Header.Get(wire.EncodingHeader))
		}
		n, err := wire.ParseCount(m.Data, wire.MaxBatchLimit)
		if err != nil {
			t.Errorf("request body %q: %v", m.Data, err)
		}
		ids := make([]int64, n)
		for i := range ids {
			next++
			ids[i] = next
		}
		_ = m.Respond(wire.AppendIDs(nil, ids, enc))
	}); err != nil {
		t.Fatal(err)
	}
	if err := responder.Flush(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, enc := range []wire.Encoding{wire.Text, wire.Binary} {
		t.Run(enc.String(), func(t *testing.T) {
			c := newBufferClient(t, ns.Connect(t), client.WithEncoding(enc), client.WithHedge(0))
			mu.Lock()
			headers = nil
			mu.Unlock()
			if _, err := c.Segment(ctx, "orders"); err != nil {
				t.Fatalf("Segment: %v", err)
			}
			ids, err := c.SegmentN(ctx, "orders", 3)
			if err != nil || len(ids) != 3 {
				t.Fatalf("SegmentN(3) = %v, %v", ids, err)
			}
			mu.Lock()
			defer mu.Unlock()
			if len(headers) != 2 {
				t.Fatalf("%d requests reached the responder, want 2", len(headers))
			}
			if len(headers[0]) != 0 {
				t.Errorf("one-ID request header = %v, want none", headers[0])
			}
			wantBatch := ""
			if enc == wire.Binary {
				wantBatch = "binary"
			}
			if got := headers[1].Get(wire.EncodingHeader); got != wantBatch || len(headers[1]) > 1 {
				t.Errorf("batch request header = %v, want %s %q and nothing else", headers[1], wire.EncodingHeader, wantBatch)
			}
		})
	}
}

// BenchmarkClientOne is an application asking for one ID at a time (Client.Segment, one
// request in flight) from a real service over NATS, everything in this process: ns/op
// is the round trip, allocs/op the client's, the service's and nats.go's together, and
// cpu-ns/op the CPU the whole process spent per request (not just the benchmark's
// share of the machine).
func BenchmarkClientOne(b *testing.B) {
	ns := startBufferDispenser(b)
	for _, enc := range []wire.Encoding{wire.Text, wire.Binary} {
		b.Run(enc.String(), func(b *testing.B) {
			c := newBufferClient(b, ns.Connect(b), client.WithEncoding(enc))
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			if _, err := c.Segment(ctx, "orders"); err != nil { // the first request checks permissions
				b.Fatal(err)
			}
			b.ReportAllocs()
			b.ResetTimer()
			cpu := testutil.ProcessCPU()
			for b.Loop() {
				if _, err := c.Segment(ctx, "orders"); err != nil {
					b.Fatal(err)
				}
			}
			if used := testutil.ProcessCPU() - cpu; cpu > 0 {
				b.ReportMetric(float64(used.Nanoseconds())/float64(b.N), "cpu-ns/op")
			}
		})
	}
}
