package bus

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/leafbus/leafbus/core"
	"github.com/leafbus/leafbus/metrics"
	"github.com/leafbus/leafbus/segment"
	"github.com/leafbus/leafbus/testenv"
)

// countingSegments hands out consecutive IDs from memory for every tag but "late"
// (not in memory: Fill has them) and "gone" (not in memory, and the store has no such
// tag).
type countingSegments struct{ next atomic.Int64 }

func (c *countingSegments) TryFill(tag string, dst []int64) (bool, error) {
	if tag == "late" || tag == "gone" {
		return false, nil
	}
	c.fill(dst)
	return true, nil
}

func (c *countingSegments) Fill(_ context.Context, tag string, dst []int64) error {
	if tag == "gone" {
		return fmt.Errorf("segment: tag %q: %w", tag, segment.ErrTagNotFound)
	}
	c.fill(dst)
	return nil
}

func (c *countingSegments) fill(dst []int64) {
	last := c.next.Add(int64(len(dst)))
	for i := range dst {
		dst[i] = last - int64(len(dst)) + int64(i) + 1
	}
}

// observation is one Observe call.
type observation struct {
	transport, kind string
	code, ids       int
}

// recorder is an Observer that keeps every call.
type recorder struct {
	mu       sync.Mutex
	seen     []observation
	rejected atomic.Int64
}

func (r *recorder) Observe(transport, kind string, code int, seconds float64, ids int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if seconds < 0 || seconds > 10 {
		code = -1 // shows as a mismatch
	}
	r.seen = append(r.seen, observation{transport, kind, code, ids})
}

func (r *recorder) Rejected(transport string) { r.rejected.Add(1) }

func (r *recorder) observations() []observation {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.seen)
}

var _ Observer = (*metrics.Metrics)(nil)

// TestObserver: every answer of the ID and decode endpoints is observed once, with its
// kind, code and IDs: from memory, from a pool-less batch, off the delivery goroutine
// (success and error), bad requests and decode; admin calls are not.
func TestObserver(t *testing.T) {
	ns := testenv.StartNATS(t)
	rec := &recorder{}
	cfg := DefaultConfig()
	cfg.Core = newCore(t, func(c *core.Config) { c.Segments = &countingSegments{} })
	cfg.Observer = rec
	cfg.Metadata = map[string]string{"node_id": "n1", "worker_id": "7", "max_batch": "1"}
	svc, err := New(ns.Connect(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { svc.Stop() })
	nc := ns.Connect(t)
	want := []observation{}
	for _, r := range []struct {
		subject, body string
		want          observation
	}{
		{"leaf.segment.orders", "", observation{"nats", "segment", 200, 1}},
		{"leaf.segment.orders", "5", observation{"nats", "segment", 200, 5}},
		{"leaf.segment.orders", "abc", observation{"nats", "segment", 400, 0}},
		{"leaf.segment.late", "3", observation{"nats", "segment", 200, 3}},
		{"leaf.segment.gone", "", observation{"nats", "segment", 404, 0}},
		{"leaf.snowflake.any", "", observation{"nats", "snowflake", 503, 0}}, // no snowflake source
		{"leaf.decode.snowflake", "1860000000000000000", observation{"nats", "decode", 200, 0}},
		{"leaf.decode.snowflake", "-1", observation{"nats", "decode", 400, 0}},
		{"leaf.admin.tags.list", "", observation{}},
	} {
		if _, err := nc.Request(r.subject, []byte(r.body), 5*time.Second); err != nil {
			t.Fatalf("request %s %q: %v", r.subject, r.body, err)
		}
		if r.want != (observation{}) {
			want = append(want, r.want)
		}
		// An answer off the delivery goroutine is observed just after it is sent.
		deadline := time.Now().Add(5 * time.Second)
		for len(rec.observations()) < len(want) && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
	}
	if got := rec.observations(); !slices.Equal(got, want) {
		t.Errorf("observed\n%v\nwant\n%v", got, want)
	}
	md := svc.Info().Metadata
	if md["node_id"] != "n1" || md["worker_id"] != "7" || md["max_batch"] != "10000" {
		t.Errorf("$SRV.INFO metadata %v: want node_id n1, worker_id 7 and max_batch 10000 (MaxBatch wins)", md)
	}
}

// BenchmarkHandleIDs is one segment ID through the endpoint's delivery (guard, handler,
// counts), with and without the Prometheus metrics observing it: observing allocates
// nothing. The reply goes to an inbox no one listens on.
func BenchmarkHandleIDs(b *testing.B) {
	ns := testenv.StartNATS(b)
	m, err := metrics.New(metrics.Config{})
	if err != nil {
		b.Fatal(err)
	}
	for _, c := range []struct {
		name     string
		observer Observer
	}{{"Unobserved", nil}, {"Metrics", m}} {
		b.Run(c.name, func(b *testing.B) {
			cfg := DefaultConfig()
			cfg.Core = newCore(b, func(cc *core.Config) { cc.Segments = &countingSegments{} })
			cfg.Observer = c.observer
			svc, err := New(ns.Connect(b), cfg)
			if err != nil {
				b.Fatal(err)
			}
			defer svc.Stop()
			deliver := svc.deliver(svc.endpoint("segment"))
			msg := &nats.Msg{Subject: "leaf.segment.orders", Reply: "_INBOX.x"}
			b.ReportAllocs()
			for b.Loop() {
				deliver(msg)
			}
		})
	}
}
