package client

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/leafbus/leafbus/wire"
)

// ErrBufferClosed is returned by Buffer.Next once the buffer is closed.
var ErrBufferClosed = errors.New("leafbus: buffer closed")

// BufferOptions shape a Buffer. The zero value means the defaults.
type BufferOptions struct {
	// Batch is how many IDs one background request asks for (default 1000). Matching a
	// dispenser's pool size (--pool kind:tag:<size>:depth) gets pre-filled replies.
	Batch int
	// Batches bounds the buffer: it never holds more than Batches*Batch IDs (default 2).
	Batches int
	// LowWater is the level under which the buffer fetches another batch (default Batch:
	// fetch when less than one batch is left). 1 to (Batches-1)*Batch+1, so that a
	// fetch always fits under the bound.
	LowWater int
	// RetryMax caps the back-off between failed fetches (default 2s; the first retry
	// waits 50ms, doubling).
	RetryMax time.Duration
}

func (o *BufferOptions) setDefaults() error {
	if o.Batch == 0 {
		o.Batch = 1000
	}
	if o.Batches == 0 {
		o.Batches = 2
	}
	if o.LowWater == 0 {
		o.LowWater = o.Batch
	}
	if o.RetryMax == 0 {
		o.RetryMax = 2 * time.Second
	}
	switch {
	case o.Batch < 1 || o.Batch > wire.MaxBatchLimit:
		return fmt.Errorf("buffer batch %d: want 1 to %d", o.Batch, wire.MaxBatchLimit)
	case o.Batches < 1 || o.Batches > wire.MaxBatchLimit/o.Batch:
		return fmt.Errorf("buffer batches %d: want 1 to %d with batch %d (at most %d IDs held)", o.Batches, wire.MaxBatchLimit/o.Batch, o.Batch, wire.MaxBatchLimit)
	case o.LowWater < 1 || o.LowWater > (o.Batches-1)*o.Batch+1:
		return fmt.Errorf("buffer low water %d: want 1 to %d with batch %d and batches %d", o.LowWater, (o.Batches-1)*o.Batch+1, o.Batch, o.Batches)
	case o.RetryMax < 0:
		return fmt.Errorf("buffer retry max %v: want > 0", o.RetryMax)
	}
	return nil
}

// Buffer keeps IDs of one kind and tag in the client's memory, as Didi's Tinyid client
// does, so that Next is an in-memory operation: one goroutine, owned by the Buffer and
// stopped by Close, asks a dispenser for a batch whenever fewer than LowWater IDs are
// left, and the buffer never holds more than Batches*Batch IDs. Next is safe for
// concurrent use and never returns an ID twice.
//
// The trade-off, to weigh before using it:
//   - IDs held by a buffer are lost when the process exits or Close is called: a gap
//     of up to Batches*Batch IDs in the tag's sequence, never a repeat.
//   - Ordering is per buffer: IDs come in the order they were fetched, increasing within
//     a batch and across batches from one dispenser, but only trend-increasing across
//     dispensers, and unrelated to the order other clients see.
//   - A snowflake ID's timestamp is when it was fetched, not when Next returned it.
//   - Errors show late: Next returns the last fetch's error only once the buffer is
//     empty; until then it serves what it holds.
type Buffer struct {
	c    *Client
	kind wire.Kind
	tag  string
	opts BufferOptions

	mu      sync.Mutex
	chunks  [][]int64 // batches in fetch order; chunks[0][pos:] comes next
	pos     int
	count   int
	err     error         // the last fetch's error; nil after a fetch succeeds
	changed chan struct{} // closed (and replaced) when IDs arrive, a fetch fails or Close
	closed  bool

	want      chan struct{} // a Next took the count under LowWater
	stop      context.CancelFunc
	done      chan struct{} // closed when the fetcher returned
	closeOnce sync.Once
}

// Buffer starts a buffer of kind and tag IDs; the first batch is asked for at once.
// Close it to stop its goroutine.
func (c *Client) Buffer(kind wire.Kind, tag string, opts BufferOptions) (*Buffer, error) {
	if kind != wire.Segment && kind != wire.Snowflake {
		return nil, fmt.Errorf("buffer kind %d: want wire.Segment or wire.Snowflake", kind)
	}
	if err := opts.setDefaults(); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	b := &Buffer{
		c: c, kind: kind, tag: tag, opts: opts,
		changed: make(chan struct{}),
		want:    make(chan struct{}, 1),
		stop:    cancel,
		done:    make(chan struct{}),
	}
	go b.fetch(ctx)
	return b, nil
}

// Next returns the next ID from memory. When the buffer is empty it waits for the
// batch being fetched, until ctx ends; if the last fetch failed it returns that error
// (a *Error for a dispenser's error reply) at once.
func (b *Buffer) Next(ctx context.Context) (int64, error) {
	for {
		b.mu.Lock()
		if b.closed {
			b.mu.Unlock()
			return 0, ErrBufferClosed
		}
		if b.count > 0 {
			id := b.chunks[0][b.pos]
			b.pos++
			b.count--
			if b.pos == len(b.chunks[0]) {
				b.chunks[0] = nil
				b.chunks = b.chunks[1:]
				b.pos = 0
			}
			low := b.count < b.opts.LowWater
			b.mu.Unlock()
			if low {
				b.poke()
			}
			return id, nil
		}
		if err := b.err; err != nil {
			b.mu.Unlock()
			b.poke()
			return 0, err
		}
		changed := b.changed
		b.mu.Unlock()
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("%s ID of %q from the buffer: %w", b.kind, b.tag, ctx.Err())
		case <-changed:
		}
	}
}

// Len is how many IDs the buffer holds now.
func (b *Buffer) Len() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.count
}

// Close stops the background fetch, waits for its goroutine to return and drops the IDs
// held (they are never handed out). Next then returns ErrBufferClosed. Close may be
// called more than once.
func (b *Buffer) Close() {
	b.closeOnce.Do(func() {
		b.stop()
		<-b.done
		b.mu.Lock()
		b.closed = true
		b.chunks, b.pos, b.count = nil, 0, 0
		b.broadcast()
		b.mu.Unlock()
	})
}

func (b *Buffer) poke() {
	select {
	case b.want <- struct{}{}:
	default:
	}
}

// broadcast wakes every Next waiting for a change; b.mu is held.
func (b *Buffer) broadcast() {
	close(b.changed)
	b.changed = make(chan struct{})
}

// fetch is the buffer's goroutine: it asks for a batch while the buffer is under its
// low-water mark, backing off after failures, until ctx ends.
func (b *Buffer) fetch(ctx context.Context) {
	defer close(b.done)
	const retryMin = 50 * time.Millisecond
	retry := time.Duration(0)
	for {
		b.mu.Lock()
		need := b.count < b.opts.LowWater
		b.mu.Unlock()
		if !need {
			select {
			case <-ctx.Done():
				return
			case <-b.want:
			}
			continue
		}
		ids := make([]int64, b.opts.Batch) // handed to the buffer, so never reused
		err := b.c.Fill(ctx, b.kind, b.tag, ids)
		if ctx.Err() != nil {
			return // closing: what was fetched is dropped with the rest
		}
		b.mu.Lock()
		if err != nil {
			b.err = err
		} else {
			b.chunks = append(b.chunks, ids)
			b.count += len(ids)
			b.err = nil
		}
		b.broadcast()
		b.mu.Unlock()
		if err == nil {
			retry = 0
			continue
		}
		retry = min(max(2*retry, retryMin), b.opts.RetryMax)
		t := time.NewTimer(retry/2 + rand.N(retry/2+1))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}
