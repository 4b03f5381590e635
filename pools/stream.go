package pools

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/leafbus/leafbus/internal/backoff"
	"github.com/leafbus/leafbus/wire"
)

// DuplicateWindow is the stream's message-ID deduplication window. A batch whose
// publish outcome is unknown is retried with the same ID only within half of it, so a
// retry can never store a batch the server already forgot it had stored.
const DuplicateWindow = 2 * time.Minute

// maxTextBytesPerID bounds one ID in a text body: 19 digits and a newline.
const maxTextBytesPerID = 20

// StreamConfig configures a Stream. Start from DefaultStreamConfig and set JetStream,
// Specs and the sources.
type StreamConfig struct {
	// JetStream is where the stream lives; its connection's max payload must hold a
	// batch of the largest Size as text (20 bytes per ID).
	JetStream jetstream.JetStream
	// Prefix is the deployment's subject prefix ("leaf").
	Prefix string
	// Specs lists the pools: each keeps Depth batches of Size IDs in the stream.
	Specs []Spec
	// Segments and Snowflakes fill the pools of their kind; each is required when a
	// pool of its kind is configured.
	Segments   SegmentSource
	Snowflakes SnowflakeSource
	// Excluded, when set, is asked before each top-up of a segment pool whether its tag
	// must not be pooled at all (a monotonic tag: a batch cut ahead of time would reach
	// a job out of order). While it says so, nothing is published for the pool and the
	// batches already in the stream for it are purged, so that no job takes them later;
	// an error (the answer is not known yet) pauses the pool.
	Excluded func(tag string) (bool, error)
	// Replicas of the stream (--kv-replicas), 1 to 5. Default 1. Every dispenser of a
	// deployment must use the same value: each one updates the stream to its own.
	Replicas int
	// AckWait of the pool consumers, at least wire.PoolMinAckWait. Default wire.PoolMinAckWait.
	AckWait time.Duration
	// Poll is how often a full pool looks whether batches were taken. Default 250ms; > 0.
	Poll time.Duration
	// PublishTimeout bounds one publish (and one stream info request); the stream and
	// consumer set-up gets twice as long. Default 5s; > 0.
	PublishTimeout time.Duration
	// Logger receives set-up, fill and publish failures; nil discards.
	Logger *slog.Logger
}

// Stream keeps the JetStream bulk pools of PROTOCOL.md "Bulk batches" topped up: the
// work-queue stream <PREFIX>_POOL (subjects <prefix>.pool.>), per pool a durable pull
// consumer <kind>_<tag> shared by every job, and a feeder that publishes batches of Size
// IDs as text bodies until Depth of them are stored. It is Batches' idea with the ready
// batches kept in JetStream instead of memory, for jobs that do not go through the
// request/reply service. Run it on every dispenser with the same pools; they share
// the stream and consumers.
//
// Bounded: a feeder publishes only after reading, in one stream info request, the
// stream's last sequence and the number of messages on its subject, and only while that
// number is below Depth; the publish carries Nats-Expected-Last-Sequence, so it is
// refused when anyone published to the stream in between. Two dispensers (or two
// pools) topping up at once can therefore never both add the last free place: each
// subject holds at most Depth messages (ready or delivered and not yet acked). The
// refused feeder reads again and retries. The pools of one Stream publish one at a time,
// so they only ever conflict with other dispensers. The stream also sets
// MaxMsgsPerSubject to MaxDepth with DiscardNewPerSubject, a server-side backstop
// that does not depend on any dispenser's pool list.
//
// Never stored twice: each batch carries Nats-Msg-Id <kind>.<tag>.<first ID>. A publish
// whose outcome is unknown (timed out, connection lost) is retried with the same batch
// and ID, which the server acknowledges as a duplicate if the first try was stored; the
// batch is dropped (a gap) rather than retried once half the stream's duplicate window
// has passed since that first unknown outcome. Batches of different dispensers never
// overlap because their IDs come from their own segments and worker IDs.
type Stream struct {
	js     jetstream.JetStream
	cfg    StreamConfig
	name   string
	sf     SnowflakeSource
	pools  []*streamPool
	logger *slog.Logger

	// pubMu serialises one Stream's info-then-publish steps: the stream-wide
	// expected-sequence check then only conflicts with other dispensers.
	pubMu sync.Mutex

	mu      sync.Mutex
	running bool
	stream  jetstream.Stream // set by ensure
}

