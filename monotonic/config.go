package monotonic

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/leafbus/leafbus/segment"
	"github.com/leafbus/leafbus/wire"
)

// SegmentTaker takes fresh segments past the buffers (segment.Generator.TakeSegment):
// every range it returns lies above every range any dispenser took before the call.
type SegmentTaker interface {
	TakeSegment(ctx context.Context, tag string, step int64) (segment.Range, error)
}

// Config configures a Manager. Start from DefaultConfig.
type Config struct {
	// Prefix names the buckets: <prefix>_tagopts (the marks) and <prefix>_leaders (the
	// leases). NodeID names this dispenser in lease records and logs.
	Prefix string
	NodeID string

	// Conn carries forwarded requests: a leader subscribes an inbox subject of its own
	// per tag (nats.Conn.NewInbox, so the connection's custom inbox prefix applies) and
	// followers send requests to it. Besides inbox subjects it asks
	// $SRV.PING.<prefix>.<instance> with replies on _INBOX_<prefix>_mono.> (verify.go),
	// which deploy/nats-roles.conf allows. JetStream holds the buckets.
	Conn      *nats.Conn
	JetStream jetstream.JetStream
	Replicas  int // replicas of both buckets (1, or 3 on a NATS cluster)

	// ServiceID returns the $SRV instance ID of this dispenser's service (the ID its
	// $SRV.PING.<prefix>.<id> answers to). Lease records name it as the leader's
	// instance, and followers forward only to a leader whose instance answers there
	// (verified once per term). Asked once, when Run starts. Required.
	ServiceID func() string

	// MemoryFile is the file of the data dir that remembers the tags this dispenser
	// treated as monotonic, so that a lost <prefix>_tagopts never makes one ordinary
	// (memory.go). It is created when missing; a damaged one fails New. Required.
	MemoryFile string

	// IDKey is the fingerprint of the ID key of opaque tags this dispenser holds
	// (opaque.Fingerprint; "" without one), published in its presence record: a range of
	// an opaque tag is written only while every dispenser with a record holds its key.
	IDKey string

	// SegmentMarks are this dispenser's segment high-water marks (segment.Config.Marks):
	// a tag with a mark is one it may have served as an ordinary tag, and may still be
	// answering an ordinary request of. A tag marked while the dispensers run is led
	// from its first lease on only when no dispenser has a mark of it; else its first
	// leader waits half a lease TTL (presence.go). nil: every tag counts as served.
	SegmentMarks segment.Marks

	// Segments is where a leader's fresh segments come from. Required.
	Segments SegmentTaker
	// CodeOf turns the error a leader answers a forwarded request with into a wire code
	// and the text to send (core.CodeOf, the one table of codes: a 500 hides its
	// details, which the leader logs). Required.
	CodeOf func(error) (code int, description string)

	// LeaseTTL is how long a leader's lease lives without a renewal: the others take
	// it over once they have seen its record unchanged for LeaseTTL (their own
	// LeaseTTL, never the ttl_ms a record states), or, when its leader no longer
	// listens, once they have seen it unchanged for 2 renewals, and serve from half a
	// LeaseTTL after they first saw it: after a leader dies its tags are served again
	// after about half a LeaseTTL (requests wait meanwhile, within their own bound). A leader renews every
	// RenewInterval and stops serving at LeaseTTL/2 after the send of its last renewal
	// that succeeded, so LeaseTTL must be at least 4 renewals: two may fail before it
	// stops. The <prefix>_leaders bucket keeps records for 2 x LeaseTTL, so every
	// dispenser of a deployment must use the same.
	LeaseTTL      time.Duration
	RenewInterval time.Duration
	// RetryInterval is how often a follower tries again to take a lease it lost a race
	// for; 0: LeaseTTL/20.
	RetryInterval time.Duration

	// ForwardTimeout bounds one forwarded request, leader's wait included. WaitMax bounds
	// how long a request waits at the leader for its next segment, and a Fill whose ctx
	// has no deadline: the caller's own bound on a request's wait (core's WaitMax, which
	// the dispenser passes down). A request that finds no leader to serve it (a
	// hand-over, a leader waiting out the previous one, a leader not verified yet) waits
	// for the next one within the bound its caller gives, as a segment request waits
	// for a store that loads, and gets 503 only then.
	ForwardTimeout time.Duration
	WaitMax        time.Duration
	// MaxBatch is the largest count of one request (the service's max_batch).
	// MaxForward bounds the IDs of one forwarded message, which carries the requests a
	// follower received while earlier ones were under way (at least one request, so
	// MaxForward >= MaxBatch); MaxInFlight bounds a follower's forwarded messages under
	// way per tag.
	MaxBatch    int
	MaxForward  int
	MaxInFlight int

	// SegmentDuration and MaxStep are the dynamic step, as in segment.Config.
	SegmentDuration time.Duration
	MaxStep         int64

	// Now is the clock of leases and waits; only its monotonic readings are used. nil:
	// time.Now.
	Now    func() time.Time
	Logger *slog.Logger
}

