package httpapi

import (
	"fmt"
	"net/http"
	"strings"
	"time"
)

// Readiness tells /readyz what this node's state is; the dispenser answers from the
// segment generator, the heartbeat and the snowflake generator.
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

// notReady lists why this node does not serve both kinds safely now, or nil when it
// does. Every reason is told, so one look at /readyz explains an outage.
func (s *Server) notReady() []string {
	if s.draining.Load() {
		return []string{"shutting down"}
	}
	if s.cfg.Readiness == nil {
		return []string{"no readiness source is configured"}
	}
	h := s.cfg.Readiness.Health()
	now := s.now()
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
	case age > s.cfg.BeatMaxAge:
		why = append(why, fmt.Sprintf("heartbeat stale: last clock record written %v ago (limit %v)", age.Round(time.Millisecond), s.cfg.BeatMaxAge))
	}
	if h.Suspended != "" {
		why = append(why, "snowflake IDs suspended: "+h.Suspended)
	}
	if h.ClockBehind > s.cfg.ClockBehindMax {
		why = append(why, fmt.Sprintf("clock behind: it reads %v earlier than its highest reading (waited out up to %v)", h.ClockBehind, s.cfg.ClockBehindMax))
	}
	if at := time.Duration(s.refusedAt.Load()); at != 0 && s.mono()-at < saturatedFor {
		why = append(why, fmt.Sprintf("saturated: HTTP requests or connections turned away %v ago (%d of %d requests in progress, %d of %d connections open)",
			(s.mono()-at).Round(time.Millisecond), min(max(s.inFlight.Load(), 0), int64(s.cfg.MaxInFlight)), s.cfg.MaxInFlight, s.conns.open(), s.cfg.MaxConns))
	}
	return why
}

// saturatedFor is how long /readyz says the node is saturated after it last turned a
// request (MaxInFlight) or a connection (MaxConns) away for want of room: long enough
// for a load balancer's probe to see it.
const saturatedFor = 5 * time.Second

// healthz answers 200 while the process runs and serves HTTP at all.
func (s *Server) healthz(w http.ResponseWriter, _ *http.Request) {
	writeBody(w, contentText, []byte("ok\n"))
}

// readyz answers 200 "ready" while this node serves both kinds safely, else 503 with
// every reason on one line.
func (s *Server) readyz(w http.ResponseWriter, _ *http.Request) {
	if why := s.notReady(); len(why) > 0 {
		writeError(w, http.StatusServiceUnavailable, "not ready: "+strings.Join(why, "; "))
		return
	}
	body := "ready\n"
	if warn := s.warning(); warn != "" {
		body += "warning: " + warn + "\n"
	}
	writeBody(w, contentText, []byte(body))
}

// warning is Health.Warning now, for /readyz and the status page.
func (s *Server) warning() string {
	if s.cfg.Readiness == nil {
		return ""
	}
	return s.cfg.Readiness.Health().Warning
}