// streamPool is one pool's feeder state and counters.
type streamPool struct {
	spec     Spec
	subject  string
	consumer string

	stored                             atomic.Int64 // messages on the subject when last looked
	purged                             bool         // feeder's own: the subject was purged since the tag became excluded
	published, duplicates, conflicts   atomic.Uint64
	dropped, fillErrors, publishErrors atomic.Uint64
	lastError                          atomic.Pointer[string]
}

// DefaultStreamConfig returns the settings NewStream was built for: prefix "leaf",
// one replica, the protocol's minimum ack wait. JetStream, Specs and the sources are
// left for the caller.
func DefaultStreamConfig() StreamConfig {
	return StreamConfig{
		Prefix:         "leaf",
		Replicas:       1,
		AckWait:        wire.PoolMinAckWait,
		Poll:           250 * time.Millisecond,
		PublishTimeout: 5 * time.Second,
	}
}

// Validate reports the first setting that is missing or out of range, naming the
// field, its value and the bound; the error wraps ErrInvalidPool.
func (c StreamConfig) Validate() error { return c.validate(wire.PoolMinAckWait) }

// validate is Validate with the ack wait's floor given, so that tests can watch an
// unacked batch come back without waiting 30 s.
func (c StreamConfig) validate(ackWaitFloor time.Duration) error {
	switch {
	case c.JetStream == nil:
		return fmt.Errorf("%w: stream: JetStream is nil", ErrInvalidPool)
	case c.Replicas < 1 || c.Replicas > 5:
		return fmt.Errorf("%w: stream: Replicas %d must be between 1 and 5", ErrInvalidPool, c.Replicas)
	case c.AckWait < ackWaitFloor:
		return fmt.Errorf("%w: stream: AckWait %v must be at least %v", ErrInvalidPool, c.AckWait, ackWaitFloor)
	case c.Poll <= 0:
		return fmt.Errorf("%w: stream: Poll %v must be > 0", ErrInvalidPool, c.Poll)
	case c.PublishTimeout <= 0:
		return fmt.Errorf("%w: stream: PublishTimeout %v must be > 0", ErrInvalidPool, c.PublishTimeout)
	}
	if err := wire.CheckPrefix(c.Prefix); err != nil {
		return fmt.Errorf("%w: stream: Prefix: %w", ErrInvalidPool, err)
	}
	if err := checkSpecs(c.Specs, c.Segments != nil, c.Snowflakes != nil); err != nil {
		return fmt.Errorf("stream: %w", err)
	}
	maxPayload := int64(-1)
	if nc := c.JetStream.Conn(); nc != nil {
		maxPayload = nc.MaxPayload()
	}
	for _, sp := range c.Specs {
		if body := int64(sp.Size) * maxTextBytesPerID; maxPayload > 0 && body > maxPayload {
			return fmt.Errorf("%w: stream pool %s: a batch may take %d bytes as text, over the connection's max payload %d",
				ErrInvalidPool, sp, body, maxPayload)
		}
	}
	return nil
}

// orDefaults gives zero fields with a default their DefaultStreamConfig value. It keeps
// callers written before DefaultStreamConfig (cmd/dispenser's serve.go) working; delete
// it once every caller starts from DefaultStreamConfig.
func (c StreamConfig) orDefaults() StreamConfig {
	d := DefaultStreamConfig()
	if c.Replicas == 0 {
		c.Replicas = d.Replicas
	}
	if c.AckWait == 0 {
		c.AckWait = d.AckWait
	}
	if c.Poll == 0 {
		c.Poll = d.Poll
	}
	if c.PublishTimeout == 0 {
		c.PublishTimeout = d.PublishTimeout
	}
	return c
}

// NewStream checks cfg; nothing is created until Run.
func NewStream(cfg StreamConfig) (*Stream, error) {
	return newStream(cfg, wire.PoolMinAckWait)
}

