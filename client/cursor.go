package client

import (
	"context"
)

// Cursor hands out IDs from a run it claimed from a Buffer, so that goroutines taking
// IDs at once do not share a counter. Get one per goroutine from Buffer.Cursor.
//
// A Cursor is owned by one goroutine: it is not safe for concurrent use (that is what
// makes its Next write no shared memory; it reads the buffer's closed flag, whose cache
// line the fetcher writes once per batch). Its guarantees and trade-offs, beside those of the Buffer:
//   - No duplicates: runs are claimed with the buffer's one counter, so two cursors, or
//     a cursor and Buffer.Next, never get the same ID.
//   - Order is per cursor: its IDs increase as the buffer's do (in fetch order), but
//     cursors interleave, so IDs from different cursors, or from a cursor and
//     Buffer.Next, are not handed out in increasing order overall.
//   - A gap on drop: IDs left in a cursor that is dropped, or when the buffer is
//     closed, are never handed out, as with the IDs a Buffer holds at Close. Each live
//     cursor holds at most its run size beyond the buffer's Batches*Batch.
type Cursor struct {
	// id is the next ID to hand out and left how many consecutive IDs from it are
	// claimed and not handed out yet: Next is an increment while left > 0.
	id, left int64
	// batch's indexes pos..end-1 are claimed and follow id's stretch; they are walked
	// run by run when left reaches 0 (a batch of one run leaves none).
	batch    *batch
	pos, end int64
	b        *Buffer
	n        int64 // claim size, 1..Batch
	// Next writes id and left for every ID: the padding makes a Cursor 128 bytes (56
	// of fields), a size class whose objects sit alone on their two cache lines, so
	// that cursors of goroutines on different cores allocated side by side do not
	// share a line (false sharing would bounce it between the cores on every ID, as a
	// shared counter does).
	_ [128 - 56]byte
}

// Cursor returns a cursor that claims up to n IDs at a time from b: one atomic add (a
// lock only when the current batch is spent, as for Next) per run instead of per ID.
// n is clamped to 1..Batch, because a run never spans batches; a run claimed at a
// batch's end is cut there. A larger n costs fewer shared adds per ID but leaves a
// larger gap when the cursor is dropped and holds more IDs outside the buffer's bound.
// The IDs a run claims count as taken from the buffer: a claim that takes it under
// LowWater wakes its fetcher, as Next does.
func (b *Buffer) Cursor(n int) *Cursor {
	return &Cursor{b: b, n: int64(min(max(n, 1), b.opts.Batch))}
}

// Next returns the cursor's next ID; with its run used up, it claims another from the
// buffer, with Buffer.Next's behaviour: it waits for a fetch while the buffer is empty,
// until ctx ends, and returns the last fetch's error, or ErrBufferClosed once the
// buffer is closed (dropping what the run still held).
func (c *Cursor) Next(ctx context.Context) (int64, error) {
	if c.left > 0 && !c.b.closed.Load() {
		c.left--
		c.id++
		return c.id - 1, nil
	}
	return c.claim(ctx)
}

// claim is Next with the current stretch of consecutive IDs used up or the buffer
// closed: it moves to the claimed indexes' next run, or claims more.
func (c *Cursor) claim(ctx context.Context) (int64, error) {
	if c.b.closed.Load() {
		c.drop() // never handed out after Close
	}
	if c.pos >= c.end {
		batch, start, end, err := c.b.take(ctx, c.n)
		if err != nil {
			c.drop()
			return 0, err
		}
		c.batch, c.pos, c.end = batch, start, end
	}
	first, n := c.batch.stretch(c.pos, c.end)
	c.pos += n
	c.id, c.left = first+1, n-1
	return first, nil
}

// drop forgets what the cursor claimed and did not hand out: a gap, never a repeat.
func (c *Cursor) drop() {
	c.left, c.batch, c.pos, c.end = 0, nil, 0, 0
}
