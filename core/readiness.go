package core

import (
	"fmt"
	"time"

	"github.com/leafbus/leafbus/snowflake"
)

// Readiness is this node's state, as /readyz and the status page judge it (the faces
// take it from here): the dispenser answers from the segment generator, the heartbeat
// and the snowflake generator (HealthOf), the monotonic marks and the deployment record.
type Readiness interface {
	Health() Health
}

// ReadinessFunc adapts a func to Readiness.
type ReadinessFunc func() Health

// Health implements Readiness.
func (f ReadinessFunc) Health() Health { return f() }

// Health is what readiness is judged on.
type Health struct {
	// TagsLoaded: the segment generator has loaded the tag list (segment.Stats.Ready).
	TagsLoaded bool
	// WorkerIDHeld: this node holds its worker ID (the heartbeat has not lost the lease).
	WorkerIDHeld bool
	// LastBeat is when the last clock record was written (HeartbeatStats.LastSuccess);
	// zero before the first.
	LastBeat time.Time
	// Suspended says why snowflake IDs are suspended ("" when they are not).
	Suspended string
	// ClockBehind is how far the clock reads behind the highest reading the snowflake
	// generator has seen (snowflake.Stats.Offset): a step back.
	ClockBehind time.Duration
	// Warning says what is wrong around this node while it still serves safely (a
	// deployment record it refused), "" when nothing: /readyz stays 200 and tells it
	// after "ready".
	Warning string
}

// ReadyBounds are the limits readiness is judged by: how old the last clock record may
// be (the heartbeat is fresh) and how far the clock may read behind its highest reading
// (the step the snowflake generator waits out rather than refusing).
type ReadyBounds struct {
	BeatMaxAge     time.Duration
	ClockBehindMax time.Duration
}

// DefaultReadyBounds are /readyz's: a record at most 10 s old (ten record intervals),
// and the generator's own wait for a clock step back.
func DefaultReadyBounds() ReadyBounds {
	return ReadyBounds{BeatMaxAge: 10 * time.Second, ClockBehindMax: snowflake.DefaultMaxBackwardWait}
}

// NotReady lists why a node whose health is h does not serve both kinds safely at now,
// or nil when it does. Every reason is told, so one look at /readyz explains an outage;
// the faces add their own (draining, saturated).
func (h Health) NotReady(now time.Time, b ReadyBounds) []string {
	var why []string
	if !h.TagsLoaded {
		why = append(why, "segment tags not loaded yet")
	}
	if !h.WorkerIDHeld {
		why = append(why, "no worker ID held (lease lost or not acquired)")
	}
	switch age := now.Sub(h.LastBeat); {
	case h.LastBeat.IsZero():
		why = append(why, "heartbeat: no clock record written yet")
	case age > b.BeatMaxAge:
		why = append(why, fmt.Sprintf("heartbeat stale: last clock record written %v ago (limit %v)", age.Round(time.Millisecond), b.BeatMaxAge))
	}
	if h.Suspended != "" {
		why = append(why, "snowflake IDs suspended: "+h.Suspended)
	}
	if h.ClockBehind > b.ClockBehindMax {
		why = append(why, fmt.Sprintf("clock behind: it reads %v earlier than its highest reading (waited out up to %v)", h.ClockBehind, b.ClockBehindMax))
	}
	return why
}
