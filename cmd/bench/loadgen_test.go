package main

import (
	"bufio"
	"io"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/leafbus/leafbus/internal/testutil"
	"github.com/leafbus/leafbus/testenv"
	"github.com/leafbus/leafbus/wire"
)

// TestPublishAllocations: a NATS request costs the load client one allocation, the
// reply subject's string; with the encoding header (binary) nats.go's encoding of the
// header adds two (its buffer and the map's iterator), which nats.go leaves no way around.
// The requests go to a subscriber outside nats.go (rawSink): an in-process subscriber, or
// the server's no-responders replies, would allocate on other goroutines meanwhile, and
// AllocsPerRun counts the whole process's allocations.
func TestPublishAllocations(t *testing.T) {
	if testutil.RaceEnabled {
		t.Skip("allocation counts under -race include sync.Pool's deliberate drops")
	}
	n := testenv.StartNATS(t)
	rawSink(t, n.URL(), "_bench.sink.>")
	cfg := testConfig(n)
	clients, err := connectClients(cfg, nil)
	t.Cleanup(func() { closeClients(clients) })
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		enc  wire.Encoding
		want float64
	}{{wire.Text, 1}, {wire.Binary, 3}} {
		c := cfg
		c.Encoding = tt.enc
		spec := newLoadSpec(c, "dispenser", func(tag string) string { return "_bench.sink." + tag })
		w := newWorker(0, clients[0], spec, 1, nil)
		if err := w.subscribe(); err != nil {
			t.Fatal(err)
		}
		seq := int64(1 << 40) // long enough numbers that the buffer's room is used
		allocs := testing.AllocsPerRun(1000, func() {
			if err := w.publish(seq, 0); err != nil {
				t.Fatal(err)
			}
			seq++
		})
		w.unsubscribe()
		if allocs > tt.want {
			t.Errorf("%s: %v allocations per request, want %v", tt.enc, allocs, tt.want)
		}
	}
}

// rawSink subscribes to subject over a plain TCP connection speaking the NATS protocol,
// and reads and drops whatever comes, without allocating per message.
func rawSink(t *testing.T, natsURL, subject string) {
	t.Helper()
	u, err := url.Parse(natsURL)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := net.Dial("tcp", u.Host)
	if err != nil {
		t.Fatalf("raw subscriber: %v", err)
	}
	fail := func(format string, args ...any) {
		conn.Close()
		t.Fatalf(format, args...)
	}
	if _, err := io.WriteString(conn, "CONNECT {\"verbose\":false,\"pedantic\":false}\r\nSUB "+subject+" 1\r\nPING\r\n"); err != nil {
		fail("raw subscriber: %v", err)
	}
	r := bufio.NewReader(conn)
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second)) // a server that never answers fails the test, not hangs it
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			fail("raw subscriber: no PONG: %v", err)
		}
		if strings.HasPrefix(line, "PONG") {
			break
		}
	}
	_ = conn.SetReadDeadline(time.Time{})
	done := make(chan struct{})
	go func() { // ends when the cleanup closes the connection
		defer close(done)
		buf := make([]byte, 64<<10)
		for {
			if _, err := r.Read(buf); err != nil {
				return
			}
		}
	}()
	t.Cleanup(func() {
		conn.Close()
		<-done
	})
}
