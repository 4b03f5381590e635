package client_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/leafbus/leafbus/bus"
	"github.com/leafbus/leafbus/client"
	"github.com/leafbus/leafbus/core"
	"github.com/leafbus/leafbus/internal/testutil"
	"github.com/leafbus/leafbus/segment"
	"github.com/leafbus/leafbus/snowflake"
	"github.com/leafbus/leafbus/testenv"
	"github.com/leafbus/leafbus/wire"
)

// startBufferDispenser runs a real bus.Service with a segment generator on an in-memory
// store (tag "orders") and a snowflake generator, on a fresh NATS server. Everything
// stops at cleanup, the service first.
func startBufferDispenser(tb testing.TB) *testenv.NATS {
	tb.Helper()
	ns := testenv.StartNATS(tb)
	store := segment.NewInmemStore()
	if _, err := store.AddTag(testutil.Context(tb, 10*time.Second), segment.Tag{Name: "orders", MaxID: 1, Step: 5000}); err != nil {
		tb.Fatalf("AddTag: %v", err)
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
	sfs, err := snowflake.New(snowflake.Config{WorkerID: 5})
	if err != nil {
		tb.Fatalf("snowflake.New: %v", err)
	}
	cc := core.DefaultConfig()
	cc.Segments, cc.Snowflakes = segs, sfs
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
	tb.Cleanup(func() { svc.Stop() })
	return ns
}

func newBufferClient(tb testing.TB, nc *nats.Conn, opts ...client.ClientOption) *client.Client {
	tb.Helper()
	c, err := client.NewClient(nc, opts...)
	if err != nil {
		tb.Fatalf("NewClient: %v", err)
	}
	return c
}

func mustBuffer(tb testing.TB, c *client.Client, kind wire.Kind, tag string, opts client.BufferOptions) *client.Buffer {
	tb.Helper()
	b, err := c.Buffer(kind, tag, opts)
	if err != nil {
		tb.Fatalf("Client.Buffer: %v", err)
	}
	tb.Cleanup(b.Close)
	return b
}

// bufferOptions is DefaultBufferOptions with the batch size, the number of batches and
// the low-water mark set.
func bufferOptions(batch, batches, lowWater int) client.BufferOptions {
	o := client.DefaultBufferOptions()
	o.Batch, o.Batches, o.LowWater = batch, batches, lowWater
	return o
}

// waitLen polls b.Len until ok, failing after 5s.
func waitLen(tb testing.TB, b *client.Buffer, what string, ok func(int) bool) {
	tb.Helper()
	deadline := time.After(5 * time.Second)
	for !ok(b.Len()) {
		select {
		case <-deadline:
			tb.Fatalf("buffer: waited 5s for %s; it holds %d IDs", what, b.Len())
		case <-time.After(time.Millisecond):
		}
	}
}

// TestBufferOptions: the defaults are valid, and each refusal names the field, its
// value and the bound.
func TestBufferOptions(t *testing.T) {
	ns := testenv.StartNATS(t)
	c := newBufferClient(t, ns.Connect(t))
	tests := []struct {
		name    string
		kind    wire.Kind
		change  func(*client.BufferOptions)
		wantErr string // "" for OK
	}{
		{"OK/Defaults", wire.Segment, func(o *client.BufferOptions) {}, ""},
		{"OK/LowWaterAtBound", wire.Segment, func(o *client.BufferOptions) { *o = bufferOptions(10, 3, 21) }, ""},
		{"OK/RetryMaxBelowFloor", wire.Segment, func(o *client.BufferOptions) { o.RetryMax = time.Millisecond }, ""},
		{"Err/LowWaterOverBound", wire.Segment, func(o *client.BufferOptions) { *o = bufferOptions(10, 3, 22) },
			"LowWater 22 must be 0 (one batch) or between 1 and 21 with Batch 10 and Batches 3"},
		{"Err/ZeroBatch", wire.Segment, func(o *client.BufferOptions) { o.Batch = 0 }, "Batch 0 must be between 1 and 1000000"},
		{"Err/BatchOverLimit", wire.Segment, func(o *client.BufferOptions) { o.Batch = wire.MaxBatchLimit + 1 }, "Batch 1000001 must be between 1 and 1000000"},
		{"Err/TooManyIDsHeld", wire.Segment, func(o *client.BufferOptions) { o.Batches = 1001 },
			"Batches 1001 must be between 1 and 1000 with Batch 1000 (at most 1000000 IDs held)"},
		{"Err/ZeroRetry", wire.Segment, func(o *client.BufferOptions) { o.RetryMax = 0 }, "RetryMax 0s must be > 0"},
		{"Err/Kind", wire.Kind(9), func(o *client.BufferOptions) {}, "buffer kind 9"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			opts := client.DefaultBufferOptions()
			tt.change(&opts)
			b, err := c.Buffer(tt.kind, "orders", opts)
			if b != nil {
				b.Close()
			}
			testutil.CheckErr(t, fmt.Sprintf("Client.Buffer(%+v)", opts), err, nil, tt.wantErr)
		})
	}
}

