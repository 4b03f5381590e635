package httpapi

import (
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"
)

// Face is what one listener serves (PROTOCOL.md "HTTP", --monitor-listen): the ID API
// may face browsers, the operator pages (the status page, /cache, /db, /metrics) show
// the segment counters of every tag, and an opaque tag's counter (its max_id, the
// position in its segment) is the input of its permutation: whoever reads it can tell
// how many IDs the tag handed out, which opaque IDs exist to hide.
type Face int

const (
	// FaceAll is the one listener of a dispenser without --monitor-listen: the ID API
	// and the operator pages, where opaque tags' counters are left out.
	FaceAll Face = iota
	// FaceIDs is the ID API (and /healthz, /readyz) only: the operator pages are 404.
	FaceIDs
	// FaceMonitor is the operator pages (and /healthz, /readyz) only, every tag's
	// counters shown: the ID API is 404.
	FaceMonitor
)

// servesPages reports whether the face serves the operator pages.
func (s *Server) servesPages() bool { return s.cfg.Face != FaceIDs }

// servesIDs reports whether the face serves the ID API (segment, snowflake, decode).
func (s *Server) servesIDs() bool { return s.cfg.Face != FaceMonitor }

// hides reports whether tag's counters are left out of this face's pages: an opaque
// tag's, anywhere but on the monitor listener.
func (s *Server) hides(tag string) bool {
	return s.cfg.Face != FaceMonitor && s.cfg.Status.Opaque != nil && s.cfg.Status.Opaque(tag)
}

// notHere answers 404 for a path the other listener serves.
func (s *Server) notHere(w http.ResponseWriter, r *http.Request) {
	where := "the --monitor-listen listener"
	if s.cfg.Face == FaceMonitor {
		where = "the --http listener"
	}
	writeError(w, http.StatusNotFound, "no such path here: "+oneLine(r.URL.Path)+" is served on "+where)
}

// metricsHandler is /metrics for the face: the registry as it is on the monitor
// listener, and without the series of opaque tags elsewhere (when the Metrics can be
// gathered from; nil Metrics: nil).
func (s *Server) metricsHandler() http.Handler {
	m := s.cfg.Metrics
	if m == nil {
		return nil
	}
	g, ok := m.(interface{ Gatherer() prometheus.Gatherer })
	if s.cfg.Face == FaceMonitor || s.cfg.Status.Opaque == nil || !ok {
		return m.Handler()
	}
	return promhttp.HandlerFor(hidingGatherer{g: g.Gatherer(), hides: s.hides}, promhttp.HandlerOpts{
		ErrorHandling:       promhttp.ContinueOnError,
		MaxRequestsInFlight: 2,
	})
}

// hidingGatherer gathers g without the series whose tag label is a tag hides.
type hidingGatherer struct {
	g     prometheus.Gatherer
	hides func(tag string) bool
}

func (h hidingGatherer) Gather() ([]*dto.MetricFamily, error) {
	fams, err := h.g.Gather()
	for _, f := range fams {
		kept := f.Metric[:0]
		for _, m := range f.Metric {
			if !h.hidden(m) {
				kept = append(kept, m)
			}
		}
		f.Metric = kept
	}
	return fams, err
}

func (h hidingGatherer) hidden(m *dto.Metric) bool {
	for _, l := range m.GetLabel() {
		if l.GetName() == "tag" && h.hides(l.GetValue()) {
			return true
		}
	}
	return false
}
