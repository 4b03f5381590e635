package httpapi

import (
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/leafbus/leafbus/core"
)

// notReady lists why this node does not serve both kinds safely now, or nil when it
// does. Every reason is told, so one look at /readyz explains an outage.
func (s *Server) notReady() []string {
	if s.draining.Load() {
		return []string{"shutting down"}
	}
	if s.cfg.Readiness == nil {
		return []string{"no readiness source is configured"}
	}
	why := s.cfg.Readiness.Health().NotReady(s.now(), core.ReadyBounds{BeatMaxAge: s.cfg.BeatMaxAge, ClockBehindMax: s.cfg.ClockBehindMax})
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