// TestBufferConcurrentNext: many goroutines share one buffer per kind; every ID is
// handed out once.
func TestBufferConcurrentNext(t *testing.T) {
	ns := startBufferDispenser(t)
	c := newBufferClient(t, ns.Connect(t))
	for _, kind := range []wire.Kind{wire.Segment, wire.Snowflake} {
		t.Run(kind.String(), func(t *testing.T) {
			b := mustBuffer(t, c, kind, "orders", bufferOptions(100, 3, 0))
			const goroutines, each = 16, 1000
			ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
			defer cancel()
			results := make([][]int64, goroutines)
			errs := make(chan error, goroutines)
			var wg sync.WaitGroup
			for g := range goroutines {
				wg.Add(1)
				go func() {
					defer wg.Done()
					for range each {
						id, err := b.Next(ctx)
						if err != nil {
							errs <- fmt.Errorf("goroutine %d: Next: %w", g, err)
							return
						}
						results[g] = append(results[g], id)
					}
				}()
			}
			wg.Wait()
			close(errs)
			for err := range errs {
				t.Fatal(err)
			}
			seen := make(map[int64]bool, goroutines*each)
			for g, ids := range results {
				for i, id := range ids {
					if seen[id] {
						t.Fatalf("ID %d handed out twice", id)
					}
					seen[id] = true
					// One goroutine's IDs come in buffer order: from one dispenser,
					// that is increasing.
					if i > 0 && id <= ids[i-1] {
						t.Fatalf("goroutine %d got %d after %d", g, id, ids[i-1])
					}
				}
			}
			if n := b.Len(); n > 300 {
				t.Fatalf("buffer holds %d IDs, above its bound 300", n)
			}
		})
	}
}

// TestBufferServesFromMemory: a full buffer keeps answering Next with NATS gone (no
// I/O on Next), refills in the background once under its low-water mark, and never
// holds more than its bound.
func TestBufferServesFromMemory(t *testing.T) {
	ns := startBufferDispenser(t)
	c := newBufferClient(t, ns.Connect(t), client.WithTimeout(time.Second))
	b := mustBuffer(t, c, wire.Segment, "orders", bufferOptions(50, 4, 100))
	// Once under 100 it fetches 50 at a time: it settles at 100..149 IDs, never 200.
	waitLen(t, b, "the first fetches", func(n int) bool { return n >= 100 })
	if n := b.Len(); n >= 150 {
		t.Fatalf("buffer holds %d IDs after filling, want under 150 (low water 100 + one batch of 50)", n)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for range 60 {
		if _, err := b.Next(ctx); err != nil {
			t.Fatalf("Next: %v", err)
		}
	}
	waitLen(t, b, "the background refill", func(n int) bool { return n >= 100 })

	ns.Stop()
	held := b.Len()
	for i := range held {
		if _, err := b.Next(ctx); err != nil {
			t.Fatalf("Next #%d of %d held, NATS stopped: %v", i, held, err)
		}
	}
	// Empty with NATS down: the fetch error surfaces (bounded by the client timeout).
	if _, err := b.Next(ctx); err == nil {
		t.Fatalf("Next on an empty buffer with NATS stopped = nil error, want the fetch's error")
	}
	// NATS back: the buffer recovers by itself.
	ns.Start()
	deadline := time.Now().Add(8 * time.Second)
	for {
		_, err := b.Next(ctx)
		if err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Next after NATS came back: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestBufferErrors: a dispenser's error reply surfaces to Next, typed as the client's;
// a tag no dispenser accepts is refused by Client.Buffer itself.
func TestBufferErrors(t *testing.T) {
	ns := startBufferDispenser(t)
	nc := ns.Connect(t)
	if _, err := newBufferClient(t, nc).Buffer(wire.Segment, "bad\ntag", bufferOptions(10, 2, 0)); !errors.Is(err, wire.ErrBadRequest) {
		t.Fatalf("Client.Buffer of a tag with a newline = %v, want ErrBadRequest", err)
	}
	tests := []struct {
		name    string
		client  *client.Client
		tag     string
		batch   int
		wantErr error
	}{
		{"ErrNotFound", newBufferClient(t, nc), "missing", 10, wire.ErrNotFound},
		{"ErrBadRequest", newBufferClient(t, nc), "orders", wire.DefaultMaxBatch + 1, wire.ErrBadRequest}, // over the dispenser's --max-batch
		{"ErrNoResponders", newBufferClient(t, nc, client.WithPrefix("nobody")), "orders", 10, nats.ErrNoResponders},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			opts := bufferOptions(tt.batch, 2, 0)
			opts.RetryMax = 10 * time.Millisecond
			b := mustBuffer(t, tt.client, wire.Segment, tt.tag, opts)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, err := b.Next(ctx)
			if err == nil {
				t.Fatalf("Next = nil error, want one")
			}
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("Next error = %v, want %v", err, tt.wantErr)
			}
			var reply *wire.Error
			if isReply := errors.As(err, &reply); isReply != (tt.wantErr != nats.ErrNoResponders) {
				t.Fatalf("Next error = %v: errors.As(*wire.Error) = %v, want it for a dispenser's error reply only", err, isReply)
			}
			if ctx.Err() != nil {
				t.Fatalf("Next waited for its context instead of returning the fetch error: %v", err)
			}
		})
	}
}

