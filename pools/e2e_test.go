package pools_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/leafbus/leafbus/bus"
	"github.com/leafbus/leafbus/client"
	"github.com/leafbus/leafbus/core"
	"github.com/leafbus/leafbus/internal/testutil"
	"github.com/leafbus/leafbus/pools"
	"github.com/leafbus/leafbus/segment"
	"github.com/leafbus/leafbus/snowflake"
	"github.com/leafbus/leafbus/testenv"
	"github.com/leafbus/leafbus/wire"
)

// e2eDispenser is a dispenser as cmd/dispenser wires it, minus the worker-ID and clock
// machinery: a real segment.Generator on an in-memory store, a real snowflake.Generator,
// pools in front of both, and a bus.Service on a real NATS server.
type e2eDispenser struct {
	nats    *testenv.NATS
	batches *pools.Batches
}

// The pooled shapes; tag "plain" has no pool, so its requests take the direct path.
const (
	e2eSegSize = 100
	e2eSfSize  = 1000
)

// startE2E starts everything for tb and stops it at cleanup (the service first).
func startE2E(tb testing.TB, specs []pools.Spec) *e2eDispenser {
	tb.Helper()
	ctx := testutil.Context(tb, time.Minute)
	ns := testenv.StartNATS(tb)

	store := segment.NewInmemStore()
	for _, name := range []string{"orders", "plain"} {
		if _, err := store.AddTag(ctx, segment.Tag{Name: name, MaxID: 1, Step: 2000}); err != nil {
			tb.Fatalf("AddTag %q: %v", name, err)
		}
	}
	segCfg := segment.DefaultConfig()
	segCfg.Store = store
	segs, err := segment.New(segCfg)
	if err != nil {
		tb.Fatalf("segment.New: %v", err)
	}
	testutil.Run(tb, "segment generator", segs.Run)
	select {
	case <-segs.Ready():
	case <-time.After(5 * time.Second):
		tb.Fatalf("segment generator not ready within 5s")
	}
	sfs, err := snowflake.New(snowflake.Config{WorkerID: 7, BorrowMax: time.Second})
	if err != nil {
		tb.Fatalf("snowflake.New: %v", err)
	}
	poolCfg := pools.DefaultConfig()
	poolCfg.Specs, poolCfg.Segments, poolCfg.Snowflakes = specs, segs, sfs
	batches, err := pools.New(poolCfg)
	if err != nil {
		tb.Fatalf("pools.New: %v", err)
	}
	testutil.Run(tb, "Batches.Run", batches.Run)

	cc := core.DefaultConfig()
	cc.Segments, cc.Snowflakes, cc.Batches = segs, sfs, batches
	c, err := core.New(cc)
	if err != nil {
		tb.Fatalf("core.New: %v", err)
	}
	cfg := bus.DefaultConfig()
	cfg.Core = c
	svc, err := bus.New(ns.Connect(tb), cfg)
	if err != nil {
		tb.Fatalf("bus.New: %v", err)
	}
	tb.Cleanup(func() {
		if err := svc.Stop(); err != nil {
			tb.Errorf("Service.Stop: %v", err)
		}
	})
	return &e2eDispenser{nats: ns, batches: batches}
}

func (d *e2eDispenser) client(tb testing.TB, enc wire.Encoding) *client.Client {
	tb.Helper()
	c, err := client.NewClient(d.nats.Connect(tb), client.WithEncoding(enc), client.WithTimeout(10*time.Second))
	if err != nil {
		tb.Fatalf("client.NewClient: %v", err)
	}
	return c
}

// TestEndToEndUnique: many clients mix single requests, requests of the pooled sizes
// and of other sizes, in both encodings, for both kinds, pooled and direct tags: every
// ID is unique (per tag for segment IDs, across tags for snowflake IDs), and every reply is strictly increasing (the client checks).
func TestEndToEndUnique(t *testing.T) {
	d := startE2E(t, []pools.Spec{
		{Kind: wire.Segment, Tag: "orders", Size: e2eSegSize, Depth: 16},
		{Kind: wire.Snowflake, Tag: "orders", Size: e2eSfSize, Depth: 16},
	})
	type call struct {
		kind wire.Kind
		tag  string
		n    int
	}
	calls := []call{
		{wire.Segment, "orders", 1},
		{wire.Segment, "orders", e2eSegSize},
		{wire.Segment, "orders", 37},
		{wire.Segment, "orders", e2eSegSize},
		{wire.Segment, "plain", e2eSegSize},
		{wire.Snowflake, "orders", 1},
		{wire.Snowflake, "orders", e2eSfSize},
		{wire.Snowflake, "orders", 5000}, // spans milliseconds
		{wire.Snowflake, "orders", e2eSfSize},
		{wire.Snowflake, "other", e2eSfSize},
	}
	const clients, rounds = 12, 60
	var (
		mu   sync.Mutex
		seen = map[string]map[int64]bool{} // per segment tag; one for all snowflake IDs
		n    int
	)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	errs := make(chan error, clients)
	var wg sync.WaitGroup
	for i := range clients {
		c := d.client(t, wire.Encoding(i%2))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for r := range rounds {
				cl := calls[(i+r)%len(calls)]
				ids := make([]int64, cl.n)
				if err := c.Fill(ctx, cl.kind, cl.tag, ids); err != nil {
					errs <- fmt.Errorf("client %d: %d %s IDs of %q: %w", i, cl.n, cl.kind, cl.tag, err)
					return
				}
				space := "snowflake"
				if cl.kind == wire.Segment {
					space = "segment " + cl.tag
				}
				mu.Lock()
				if seen[space] == nil {
					seen[space] = make(map[int64]bool)
				}
				for _, id := range ids {
					if seen[space][id] {
						mu.Unlock()
						errs <- fmt.Errorf("client %d: %s ID %d handed out twice", i, space, id)
						return
					}
					seen[space][id] = true
				}
				n += len(ids)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	var taken uint64
	for _, s := range d.batches.Stats() {
		taken += s.Taken
		if s.Ready > s.Depth {
			t.Errorf("pool %s:%s holds %d batches, above its depth %d", s.Kind, s.Tag, s.Ready, s.Depth)
		}
	}
	if taken == 0 {
		t.Fatalf("no request was answered from a pool: %+v", d.batches.Stats())
	}
	t.Logf("%d unique IDs, %d replies from pools", n, taken)
}

// BenchmarkRequest1000 is one request/reply of 1000 segment IDs over NATS through a
// real bus.Service, pooled or made per request, in each encoding.
func BenchmarkRequest1000(b *testing.B) {
	d := startE2E(b, []pools.Spec{{Kind: wire.Segment, Tag: "orders", Size: 1000, Depth: 256}})
	for _, bc := range []struct {
		name string
		tag  string
		enc  wire.Encoding
	}{
		{"Pooled/Text", "orders", wire.Text},
		{"Pooled/Binary", "orders", wire.Binary},
		{"Direct/Text", "plain", wire.Text},
		{"Direct/Binary", "plain", wire.Binary},
	} {
		b.Run(bc.name, func(b *testing.B) {
			c := d.client(b, bc.enc)
			ids := make([]int64, 1000)
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				if err := c.Fill(ctx, wire.Segment, bc.tag, ids); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	var taken, misses uint64
	for _, s := range d.batches.Stats() {
		taken, misses = taken+s.Taken, misses+s.Misses
	}
	b.Logf("pooled replies %d, empty-pool misses %d", taken, misses)
}