// newStream is NewStream with a lower ack-wait floor, for tests.
func newStream(cfg StreamConfig, ackWaitFloor time.Duration) (*Stream, error) {
	cfg = cfg.orDefaults()
	if err := cfg.validate(ackWaitFloor); err != nil {
		return nil, err
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	s := &Stream{js: cfg.JetStream, cfg: cfg, name: wire.Subjects{Prefix: cfg.Prefix}.PoolStream(), sf: cfg.Snowflakes, logger: logger}
	for _, sp := range cfg.Specs {
		s.pools = append(s.pools, &streamPool{
			spec:     sp,
			subject:  wire.Subjects{Prefix: cfg.Prefix}.Pool(sp.Kind, sp.Tag),
			consumer: wire.PoolConsumer(sp.Kind, sp.Tag),
		})
	}
	return s, nil
}

// Run creates (or updates) the stream and the pools' consumers, retrying until it
// succeeds, then keeps every pool topped up, one goroutine per pool, until ctx ends. It
// returns nil after every goroutine stopped; with no pools it returns at once. Calling
// Run twice is an error.
func (s *Stream) Run(ctx context.Context) error {
	s.mu.Lock()
	if s.running {
		s.mu.Unlock()
		return errors.New("pools: Stream.Run called twice")
	}
	s.running = true
	s.mu.Unlock()
	if len(s.pools) == 0 {
		return nil
	}
	bo := backoff.New(retryPolicy)
	for {
		err := s.ensure(ctx)
		if err == nil {
			break
		}
		if ctx.Err() != nil {
			return nil
		}
		if !backoff.Sleep(ctx, s.failed(bo, nil, "pools: set up the pool stream", err)) {
			return nil
		}
	}
	var wg sync.WaitGroup
	for _, p := range s.pools {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.feed(ctx, p)
		}()
	}
	wg.Wait()
	return nil
}

// ensure creates the stream, or updates it when it exists with other settings, and
// creates or updates every pool's consumer.
func (s *Stream) ensure(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 2*s.cfg.PublishTimeout)
	defer cancel()
	st, err := s.ensureStream(ctx)
	if err != nil {
		return err
	}
	for _, p := range s.pools {
		_, err := s.js.CreateOrUpdateConsumer(ctx, s.name, jetstream.ConsumerConfig{
			Durable:       p.consumer,
			Description:   "leafbus pool " + p.spec.Kind.String() + ":" + p.spec.Tag + ": fetch one batch, AckSync, use it only if confirmed within half the ack wait",
			FilterSubject: p.subject,
			AckPolicy:     jetstream.AckExplicitPolicy,
			AckWait:       s.cfg.AckWait,
			DeliverPolicy: jetstream.DeliverAllPolicy,
			MaxDeliver:    -1,
		})
		if err != nil {
			return fmt.Errorf("create or update consumer %s on %s: %w", p.consumer, s.name, err)
		}
	}
	s.mu.Lock()
	s.stream = st
	s.mu.Unlock()
	return nil
}

// ensureStream creates the pool stream; when it exists it updates it only if a setting
// this package owns differs. Every dispenser runs this at start, often at the same
// moment: an update that changes nothing still rewrites the stream's store
// configuration, and nats-server 2.15 races that rewrite against a consumer being
// created on the same stream (a data race inside the server). Creating with the same
// settings, or leaving a matching stream alone, does not touch the store.
func (s *Stream) ensureStream(ctx context.Context) (jetstream.Stream, error) {
	want := s.streamConfig()
	st, err := s.js.CreateStream(ctx, want)
	if err == nil {
		return st, nil
	}
	if !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
		return nil, fmt.Errorf("create stream %s: %w", s.name, err)
	}
	// It exists with other settings than a create would have made: perhaps only ones
	// an operator set (limits we leave unset), perhaps ours from another version.
	st, err = s.js.Stream(ctx, s.name)
	if err != nil {
		return nil, fmt.Errorf("read stream %s: %w", s.name, err)
	}
	if sameOwnedSettings(st.CachedInfo().Config, want) {
		return st, nil
	}
	st, err = s.js.UpdateStream(ctx, want)
	if err != nil {
		return nil, fmt.Errorf("update stream %s: %w", s.name, err)
	}
	s.logger.Info("pools: updated the pool stream's settings", "stream", s.name)
	return st, nil
}

