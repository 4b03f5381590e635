// Package metrics is the dispenser's Prometheus face: counters and latency histograms
// of the requests both transports answer (NATS and HTTP), and, read at each scrape, the
// state of the segment buffers, the snowflake worker, the pools and the embedded NATS
// server. It keeps its own registry (never the global one), with the Go runtime and
// process collectors, and serves it with promhttp, as a Prometheus exporter does.
//
// The request path calls Observe once per answered request; it takes no lock and
// allocates nothing for the known transports, kinds and codes. Everything else is read
// from Sources when Prometheus scrapes, so nothing runs between scrapes.
package metrics

import (
	"fmt"
	"net/http"
	"strconv"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"

	"github.com/leafbus/leafbus/internal/buildinfo"
	"github.com/leafbus/leafbus/wire"
)

// Observer is told about every request a dispenser answers; the NATS service and the
// HTTP face both call it, so the two transports are counted alike.
type Observer interface {
	// Observe records one answered request. transport is NATS or HTTP; kind is
	// "segment", "snowflake" (wire.Kind's String) or KindDecode; code is 200 for
	// success, else the error's code (core.CodeOf); seconds is how long the request
	// took; ids how many IDs it handed out (0 for an error).
	Observe(transport, kind string, code int, seconds float64, ids int)
}

// Transports, and the kind of snowflake decode requests: wire's label values.
const (
	NATS       = wire.TransportNATS
	HTTP       = wire.TransportHTTP
	KindDecode = wire.KindDecode
)

// OtherTag is the tag label under which the tags beyond Config.MaxTags are summed.
const OtherTag = "_other"

// DefaultMaxTags is the default of --metrics-max-tags.
const DefaultMaxTags = 100

// Config configures Metrics.
type Config struct {
	// Build is shown as leafbus_build_info{version, revision, goversion}.
	Build buildinfo.Info
	// MaxTags bounds the tag label of the per-tag segment metrics (--metrics-max-tags):
	// the MaxTags busiest tags (by IDs issued) are shown by name and every other tag is
	// summed under tag="_other", so a scrape holds at most MaxTags+1 tag values. The
	// monotonic tags' metrics are bounded the same way, showing the first MaxTags by name.
	MaxTags int
	// Sources are read at each scrape; nil funcs are left out.
	Sources Sources
}

// Validate names the field, value and bound of a bad setting.
func (c Config) Validate() error {
	if c.MaxTags < 0 {
		return fmt.Errorf("--metrics-max-tags %d: want 0 or more", c.MaxTags)
	}
	return nil
}

// Metrics holds the registry and the request metrics. It implements Observer.
type Metrics struct {
	reg      *prometheus.Registry
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
	issued   *prometheus.CounterVec
	rejected *prometheus.CounterVec
	handler  http.Handler

	// fast holds the children of the known label values, resolved once, so that
	// Observe is a few atomic adds.
	fast [len(transports)][len(kinds)]fastChildren
}

type fastChildren struct {
	codes    [len(codes)]prometheus.Counter
	duration prometheus.Observer
	issued   prometheus.Counter
}

var (
	transports = [...]string{NATS, HTTP}
	kinds      = [...]string{wire.Segment.String(), wire.Snowflake.String(), KindDecode}
	codes      = [...]int{200, 400, 404, 409, 500, 503}
)

// latencyBuckets span a request answered from memory (tens of microseconds) to one
// that waited for a segment load (the service's WaitMax, 2 s by default).
var latencyBuckets = []float64{
	0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005,
	0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5,
}

// New builds the registry: request metrics, the state collector over cfg.Sources,
// build info, and the Go runtime and process collectors.
func New(cfg Config) (*Metrics, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	m := &Metrics{
		reg: prometheus.NewRegistry(),
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "leafbus_requests_total",
			Help: "Requests answered, by transport (nats, http), kind (segment, snowflake, decode) and code (200, or the error code).",
		}, []string{"transport", "kind", "code"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "leafbus_request_duration_seconds",
			Help:    "Time from receiving a request to answering it, by transport and kind.",
			Buckets: latencyBuckets,
		}, []string{"transport", "kind"}),
		issued: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "leafbus_ids_issued_total",
			Help: "IDs handed out, by transport and kind.",
		}, []string{"transport", "kind"}),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "leafbus_requests_rejected_total",
			Help: "Requests refused at once with 503 because too many were already in progress, by transport.",
		}, []string{"transport"}),
	}
	build := prometheus.NewGauge(prometheus.GaugeOpts{
		Name:        "leafbus_build_info",
		Help:        "Always 1; the dispenser's module version, VCS revision (first 12 hex digits, \"\" when not stamped) and Go version as labels.",
		ConstLabels: prometheus.Labels{"version": cfg.Build.Version, "revision": cfg.Build.Revision, "goversion": cfg.Build.GoVersion},
	})
	build.Set(1)
	for _, c := range []prometheus.Collector{
		m.requests, m.duration, m.issued, m.rejected, build,
		newStateCollector(cfg.Sources, cfg.MaxTags),
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	} {
		if err := m.reg.Register(c); err != nil {
			return nil, fmt.Errorf("metrics: register: %w", err)
		}
	}
	m.resolve()
	m.handler = promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{
		ErrorHandling:       promhttp.ContinueOnError,
		Registry:            m.reg, // promhttp_metric_handler_errors_total
		MaxRequestsInFlight: 2,
	})
	return m, nil
}

