package client

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/leafbus/leafbus/wire"
)

// ErrNoPool is returned by NewConsumer and Fetch when the pool's stream or consumer does
// not exist: no dispenser was started with that pool (--pool kind:tag:size:depth).
var ErrNoPool = errors.New("no such pool in the pool stream")

// ErrBadBatch is returned by Consumer.Next when a message of the pool is not a text
// body of positive, strictly increasing IDs. The message is terminated, never used.
var ErrBadBatch = errors.New("malformed batch in the pool stream")

// Consumer takes batches from one pool of the stream for a bulk (ETL) job. It is the
// reference implementation of the rule PROTOCOL.md "Bulk batches" sets for every job,
// in any language:
//
//  1. note the time on a monotonic clock, then fetch one message from the pool's
//     durable consumer (so the server cannot have delivered it before that time);
//  2. acknowledge it with a confirmed ack (AckSync / DoubleAck in nats.go, ackAck in
//     nats.js);
//  3. use its IDs only if that ack was confirmed less than half the consumer's ack
//     wait after the time noted in 1; otherwise drop the batch unused and fetch again.
//
// Why: a message not acked within the ack wait is redelivered to another job, and a
// server may still confirm the first job's late ack. Confirmation alone therefore does
// not prove the batch is the job's alone; confirmation well within the ack wait does.
// A dropped batch is a gap in the IDs, never a duplicate. A job that dies before the
// confirmed ack leaves its batch to be redelivered; one that dies after loses it.
//
// The half window is computed from the consumer's ack wait when NewConsumer read it,
// and never exceeds half of wire.PoolMinAckWait, so a later change of the ack wait to any value
// the dispensers allow keeps the rule safe.
//
// A Consumer's Next may be called from several goroutines.
type Consumer struct {
	cons    jetstream.Consumer
	window  time.Duration // a batch is used only when its ack was confirmed within this
	maxWait time.Duration // one pull request's expiry, a fraction of window
	used    atomic.Uint64
	dropped atomic.Uint64
	// since is time.Since: how long ago on the monotonic clock. Tests replace it.
	since func(time.Time) time.Duration
}

// NewConsumer looks up the pool's durable consumer in the stream of prefix.
func NewConsumer(ctx context.Context, js jetstream.JetStream, prefix string, kind wire.Kind, tag string) (*Consumer, error) {
	if err := wire.CheckTag(tag); err != nil {
		return nil, fmt.Errorf("pool consumer of %s IDs for %s: %w", kind, wire.Quote(tag), err)
	}
	stream, name := wire.Subjects{Prefix: prefix}.PoolStream(), wire.PoolConsumer(kind, tag)
	cons, err := js.Consumer(ctx, stream, name)
	if errors.Is(err, jetstream.ErrStreamNotFound) || errors.Is(err, jetstream.ErrConsumerNotFound) {
		return nil, fmt.Errorf("pool consumer: consumer %s on %s: %w (%w)", name, stream, ErrNoPool, err)
	}
	if err != nil {
		return nil, fmt.Errorf("pool consumer: consumer %s on %s: %w", name, stream, err)
	}
	ackWait := cons.CachedInfo().Config.AckWait
	if ackWait <= 0 {
		return nil, fmt.Errorf("pool consumer: consumer %s on %s has ack wait %v, not a pool consumer", name, stream, ackWait)
	}
	window := min(ackWait, wire.PoolMinAckWait) / 2
	return &Consumer{
		cons:    cons,
		window:  window,
		maxWait: min(max(window/4, 10*time.Millisecond), 2*time.Second),
		since:   time.Since,
	}, nil
}

// Fetch takes one batch of the pool kind:tag of the stream of prefix: NewConsumer and
// one Next. A job that takes many batches should keep a Consumer instead.
func Fetch(ctx context.Context, js jetstream.JetStream, prefix string, kind wire.Kind, tag string) ([]int64, error) {
	c, err := NewConsumer(ctx, js, prefix, kind, tag)
	if err != nil {
		return nil, err
	}
	return c.Next(ctx)
}

// Next waits for a batch and returns its IDs once the server confirmed the ack in
// time (see Consumer). It returns ctx's error when ctx ends first, and ErrBadBatch for
// a malformed message.
func (c *Consumer) Next(ctx context.Context) ([]int64, error) {
	for {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		start := time.Now() // carries the monotonic clock reading
		msg, err := c.fetch(ctx)
		if err != nil {
			return nil, err
		}
		if msg == nil {
			continue // none ready within maxWait
		}
		ids, err := wire.DecodeIDs(nil, msg.Data(), wire.Text)
		if err != nil {
			_ = msg.Term()
			return nil, fmt.Errorf("pool consumer: message %s: %w: %w", msg.Subject(), ErrBadBatch, err)
		}
		if ok := c.ack(ctx, msg, start); !ok {
			c.dropped.Add(1)
			continue
		}
		c.used.Add(1)
		return ids, nil
	}
}

// fetch pulls at most one message, waiting up to maxWait; nil when none came.
func (c *Consumer) fetch(ctx context.Context) (jetstream.Msg, error) {
	fctx, cancel := context.WithTimeout(ctx, c.maxWait)
	defer cancel()
	batch, err := c.cons.Fetch(1, jetstream.FetchContext(fctx))
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if d, ok := fctx.Deadline(); ok && !time.Now().Before(d) {
			return nil, nil // expired before the pull went out: the caller checks ctx
		}
		return nil, fmt.Errorf("pool consumer: fetch: %w", err)
	}
	var msg jetstream.Msg
	for m := range batch.Messages() {
		msg = m
	}
	if msg != nil {
		return msg, nil
	}
	if ctx.Err() != nil {
		return nil, ctx.Err()
	}
	// A pull that expired empty is "none ready": the library hides the server's 408,
	// and our own deadline shows as DeadlineExceeded.
	if err := batch.Error(); err != nil && !errors.Is(err, context.DeadlineExceeded) {
		return nil, fmt.Errorf("pool consumer: fetch: %w", err)
	}
	return nil, nil
}

// ack confirms msg and reports whether the confirmation came within the window
// counted from start. A batch that is not used is nak'ed when its ack failed, so that
// another job gets it without waiting for the ack wait (a no-op if the ack did land).
func (c *Consumer) ack(ctx context.Context, msg jetstream.Msg, start time.Time) bool {
	left := c.window - c.since(start)
	if left <= 0 {
		_ = msg.Nak()
		return false
	}
	actx, cancel := context.WithTimeout(ctx, left)
	err := msg.DoubleAck(actx)
	cancel()
	if err != nil {
		_ = msg.Nak()
		return false
	}
	return c.since(start) < c.window
}

// ConsumerStats counts one Consumer's batches.
type ConsumerStats struct {
	Used    uint64 `json:"used"`    // returned by Next
	Dropped uint64 `json:"dropped"` // received but not confirmed in time: a gap
}

// Stats returns the Consumer's counts so far.
func (c *Consumer) Stats() ConsumerStats {
	return ConsumerStats{Used: c.used.Load(), Dropped: c.dropped.Load()}
}