// streamConfig is the pool stream as this package makes it.
func (s *Stream) streamConfig() jetstream.StreamConfig {
	return jetstream.StreamConfig{
		Name:        s.name,
		Description: "leafbus: ready ID batches for bulk consumers (PROTOCOL.md, Bulk batches)",
		Subjects:    []string{s.cfg.Prefix + ".pool.>"},
		Retention:   jetstream.WorkQueuePolicy,
		Storage:     jetstream.FileStorage,
		Replicas:    s.cfg.Replicas,
		// The backstop bound; the exact one is each feeder's checked publish.
		MaxMsgsPerSubject:    MaxDepth,
		Discard:              jetstream.DiscardNew,
		DiscardNewPerSubject: true,
		Duplicates:           DuplicateWindow,
	}
}

// sameOwnedSettings reports whether have matches want in every setting streamConfig
// sets. Settings it leaves unset (limits an operator may add) are not compared.
func sameOwnedSettings(have, want jetstream.StreamConfig) bool {
	return have.Description == want.Description &&
		slices.Equal(have.Subjects, want.Subjects) &&
		have.Retention == want.Retention &&
		have.Storage == want.Storage &&
		have.Replicas == want.Replicas &&
		have.MaxMsgsPerSubject == want.MaxMsgsPerSubject &&
		have.Discard == want.Discard &&
		have.DiscardNewPerSubject == want.DiscardNewPerSubject &&
		have.Duplicates == want.Duplicates
}

// streamBatch is a filled batch that is not known to be stored yet.
type streamBatch struct {
	body  []byte
	msgID string
	// unsureSince is when a publish of this batch first ended without an answer
	// (zero: every try so far was refused for sure). From then on it may be stored.
	unsureSince time.Time
}

// feed is one pool's top-up loop.
func (s *Stream) feed(ctx context.Context, p *streamPool) {
	logger := s.logger.With("pool", p.spec.String(), "subject", p.subject)
	ids := make([]int64, p.spec.Size)
	var pending *streamBatch
	bo := backoff.New(retryPolicy)
	for ctx.Err() == nil {
		if s.excluded(ctx, p, logger) {
			if pending != nil {
				p.dropped.Add(1) // cut before the tag was excluded: a gap, never a late batch
				pending = nil
			}
			backoff.Sleep(ctx, s.cfg.Poll)
			continue
		}
		if pending == nil {
			full, err := s.full(ctx, p)
			if err != nil {
				if ctx.Err() != nil {
					return
				}
				p.publishErrors.Add(1)
				backoff.Sleep(ctx, s.failed(bo, p, "pools: read the pool stream", err))
				continue
			}
			if full {
				backoff.Sleep(ctx, s.cfg.Poll)
				continue
			}
			if err := s.source(ctx, p.spec, ids); err != nil {
				if ctx.Err() != nil {
					return
				}
				p.fillErrors.Add(1)
				backoff.Sleep(ctx, s.failed(bo, p, "pools: fill a stream batch", err))
				continue
			}
			pending = &streamBatch{
				body:  wire.AppendIDs(make([]byte, 0, len(ids)*maxTextBytesPerID), ids, wire.Text),
				msgID: p.spec.Kind.String() + "." + wire.TagToken(p.spec.Tag) + "." + strconv.FormatInt(ids[0], 10),
			}
		}
		res, err := s.publish(ctx, p, pending)
		switch {
		case err != nil:
			if ctx.Err() != nil {
				return // the pending batch is forgotten: a gap at worst
			}
			p.publishErrors.Add(1)
			backoff.Sleep(ctx, s.failed(bo, p, "pools: publish a stream batch", err))
		case res == pubDropped:
			p.dropped.Add(1)
			logger.Warn("pools: dropped a batch whose publish outcome stayed unknown past half the duplicate window", "msg_id", pending.msgID)
			pending = nil
		case res == pubFull:
			backoff.Sleep(ctx, s.cfg.Poll)
		case res == pubConflict:
			p.conflicts.Add(1)
			// Another dispenser published in between: read again after a short
			// random pause, so that two feeders fall out of step.
			backoff.Sleep(ctx, rand.N(2*time.Millisecond))
		case res == pubStored || res == pubDuplicate:
			if bo.Failures() != 0 {
				logger.Info("pools: stream top-up works again")
				bo.Reset()
			}
			if res == pubDuplicate {
				p.duplicates.Add(1)
			}
			p.published.Add(1)
			pending = nil
		}
	}
}