// DefaultConfig returns the defaults; Conn, JetStream, Segments, CodeOf, NodeID,
// ServiceID and MemoryFile are left to the caller.
func DefaultConfig() Config {
	seg := segment.DefaultConfig()
	return Config{
		Prefix:          wire.DefaultPrefix,
		Replicas:        1,
		LeaseTTL:        6 * time.Second,
		RenewInterval:   time.Second,
		ForwardTimeout:  time.Second,
		WaitMax:         time.Second,
		MaxBatch:        wire.DefaultMaxBatch,
		MaxForward:      1 << 16,
		MaxInFlight:     4,
		SegmentDuration: seg.SegmentDuration,
		MaxStep:         seg.MaxStep,
	}
}

// Validate names the field, its value and the bound of the first bad setting.
func (c Config) Validate() error {
	if err := wire.CheckPrefix(c.Prefix); err != nil {
		return err
	}
	if err := wire.CheckNodeID(c.NodeID); err != nil {
		return fmt.Errorf("monotonic: config: NodeID: %w", err)
	}
	switch {
	case c.Conn == nil || c.JetStream == nil:
		return errors.New("monotonic: config: Conn and JetStream are required")
	case c.Segments == nil:
		return errors.New("monotonic: config: Segments is required")
	case c.CodeOf == nil:
		return errors.New("monotonic: config: CodeOf is required")
	case c.ServiceID == nil:
		return errors.New("monotonic: config: ServiceID is required: followers check a leader's $SRV instance")
	case c.MemoryFile == "":
		return errors.New("monotonic: config: MemoryFile is required: the data dir's file of monotonic tags")
	case c.Replicas < 1 || c.Replicas > 5:
		return fmt.Errorf("monotonic: config: Replicas %d: want 1 to 5", c.Replicas)
	case c.RenewInterval < time.Millisecond:
		return fmt.Errorf("monotonic: config: RenewInterval %v: want at least 1ms", c.RenewInterval)
	case c.LeaseTTL < 4*c.RenewInterval:
		return fmt.Errorf("monotonic: config: lease TTL %v is shorter than 4 x the renew interval %v (%v): a leader must survive two failed renewals before it stops at TTL/2",
			c.LeaseTTL, c.RenewInterval, 4*c.RenewInterval)
	case c.RetryInterval < 0 || c.RetryInterval > c.LeaseTTL/4:
		return fmt.Errorf("monotonic: config: RetryInterval %v: want 0 (LeaseTTL/20) up to LeaseTTL/4 (%v)", c.RetryInterval, c.LeaseTTL/4)
	case c.ForwardTimeout < time.Millisecond || c.WaitMax < time.Millisecond:
		return fmt.Errorf("monotonic: config: ForwardTimeout %v and WaitMax %v: want at least 1ms", c.ForwardTimeout, c.WaitMax)
	case wire.CheckMaxBatch(c.MaxBatch) != nil:
		return fmt.Errorf("monotonic: config: %w", wire.CheckMaxBatch(c.MaxBatch))
	case c.MaxForward < c.MaxBatch:
		return fmt.Errorf("monotonic: config: MaxForward %d is below MaxBatch %d: a request must fit in one forwarded message", c.MaxForward, c.MaxBatch)
	case c.MaxInFlight < 1:
		return fmt.Errorf("monotonic: config: MaxInFlight %d: want at least 1", c.MaxInFlight)
	case c.SegmentDuration < time.Millisecond:
		return fmt.Errorf("monotonic: config: SegmentDuration %v: want at least 1ms", c.SegmentDuration)
	case c.MaxStep < 1 || c.MaxStep > segment.MaxStoredStep:
		return fmt.Errorf("monotonic: config: MaxStep %d: want 1 to %d", c.MaxStep, segment.MaxStoredStep)
	}
	return nil
}

func (c Config) retryInterval() time.Duration {
	if c.RetryInterval > 0 {
		return c.RetryInterval
	}
	return max(c.LeaseTTL/20, time.Millisecond)
}