// resolve fills fast with the children of every known label combination. The counters
// then show at 0 from the first scrape, so rates work from the first request on.
func (m *Metrics) resolve() {
	for t, transport := range transports {
		for k, kind := range kinds {
			f := &m.fast[t][k]
			for c, code := range codes {
				f.codes[c] = m.requests.WithLabelValues(transport, kind, strconv.Itoa(code))
			}
			f.duration = m.duration.WithLabelValues(transport, kind)
			f.issued = m.issued.WithLabelValues(transport, kind)
		}
		m.rejected.WithLabelValues(transport)
	}
}

// Observe implements Observer. Unknown transports and kinds are counted as "other",
// so a caller's mistake cannot grow the label set without bound.
func (m *Metrics) Observe(transport, kind string, code int, seconds float64, ids int) {
	t, k := indexOf(transports[:], transport), indexOf(kinds[:], kind)
	if t < 0 || k < 0 {
		m.observeSlow(transport, kind, code, seconds, ids, t, k)
		return
	}
	f := &m.fast[t][k]
	if c := indexOfCode(code); c >= 0 {
		f.codes[c].Inc()
	} else {
		m.requests.WithLabelValues(transport, kind, strconv.Itoa(code)).Inc()
	}
	f.duration.Observe(seconds)
	if ids > 0 {
		f.issued.Add(float64(ids))
	}
}

func (m *Metrics) observeSlow(transport, kind string, code int, seconds float64, ids, t, k int) {
	if t < 0 {
		transport = "other"
	}
	if k < 0 {
		kind = "other"
	}
	m.requests.WithLabelValues(transport, kind, strconv.Itoa(code)).Inc()
	m.duration.WithLabelValues(transport, kind).Observe(seconds)
	if ids > 0 {
		m.issued.WithLabelValues(transport, kind).Add(float64(ids))
	}
}

// Rejected counts a request refused at once because the transport's bound on requests
// in progress was reached (HTTP's semaphore, the service's MaxWaiting).
func (m *Metrics) Rejected(transport string) {
	if indexOf(transports[:], transport) < 0 {
		transport = "other"
	}
	m.rejected.WithLabelValues(transport).Inc()
}

// Registerer is where other parts of the dispenser add their own collectors (the
// HTTP face adds its in-flight gauge).
func (m *Metrics) Registerer() prometheus.Registerer { return m.reg }

// Gatherer is the registry, for tests and for pushing elsewhere.
func (m *Metrics) Gatherer() prometheus.Gatherer { return m.reg }

// Handler serves the registry in the Prometheus text format (or OpenMetrics when
// asked), two scrapes at a time. A source that fails is reported in the scrape's error
// counter and the rest still served.
func (m *Metrics) Handler() http.Handler { return m.handler }

func indexOf(list []string, s string) int {
	for i, v := range list {
		if v == s {
			return i
		}
	}
	return -1
}

func indexOfCode(code int) int {
	for i, c := range codes {
		if c == code {
			return i
		}
	}
	return -1
}

// Total is what one transport answered for one kind since start.
type Total struct {
	Transport, Kind string
	Requests        uint64 // answered, errors included
	Errors          uint64 // answered with an error code
	IDs             uint64 // IDs handed out
}

// Totals reads the request counters of the known transports and kinds, for the status
// page.
func (m *Metrics) Totals() []Total {
	var out []Total
	for t, transport := range transports {
		for k, kind := range kinds {
			f := &m.fast[t][k]
			total := Total{Transport: transport, Kind: kind, IDs: uint64(read(f.issued))}
			for c, code := range codes {
				n := uint64(read(f.codes[c]))
				total.Requests += n
				if code != 200 {
					total.Errors += n
				}
			}
			out = append(out, total)
		}
	}
	return out
}

// read is a counter's value; Write cannot fail for a counter.
func read(c prometheus.Counter) float64 {
	var d dto.Metric
	_ = c.Write(&d)
	return d.GetCounter().GetValue()
}
