package service

import (
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/leafbus/leafbus/metrics"
	"github.com/leafbus/leafbus/snowflake"
	"github.com/leafbus/leafbus/testenv"
	"github.com/leafbus/leafbus/wire"
)

// TestReplyAllocatesNothing: an ID request answered on the delivery goroutine (the
// guard, parsing, the IDs, encoding, the publish, the counts and the Prometheus metrics
// a dispenser observes it with; for an ordinary and a monotonic tag) allocates nothing; what
// nats.go allocates to deliver the request (the message, its subject and reply strings,
// a header map) is before it and the same for any responder.
func TestReplyAllocatesNothing(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	ns := testenv.StartNATS(t)
	sfs, err := snowflake.New(snowflake.Config{WorkerID: 1})
	if err != nil {
		t.Fatal(err)
	}
	m, err := metrics.New(metrics.Config{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.Segments, cfg.Snowflakes, cfg.Observer = &countingSegments{}, sfs, m
	cfg.Monotonic = &fakeMonotonic{marks: map[string]bool{"ordered": true}, inMemory: true}
	svc, err := New(ns.Connect(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { svc.Stop() })
	binary := nats.Header{wire.EncodingHeader: []string{"binary"}}
	for _, tt := range []struct {
		name, endpoint string
		msg            *nats.Msg
	}{
		{"OK/Segment", "segment", &nats.Msg{Subject: "leaf.segment.orders", Reply: "_INBOX.a"}},
		{"OK/Segment10", "segment", &nats.Msg{Subject: "leaf.segment.orders", Reply: "_INBOX.a", Data: []byte("10")}},
		{"OK/SegmentBinary", "segment", &nats.Msg{Subject: "leaf.segment.orders", Reply: "_INBOX.a", Header: binary}},
		{"OK/Monotonic", "segment", &nats.Msg{Subject: "leaf.segment.ordered", Reply: "_INBOX.a"}},
		{"OK/Snowflake", "snowflake", &nats.Msg{Subject: "leaf.snowflake.any", Reply: "_INBOX.a"}},
		{"OK/RefusedReply", "segment", &nats.Msg{Subject: "leaf.segment.orders", Reply: "$KV.x"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			deliver := svc.deliver(svc.endpoint(tt.endpoint))
			deliver(tt.msg) // the scratch space grows once
			if n := testing.AllocsPerRun(1000, func() { deliver(tt.msg) }); n != 0 {
				t.Fatalf("%s: %v allocations per request, want 0", tt.msg.Subject, n)
			}
		})
	}
}