// full reads whether p's subject holds Depth messages already.
func (s *Stream) full(ctx context.Context, p *streamPool) (bool, error) {
	s.pubMu.Lock()
	defer s.pubMu.Unlock()
	_, count, _, err := s.state(ctx, p)
	if err != nil {
		return false, err
	}
	return count >= p.spec.Depth, nil
}

// state reads the stream's last sequence, the messages on p's subject and the
// duplicate window in one request, in that order on the server: a message published
// after the sequence was read makes a publish expecting it fail.
func (s *Stream) state(ctx context.Context, p *streamPool) (lastSeq uint64, count int, dupWindow time.Duration, err error) {
	s.mu.Lock()
	st := s.stream
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, s.cfg.PublishTimeout)
	defer cancel()
	info, err := st.Info(ctx, jetstream.WithSubjectFilter(p.subject))
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		// Deleted under us (by an operator): make it again, with the consumers.
		if err = s.ensure(ctx); err == nil {
			s.mu.Lock()
			st = s.stream
			s.mu.Unlock()
			info, err = st.Info(ctx, jetstream.WithSubjectFilter(p.subject))
		}
	}
	if err != nil {
		return 0, 0, 0, fmt.Errorf("stream %s info: %w", s.name, err)
	}
	count = int(info.State.Subjects[p.subject])
	p.stored.Store(int64(count))
	return info.State.LastSeq, count, info.Config.Duplicates, nil
}

type pubResult int

const (
	pubStored    pubResult = iota // stored now
	pubDuplicate                  // the server had it already: an earlier unknown outcome was a success
	pubFull                       // the subject holds Depth messages: keep the batch for later
	pubConflict                   // someone published since the state was read: read again
	pubDropped                    // the outcome stayed unknown too long: drop the batch
)

// publish makes one checked attempt to store b on p's subject.
func (s *Stream) publish(ctx context.Context, p *streamPool, b *streamBatch) (pubResult, error) {
	s.pubMu.Lock()
	defer s.pubMu.Unlock()
	lastSeq, count, dupWindow, err := s.state(ctx, p)
	if err != nil {
		return 0, err
	}
	if !b.unsureSince.IsZero() && time.Since(b.unsureSince) >= dupWindow/2 {
		return pubDropped, nil
	}
	if count >= p.spec.Depth {
		return pubFull, nil
	}
	pctx, cancel := context.WithTimeout(ctx, s.cfg.PublishTimeout)
	defer cancel()
	ack, err := s.js.Publish(pctx, p.subject, b.body,
		jetstream.WithMsgID(b.msgID),
		jetstream.WithExpectStream(s.name),
		jetstream.WithExpectLastSequence(lastSeq),
	)
	if err == nil {
		if ack.Duplicate {
			return pubDuplicate, nil
		}
		return pubStored, nil
	}
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		// The stream answered: this try was not stored.
		if apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence ||
			apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant {
			return pubConflict, nil
		}
		return 0, fmt.Errorf("publish %s to %s: %w", b.msgID, p.subject, err)
	}
	if b.unsureSince.IsZero() {
		b.unsureSince = time.Now()
	}
	return 0, fmt.Errorf("publish %s to %s, outcome unknown (retried with the same message ID): %w", b.msgID, p.subject, err)
}

// excluded reads whether p's tag must not be pooled now, purging the subject once each
// time it becomes so; a failed read or purge counts as excluded, so that the pool
// pauses and asks again.
func (s *Stream) excluded(ctx context.Context, p *streamPool, logger *slog.Logger) bool {
	if s.cfg.Excluded == nil || p.spec.Kind != wire.Segment {
		return false
	}
	ex, err := s.cfg.Excluded(p.spec.Tag)
	if err != nil {
		p.fillErrors.Add(1)
		msg := err.Error()
		p.lastError.Store(&msg)
		return true
	}
	if !ex {
		p.purged = false
		return false
	}
	if !p.purged {
		if err := s.purge(ctx, p); err != nil {
			p.publishErrors.Add(1)
			logger.Warn("pools: the pool's tag may not be pooled, and its batches could not be purged; retrying", "err", err)
			return true
		}
		p.purged = true
		logger.Warn("pools: the pool's tag may not be pooled (it is monotonic): purged its batches from the stream; none are published while it stays so")
	}
	return true
}

