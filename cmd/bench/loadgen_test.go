package main

import (
	"testing"

	"github.com/leafbus/leafbus/internal/testutil"
	"github.com/leafbus/leafbus/testenv"
	"github.com/leafbus/leafbus/wire"
)

// TestPublishAllocations: a NATS request costs the load client one allocation, the
// reply subject's string; with the encoding header (binary) nats.go's encoding of the
// header adds two (its buffer and the map's iterator), which nats.go leaves no way around.
// The requests go to a subscriber outside nats.go (testenv's Sink): an in-process subscriber, or
// the server's no-responders replies, would allocate on other goroutines meanwhile, and
// AllocsPerRun counts the whole process's allocations.
func TestPublishAllocations(t *testing.T) {
	if testutil.RaceEnabled {
		t.Skip("allocation counts under -race include sync.Pool's deliberate drops")
	}
	n := testenv.StartNATSProcess(t)
	testenv.Sink(t, n.URL(), "_bench.sink.>")
	cfg := testConfig(n.URL())
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
