package bus

import (
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/leafbus/leafbus/core"
	"github.com/leafbus/leafbus/internal/testutil"
	"github.com/leafbus/leafbus/metrics"
	"github.com/leafbus/leafbus/snowflake"
	"github.com/leafbus/leafbus/testenv"
	"github.com/leafbus/leafbus/wire"
)

// TestReplyAllocatesNothing: an ID request answered on the delivery goroutine (the
// guard, parsing, the IDs, encoding, the publish, the counts and the Prometheus metrics
// a dispenser observes it with) allocates nothing; what
// nats.go allocates to deliver the request (the message, its subject and reply strings,
// a header map) is before it and the same for any responder.
func TestReplyAllocatesNothing(t *testing.T) {
	if testutil.RaceEnabled {
		t.Skip("the race detector allocates")
	}
	// The server runs in a process of its own: an embedded one allocates as it routes
	// each reply, and a loaded machine scheduled it during the measurement.
	ns := testenv.StartNATSProcess(t)
	sfs, err := snowflake.New(snowflake.Config{WorkerID: 1})
	if err != nil {
		t.Fatal(err)
	}
	m, err := metrics.New(metrics.Config{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.Core = newCore(t, func(c *core.Config) { c.Segments, c.Snowflakes = &countingSegments{}, sfs })
	cfg.Observer = m
	svc, err := New(ns.Connect(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { svc.Stop() })
	binary := nats.Header{wire.EncodingHeader: []string{"binary"}}
	// natsTotals is what the Observer counted for NATS: requests answered, error
	// replies, IDs handed out.
	natsTotals := func() (total metrics.Total) {
		for _, tot := range m.Totals() {
			if tot.Transport == metrics.NATS {
				total.Requests += tot.Requests
				total.Errors += tot.Errors
				total.IDs += tot.IDs
			}
		}
		return total
	}
	for _, tt := range []struct {
		name, endpoint string
		msg            *nats.Msg
		ids            uint64 // per request; 0: refused by the reply guard, unanswered
	}{
		{"OK/Segment", "segment", &nats.Msg{Subject: "leaf.segment.orders", Reply: "_INBOX.a"}, 1},
		{"OK/Segment10", "segment", &nats.Msg{Subject: "leaf.segment.orders", Reply: "_INBOX.a", Data: []byte("10")}, 10},
		{"OK/SegmentBinary", "segment", &nats.Msg{Subject: "leaf.segment.orders", Reply: "_INBOX.a", Header: binary}, 1},
		{"OK/Snowflake", "snowflake", &nats.Msg{Subject: "leaf.snowflake.any", Reply: "_INBOX.a"}, 1},
		{"OK/RefusedReply", "segment", &nats.Msg{Subject: "leaf.segment.orders", Reply: "$KV.x"}, 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			e := svc.endpoint(tt.endpoint)
			deliver := svc.deliver(e)
			before, refused := natsTotals(), e.refused.Load()
			deliver(tt.msg) // the scratch space grows once
			const runs = 1000
			if n := testing.AllocsPerRun(runs, func() { deliver(tt.msg) }); n != 0 {
				t.Fatalf("%s: %v allocations per request, want 0", tt.msg.Subject, n)
			}
			// What was measured is the work itself: every request answered with its IDs
			// (or refused), none with an error. (Every path the core takes from memory,
			// the monotonic tags' included, is core.TestTakeAllocatesNothing's.)
			const requests = runs + 2 // the first delivery and AllocsPerRun's warm-up
			after := natsTotals()
			if got, want := after.IDs-before.IDs, requests*tt.ids; got != want || after.Errors != before.Errors {
				t.Errorf("%d requests handed out %d IDs with %d error replies, want %d IDs and none", requests, got, after.Errors-before.Errors, want)
			}
			if tt.ids == 0 {
				if got := e.refused.Load() - refused; got != requests || after.Requests != before.Requests {
					t.Errorf("%d requests with a foreign reply subject: %d refused, %d answered; want all refused", requests, got, after.Requests-before.Requests)
				}
			}
		})
	}
}