// purge removes every batch on p's subject, ready or delivered and not yet acked (a
// job whose ack then fails drops the batch unused).
func (s *Stream) purge(ctx context.Context, p *streamPool) error {
	s.mu.Lock()
	st := s.stream
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, s.cfg.PublishTimeout)
	defer cancel()
	if err := st.Purge(ctx, jetstream.WithPurgeSubject(p.subject)); err != nil {
		return fmt.Errorf("purge %s from stream %s: %w", p.subject, s.name, err)
	}
	p.stored.Store(0)
	return nil
}

// source fills ids from the pool's generator.
func (s *Stream) source(ctx context.Context, sp Spec, ids []int64) error {
	var err error
	if sp.Kind == wire.Snowflake {
		err = s.sf.Fill(ids)
	} else {
		err = s.cfg.Segments.Fill(ctx, sp.Tag, ids)
	}
	if err != nil {
		return fmt.Errorf("pools: fill %s: %w", sp, err)
	}
	return nil
}

// failed records err, logs it (loudly the first time in a row) and returns the pause
// before the next attempt.
func (s *Stream) failed(bo *backoff.Backoff, p *streamPool, what string, err error) time.Duration {
	logger := s.logger
	if p != nil {
		msg := err.Error()
		p.lastError.Store(&msg)
		logger = logger.With("pool", p.spec.String())
	}
	wait := bo.Next()
	if bo.Failures() == 1 {
		logger.Warn(what+" failed, retrying with back-off", "err", err, "retry_in", wait)
	} else {
		logger.Debug(what+" failed again", "err", err, "retry_in", wait)
	}
	return wait
}

// StreamStats is a snapshot of one stream pool. Counts are of batches.
type StreamStats struct {
	Kind     string `json:"kind"`
	Tag      string `json:"tag"`
	Size     int    `json:"size"`  // IDs per batch
	Depth    int    `json:"depth"` // the most batches kept in the stream
	Subject  string `json:"subject"`
	Consumer string `json:"consumer"`
	// Stored is the messages on the subject when the feeder last looked: ready ones
	// and ones delivered to a job and not acked yet.
	Stored        int    `json:"stored"`
	Published     uint64 `json:"published"`  // stored by this dispenser (Duplicates included)
	Duplicates    uint64 `json:"duplicates"` // retries the server had already stored
	Conflicts     uint64 `json:"conflicts"`  // publishes refused because another dispenser published first
	Dropped       uint64 `json:"dropped"`    // batches given up (a gap in the IDs)
	FillErrors    uint64 `json:"fill_errors"`
	PublishErrors uint64 `json:"publish_errors"`
	LastError     string `json:"last_error,omitempty"`
	// Borrowed is, for snowflake pools, how far the generator's highest issued
	// timestamp is ahead of the clock (0 when it is not, or the source cannot tell).
	Borrowed time.Duration `json:"borrowed_ns"`
}

// Stats returns a snapshot of every pool, in the order of StreamConfig.Specs.
func (s *Stream) Stats() []StreamStats {
	borrowed := borrowed(s.sf)
	out := make([]StreamStats, 0, len(s.pools))
	for _, p := range s.pools {
		st := StreamStats{
			Kind:          p.spec.Kind.String(),
			Tag:           p.spec.Tag,
			Size:          p.spec.Size,
			Depth:         p.spec.Depth,
			Subject:       p.subject,
			Consumer:      p.consumer,
			Stored:        int(p.stored.Load()),
			Published:     p.published.Load(),
			Duplicates:    p.duplicates.Load(),
			Conflicts:     p.conflicts.Load(),
			Dropped:       p.dropped.Load(),
			FillErrors:    p.fillErrors.Load(),
			PublishErrors: p.publishErrors.Load(),
		}
		if e := p.lastError.Load(); e != nil {
			st.LastError = *e
		}
		if p.spec.Kind == wire.Snowflake {
			st.Borrowed = borrowed
		}
		out = append(out, st)
	}
	return out
}
