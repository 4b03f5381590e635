package bus

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/leafbus/leafbus/core"
	"github.com/leafbus/leafbus/internal/testutil"
	"github.com/leafbus/leafbus/snowflake"
	"github.com/leafbus/leafbus/testenv"
	"github.com/leafbus/leafbus/wire"
)

// BenchmarkRoundTrip is one request/reply per op through a real NATS server, 16 in
// flight from one client connection, everything in this process: the service's
// endpoints beside a bare nats.go responder and a bare micro endpoint answering the same
// bytes. The difference in cpu-ns/op (CPU time of the whole process, client and server
// included, per round trip: unlike ns/op it does not depend on how much of the shared
// cores the benchmark got) and allocs/op between "echo/plain" and an endpoint is what
// the service costs over NATS itself; profile it with -cpuprofile/-memprofile (the
// client's and the server's share are the same in every variant).
func BenchmarkRoundTrip(b *testing.B) {
	ns := testenv.StartNATS(b)
	canned := []byte("1000001")
	plain := ns.Connect(b)
	if _, err := plain.QueueSubscribe("echo.plain.*", "echo", func(m *nats.Msg) { _ = m.Respond(canned) }); err != nil {
		b.Fatal(err)
	}
	msvc, err := micro.AddService(ns.Connect(b), micro.Config{Name: "echo", Version: "1.0.0", QueueGroup: "echo"})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { msvc.Stop() })
	echo := micro.HandlerFunc(func(req micro.Request) { _ = req.Respond(canned) })
	if err := msvc.AddEndpoint("echo", echo, micro.WithEndpointSubject("echo.micro.*")); err != nil {
		b.Fatal(err)
	}
	sfs, err := snowflake.New(snowflake.Config{WorkerID: 1})
	if err != nil {
		b.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.Core = newCore(b, func(c *core.Config) { c.Segments, c.Snowflakes = &countingSegments{}, sfs })
	svc, err := New(ns.Connect(b), cfg)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { svc.Stop() })
	nc := ns.Connect(b)
	if err := plain.Flush(); err != nil {
		b.Fatal(err)
	}
	binary := nats.Header{wire.EncodingHeader: []string{"binary"}}
	for _, bc := range []struct {
		name, subject string
		header        nats.Header
	}{
		{"echo/plain", "echo.plain.orders", nil},
		{"echo/micro", "echo.micro.orders", nil},
		{"segment", "leaf.segment.orders", nil},
		{"segment/binary", "leaf.segment.orders", binary},
		{"snowflake", "leaf.snowflake.orders", nil},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			roundTrips(b, nc, bc.subject, bc.header, 16)
		})
	}
}

// roundTrips makes b.N request/reply round trips on subject, keeping inflight requests
// outstanding, and fails on an error reply or when the replies stop coming.
func roundTrips(b *testing.B, nc *nats.Conn, subject string, header nats.Header, inflight int) {
	b.Helper()
	n := int64(b.N)
	var sent, got atomic.Int64
	done := make(chan error, 1)
	inbox := nc.NewInbox()
	send := func() error {
		if sent.Add(1) > n {
			return nil
		}
		return nc.PublishMsg(&nats.Msg{Subject: subject, Reply: inbox, Header: header})
	}
	sub, err := nc.Subscribe(inbox, func(m *nats.Msg) {
		if len(m.Data) == 0 || m.Header.Get(wire.ServiceErrorCodeHeader) != "" {
			done <- wire.ReplyError(m.Header.Get(wire.ServiceErrorCodeHeader), m.Header.Get(wire.ServiceErrorHeader))
			return
		}
		if got.Add(1) == n {
			done <- nil
			return
		}
		if err := send(); err != nil {
			done <- err
		}
	})
	if err != nil {
		b.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := nc.Flush(); err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	cpu := testutil.ProcessCPU()
	defer func() {
		if used := testutil.ProcessCPU() - cpu; cpu > 0 {
			b.ReportMetric(float64(used.Nanoseconds())/float64(n), "cpu-ns/op")
		}
	}()
	for range min(int64(inflight), n) {
		if err := send(); err != nil {
			b.Fatal(err)
		}
	}
	select {
	case err := <-done:
		if err != nil {
			b.Fatalf("round trip to %s: %v", subject, err)
		}
	case <-time.After(time.Minute):
		b.Fatalf("round trips to %s: %d of %d replies after a minute", subject, got.Load(), n)
	}
}