// TestBufferClose: Close returns once the goroutine stopped, even with a fetch in
// flight that would not be answered for long, wakes a waiting Next, and Next then
// fails with ErrBufferClosed.
func TestBufferClose(t *testing.T) {
	ns := testenv.StartNATS(t)
	nc := ns.Connect(t)
	// A responder that never answers: the buffer's first fetch hangs until Close.
	sub, err := nc.Subscribe("leaf.segment.slow", func(*nats.Msg) {})
	if err == nil {
		err = nc.Flush() // the server has the subscription before the buffer's first fetch
	}
	if err != nil {
		t.Fatalf("Subscribe: %v", err)
	}
	defer sub.Unsubscribe()
	c := newBufferClient(t, ns.Connect(t), client.WithTimeout(time.Minute))
	b, err := c.Buffer(wire.Segment, "slow", client.DefaultBufferOptions())
	if err != nil {
		t.Fatalf("Client.Buffer: %v", err)
	}
	nextErr := make(chan error, 1)
	go func() {
		_, err := b.Next(context.Background())
		nextErr <- err
	}()
	time.Sleep(50 * time.Millisecond) // let Next start waiting (not required for the assertions)
	closed := make(chan struct{})
	go func() { b.Close(); close(closed) }()
	select {
	case <-closed:
	case <-time.After(5 * time.Second):
		t.Fatalf("Close did not return within 5s with a fetch in flight")
	}
	select {
	case err := <-nextErr:
		if !errors.Is(err, client.ErrBufferClosed) {
			t.Fatalf("waiting Next after Close = %v, want ErrBufferClosed", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("a waiting Next was not woken by Close within 5s")
	}
	if _, err := b.Next(context.Background()); !errors.Is(err, client.ErrBufferClosed) {
		t.Fatalf("Next after Close = %v, want ErrBufferClosed", err)
	}
	b.Close() // a second Close is harmless
}

// TestBufferNextContext: Next on an empty buffer waiting for a slow fetch gives up when
// its context ends.
func TestBufferNextContext(t *testing.T) {
	ns := testenv.StartNATS(t)
	nc := ns.Connect(t)
	sub, err := nc.Subscribe("leaf.snowflake.slow", func(*nats.Msg) {})
	if err == nil {
		err = nc.Flush() // the server has the subscription before the buffer's first fetch
	}
	if err != nil {
		t.Fatalf("Subscribe: %v", err)
	}
	defer sub.Unsubscribe()
	c := newBufferClient(t, ns.Connect(t), client.WithTimeout(time.Minute))
	b := mustBuffer(t, c, wire.Snowflake, "slow", client.DefaultBufferOptions())
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if _, err := b.Next(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Next = %v, want context.DeadlineExceeded", err)
	}
}

// BenchmarkBufferNext is Next on a buffer kept full by its goroutine from a real
// dispenser over NATS (client, NATS server and service in this process): batches of
// 1000 (at most 4 held, a fetch below 2000), as at 8414e1b, and of 10000 (at most 4, a
// fetch below 30000, so that one is nearly always on its way). Here the supply can be
// the limit, not Next: one round trip per batch, and a snowflake worker makes at most
// 4096 IDs a millisecond. BenchmarkBufferNextMemory (package client) measures Next alone.
func BenchmarkBufferNext(b *testing.B) {
	ns := startBufferDispenser(b)
	c := newBufferClient(b, ns.Connect(b))
	for _, bc := range []struct {
		name string
		kind wire.Kind
		opts client.BufferOptions
	}{
		{"segment", wire.Segment, bufferOptions(1000, 4, 2000)},
		{"snowflake", wire.Snowflake, bufferOptions(1000, 4, 2000)},
		{"segment-batch10000", wire.Segment, bufferOptions(10000, 4, 30000)},
		{"snowflake-batch10000", wire.Snowflake, bufferOptions(10000, 4, 30000)},
	} {
		b.Run(bc.name, func(b *testing.B) {
			buf := mustBuffer(b, c, bc.kind, "orders", bc.opts)
			ctx := context.Background()
			if _, err := buf.Next(ctx); err != nil { // the first batch is in
				b.Fatal(err)
			}
			b.ReportAllocs()
			b.ResetTimer()
			cpu := testutil.ProcessCPU()
			b.RunParallel(func(pb *testing.PB) {
				for pb.Next() {
					if _, err := buf.Next(ctx); err != nil {
						b.Error(err)
						return
					}
				}
			})
			client.ReportRates(b, testutil.ProcessCPU()-cpu)
		})
	}
}
