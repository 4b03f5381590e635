// Package httpapi is the dispenser's HTTP face (PROTOCOL.md "HTTP"): Leaf's HTTP API as
// a drop-in (/api/segment/get/{key}, /api/snowflake/get/{key}, /decodeSnowflakeId),
// with ?count=N batches; Prometheus metrics; a server-rendered status page; and the
// /healthz and /readyz probes. Like the NATS face (package bus) it only parses and
// encodes: what a request means, how long it may wait and which error it gets are
// package core's, so a rule is never written twice.
//
// Like the NATS face it is a library the dispenser mounts: New takes the listen
// address and a Config of small interfaces (the core, the stats sources, the
// readiness), Listen binds the address by the rule PROTOCOL.md sets for --http, and Run
// serves until its context ends, then shuts down gracefully.
//
// A slow or hostile client costs at most its own connection (conns.go, answer.go): every
// phase of a request has a timeout, headers and bodies are bounded, open connections are
// capped (at the cap the longest idle one makes room, and beyond that new ones are
// refused), a body is read whole before the request counts as in progress, a request
// stops counting once its answer is being written, and answers of over 4 KB being
// written to clients share a byte budget. The bound on requests in progress (beyond it,
// 503 at once) thus counts only requests being answered, and /readyz says when the node
// turned requests or connections away.
package httpapi

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/leafbus/leafbus/core"
	"github.com/leafbus/leafbus/metrics"
)

// DefaultAddr is --http's default, Leaf's port on loopback.
const DefaultAddr = "127.0.0.1:8080"

// DefaultMaxConns is --http-max-conns' default: 4,096 connections cost about 100 MB at
// most (each a goroutine and net/http's buffers).
const DefaultMaxConns = 4096

// ErrDefaultTaken is wrapped by Listen when the default address (not set explicitly)
// is already in use: several dispensers on one host. The dispenser logs it as a
// warning and runs without HTTP.
var ErrDefaultTaken = errors.New("the default HTTP address is in use; serving without HTTP (set --http to choose another)")

// Config is what the HTTP face serves from. Zero durations and limits take the
// defaults of DefaultConfig; nil sources leave their part out (a nil generator answers
// 503, as in the NATS service).
type Config struct {
	Version string // shown on the status page: the dispenser's build line (internal/buildinfo)
	// Core is what every request means (package core's *Core): the same routing, waits
	// and error table as the NATS face.
	Core Core
	// Location is the time zone of decodeSnowflakeId's time. Leaf formats it with a
	// SimpleDateFormat that keeps the JVM's default zone, the host's local zone, so nil
	// means time.Local, which Go reads from TZ and /etc/localtime the same way.
	Location *time.Location
	Metrics  Metrics // /metrics and the request counters; nil: /metrics is 404

	Readiness core.Readiness // /readyz; nil: never ready
	// BeatMaxAge is how old the last clock record may be for /readyz (heartbeat fresh);
	// ClockBehindMax how far the clock may read behind its highest reading (the step the
	// snowflake generator waits out).
	BeatMaxAge     time.Duration
	ClockBehindMax time.Duration

	Status Status // the status page's sources

	// Face is what this listener serves (faces.go): everything (FaceAll, one listener),
	// the ID API only (FaceIDs) or the operator pages only (FaceMonitor), for
	// --monitor-listen. The HTTP gauges of /metrics are registered by the one face
	// that serves IDs.
	Face Face

	// MaxInFlight bounds requests being answered (from the end of their body to the
	// start of their answer); beyond it they are answered 503 at once (the probes
	// excepted, so that an overloaded node is not also killed as dead).
	MaxInFlight int
	// MaxConns bounds open connections (conns.go): at the cap a new connection closes
	// the one idle longest, or is refused with 503 when none is idle.
	MaxConns int
	// MaxAnswerBytes bounds the bytes of answers of over 4 KB being written to clients
	// at once (large batches, the status page, /cache, /db): a slow reader holds its
	// answer until it is read, so beyond the budget such an answer is a 503.
	MaxAnswerBytes    int
	ReadHeaderTimeout time.Duration
	// ReadTimeout bounds reading a request's body, from the end of its headers; a
	// request without a body has nothing more to read.
	ReadTimeout  time.Duration
	WriteTimeout time.Duration // must exceed the core's WaitMax: a waiting request still answers
	// IdleTimeout is how long a keep-alive connection waits for its next request.
	IdleTimeout     time.Duration
	MaxHeaderBytes  int
	ShutdownTimeout time.Duration // how long Run waits for requests in progress at the end

	Logger *slog.Logger
	Now    func() time.Time // the clock of the status page and /readyz; nil: time.Now
}

// DefaultConfig is the protocol's defaults and limits that keep slow clients cheap.
func DefaultConfig() Config {
	return Config{
		BeatMaxAge:        core.DefaultReadyBounds().BeatMaxAge,
		ClockBehindMax:    core.DefaultReadyBounds().ClockBehindMax,
		MaxInFlight:       256,
		MaxConns:          DefaultMaxConns,
		MaxAnswerBytes:    32 << 20,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       5 * time.Second,
		WriteTimeout:      15 * time.Second,
		IdleTimeout:       30 * time.Second,
		MaxHeaderBytes:    16 << 10,
		ShutdownTimeout:   5 * time.Second,
		Status:            Status{Refresh: 5 * time.Second, MaxTags: 200, MaxPeers: 100, FetchTimeout: time.Second},
	}
}

// withDefaults fills the zero durations and limits from DefaultConfig.
func (c Config) withDefaults() Config {
	d := DefaultConfig()
	for _, f := range []struct{ v, def *time.Duration }{
		{&c.BeatMaxAge, &d.BeatMaxAge}, {&c.ClockBehindMax, &d.ClockBehindMax},
		{&c.ReadHeaderTimeout, &d.ReadHeaderTimeout}, {&c.ReadTimeout, &d.ReadTimeout},
		{&c.WriteTimeout, &d.WriteTimeout}, {&c.IdleTimeout, &d.IdleTimeout},
		{&c.ShutdownTimeout, &d.ShutdownTimeout}, {&c.Status.Refresh, &d.Status.Refresh},
		{&c.Status.FetchTimeout, &d.Status.FetchTimeout},
	} {
		if *f.v == 0 {
			*f.v = *f.def
		}
	}
	for _, f := range []struct{ v, def *int }{
		{&c.MaxInFlight, &d.MaxInFlight}, {&c.MaxConns, &d.MaxConns}, {&c.MaxAnswerBytes, &d.MaxAnswerBytes},
		{&c.MaxHeaderBytes, &d.MaxHeaderBytes}, {&c.Status.MaxTags, &d.Status.MaxTags},
		{&c.Status.MaxPeers, &d.Status.MaxPeers},
	} {
		if *f.v == 0 {
			*f.v = *f.def
		}
	}
	return c
}

// Validate names the field, value and bound of the first bad setting.
func (c Config) Validate() error {
	if c.Core == nil {
		return errors.New("http: config: Core is required")
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"BeatMaxAge", c.BeatMaxAge}, {"ReadHeaderTimeout", c.ReadHeaderTimeout},
		{"ReadTimeout", c.ReadTimeout}, {"WriteTimeout", c.WriteTimeout}, {"IdleTimeout", c.IdleTimeout},
		{"ShutdownTimeout", c.ShutdownTimeout}, {"Status.Refresh", c.Status.Refresh},
		{"Status.FetchTimeout", c.Status.FetchTimeout},
	} {
		if d.v <= 0 {
			return fmt.Errorf("http %s %v: want > 0", d.name, d.v)
		}
	}
	if wait := c.Core.WaitMax(); c.WriteTimeout <= wait {
		return fmt.Errorf("http WriteTimeout %v must exceed the core's WaitMax %v, or a request that waits cannot answer", c.WriteTimeout, wait)
	}
	if c.ClockBehindMax < 0 {
		return fmt.Errorf("http ClockBehindMax %v: want >= 0", c.ClockBehindMax)
	}
	if c.MaxInFlight < 1 || c.MaxConns < 1 || c.MaxAnswerBytes < smallAnswer || c.MaxHeaderBytes < 1024 || c.Status.MaxTags < 1 || c.Status.MaxPeers < 1 {
		return fmt.Errorf("http MaxInFlight %d, MaxConns %d, MaxAnswerBytes %d, MaxHeaderBytes %d, Status.MaxTags %d, Status.MaxPeers %d: want >= 1, >= 1, >= %d, >= 1024, >= 1, >= 1",
			c.MaxInFlight, c.MaxConns, c.MaxAnswerBytes, c.MaxHeaderBytes, c.Status.MaxTags, c.Status.MaxPeers, smallAnswer)
	}
	return nil
}

// Metrics is what the HTTP face needs of package metrics (*metrics.Metrics).
type Metrics interface {
	metrics.Observer
	Rejected(transport string)
	Totals() []metrics.Total
	Handler() http.Handler
}

var _ Metrics = (*metrics.Metrics)(nil)

// Server is the HTTP face of one dispenser.
type Server struct {
	cfg      Config
	addr     string
	log      *slog.Logger
	now      func() time.Time
	started  time.Time
	srv      *http.Server
	inFlight atomic.Int64 // requests being answered (the probes excepted), at most MaxInFlight
	answers  atomic.Int64 // bytes of large answers being written, at most MaxAnswerBytes
	epoch    time.Time    // requests are timed from here on the monotonic clock (mono)
	conns    *connCap
	// refusedAt is when a request or connection was last turned away for want of room
	// (Server.mono, 0: never): /readyz says the node is saturated for a while after.
	refusedAt atomic.Int64
	writers   sync.Pool // *answerWriter
	status    *statusPage
	metricsH  http.Handler // /metrics as this face serves it (faces.go)
	// clusterCache shares the status page's discovery among page loads.
	clusterCache clusterCache
	draining     atomic.Bool // set when Run's context ends: /readyz answers 503

	mu     sync.Mutex
	ln     net.Listener // set by Listen, taken by Run
	closed bool         // Close was called: Run serves no more

	ids  sync.Pool // *[]int64
	bufs sync.Pool // *[]byte
}

// New checks cfg and returns a server for addr (host:port; port 0 picks one). Nothing is
// bound until Listen or Run.
func New(addr string, cfg Config) (*Server, error) {
	cfg = cfg.withDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s := &Server{cfg: cfg, addr: addr, log: cfg.Logger, now: cfg.Now, epoch: time.Now()}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if s.now == nil {
		s.now = time.Now
	}
	if s.cfg.Location == nil {
		s.cfg.Location = time.Local
	}
	s.started = s.now()
	s.conns = newConnCap(cfg.MaxConns, s.log, s.mono, s.turnedAway)
	page, err := newStatusPage()
	if err != nil {
		return nil, err
	}
	s.status = page
	s.metricsH = s.metricsHandler()
	if s.servesIDs() {
		if err := s.registerInFlight(); err != nil {
			return nil, err
		}
	}
	s.srv = &http.Server{
		Handler:           s.Handler(),
		ReadHeaderTimeout: cfg.ReadHeaderTimeout,
		WriteTimeout:      cfg.WriteTimeout,
		IdleTimeout:       cfg.IdleTimeout,
		MaxHeaderBytes:    cfg.MaxHeaderBytes,
		ConnState:         s.conns.connState,
		ErrorLog:          slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
	}
	return s, nil
}

// Listen binds addr for the HTTP face, by PROTOCOL.md's rule for --http. explicit says
// whether the operator set the address (flag or LEAFBUS_HTTP) rather than taking the
// default. When the address is not explicit and is already in use, the error wraps
// ErrDefaultTaken and the dispenser warns and goes on without HTTP; any other failure,
// and every failure of an explicit address, is a start-up error. An empty addr means
// HTTP is off: nil listener, nil error.
func Listen(addr string, explicit bool) (net.Listener, error) {
	if addr == "" {
		return nil, nil
	}
	ln, err := net.Listen("tcp", addr)
	switch {
	case err == nil:
		return ln, nil
	case !explicit && errors.Is(err, syscall.EADDRINUSE):
		return nil, fmt.Errorf("--http %s: %w: %w", addr, ErrDefaultTaken, err)
	default:
		return nil, fmt.Errorf("--http %s: %w", addr, err)
	}
}

// Listen binds the server's address with the package's Listen; Run then serves on it.
// Binding before Run lets the dispenser fail its start-up, or warn, before it serves.
func (s *Server) Listen(explicit bool) error {
	ln, err := Listen(s.addr, explicit)
	if err != nil {
		return err
	}
	if ln == nil {
		return fmt.Errorf("http: no address to listen on")
	}
	if err := s.UseListener(ln); err != nil {
		ln.Close()
		return err
	}
	return nil
}

// UseListener makes Run serve on ln, a listener the caller bound (with socket options of
// its own, or handed over by a supervisor), instead of binding the server's address.
func (s *Server) UseListener(ln net.Listener) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ln != nil {
		return fmt.Errorf("http: already listening on %s", s.ln.Addr())
	}
	s.ln = ln
	return nil
}

// Addr is the bound address (after Listen), e.g. for a port chosen by the system.
func (s *Server) Addr() net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ln == nil {
		return nil
	}
	return s.ln.Addr()
}

// Run serves until ctx ends (binding the address first unless Listen did, as an
// explicit address), then stops taking connections, marks the node not ready and waits
// up to ShutdownTimeout for requests in progress before closing the rest. It returns
// nil after a stop by ctx, or the error that ended serving.
func (s *Server) Run(ctx context.Context) error {
	ln, err := s.listener()
	if err != nil {
		return err
	}
	errc := make(chan error, 1)
	capped := &capListener{Listener: ln, cap: s.conns}
	go func() { errc <- s.srv.Serve(capped) }()
	select {
	case err := <-errc:
		return fmt.Errorf("http: serve on %s: %w", ln.Addr(), err)
	case <-ctx.Done():
	}
	s.draining.Store(true)
	sctx, cancel := context.WithTimeout(context.Background(), s.cfg.ShutdownTimeout)
	defer cancel()
	if err := s.srv.Shutdown(sctx); err != nil {
		s.log.Warn("http: requests still in progress at shutdown, closing them", "err", err)
		s.srv.Close()
	}
	if serr := <-errc; !errors.Is(serr, http.ErrServerClosed) {
		return fmt.Errorf("http: serve on %s: %w", ln.Addr(), serr)
	}
	return nil
}

// Close stops serving at once, without waiting for requests in progress (Run's end
// waits for them): it closes the listener Listen bound, also when Run never served on
// it (a dispenser whose start failed after binding), and makes a later Run fail. Safe
// to call more than once.
func (s *Server) Close() error {
	s.mu.Lock()
	s.closed = true
	ln := s.ln
	s.mu.Unlock()
	err := s.srv.Close()
	if ln != nil {
		if cerr := ln.Close(); cerr != nil && !errors.Is(cerr, net.ErrClosed) && err == nil {
			err = cerr
		}
	}
	return err
}

// listener is the listener Listen bound, or a new one on the address taken as explicit.
func (s *Server) listener() (net.Listener, error) {
	s.mu.Lock()
	ln, closed := s.ln, s.closed
	s.mu.Unlock()
	if closed {
		return nil, errors.New("http: server closed")
	}
	if ln != nil {
		return ln, nil
	}
	if err := s.Listen(true); err != nil {
		return nil, err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ln, nil
}

// Handler is the whole HTTP face, bound to no listener: the route table behind the
// in-flight bound. Run serves it; tests may mount it on httptest.
func (s *Server) Handler() http.Handler {
	return http.HandlerFunc(s.serveHTTP)
}

// serveHTTP routes: the probes first and unbounded, everything else within the bound.
// A request with a body is read whole first (readBody), so a slow sender costs its own
// connection and no room among the requests in progress; the answer writer gives the
// room back when the answer starts (answer.go). The http.Server has no ReadTimeout of
// its own: it would set a deadline for every request, a timer change and two clock
// reads, where the Leaf API's requests have no body.
func (s *Server) serveHTTP(w http.ResponseWriter, r *http.Request) {
	if r.ContentLength != 0 && !s.readBody(w, r) {
		return
	}
	switch r.URL.Path {
	case "/healthz":
		s.own(w, r, s.healthz)
		return
	case "/readyz":
		s.own(w, r, s.readyz)
		return
	}
	// One atomic add each way, where a semaphore channel took a lock each way.
	if s.inFlight.Add(1) > int64(s.cfg.MaxInFlight) {
		s.inFlight.Add(-1)
		s.turnedAway()
		if s.cfg.Metrics != nil {
			s.cfg.Metrics.Rejected(metrics.HTTP)
		}
		writeError(w, http.StatusServiceUnavailable, fmt.Sprintf("%d HTTP requests already in progress", s.cfg.MaxInFlight))
		return
	}
	aw := s.answerWriter(w)
	defer s.done(aw)
	switch r.URL.Path {
	case "/", "/metrics":
		if !s.servesPages() {
			s.notHere(aw, r)
		} else if r.URL.Path == "/" {
			s.own(aw, r, s.statusHandler)
		} else {
			s.own(aw, r, s.metrics)
		}
	default:
		s.leaf(aw, r)
	}
}

// maxBodyBytes bounds a request's body (Leaf's @RequestParam reads a POST form's).
const maxBodyBytes = 64 << 10

// readBody reads r's body whole, up to maxBodyBytes and within ReadTimeout, and puts it
// back in memory for the handler; false when it answered instead (400 for a body cut
// short or not sent in time, 413 for one too large), after which the connection is
// closed.
func (s *Server) readBody(w http.ResponseWriter, r *http.Request) bool {
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(time.Now().Add(s.cfg.ReadTimeout)) // httptest recorders have no connection
	body, err := io.ReadAll(io.LimitReader(r.Body, maxBodyBytes+1))
	switch {
	case err != nil:
		w.Header().Set("Connection", "close")
		writeError(w, http.StatusBadRequest, fmt.Sprintf("request body not received in full within %v: %v", s.cfg.ReadTimeout, err))
		return false
	case len(body) > maxBodyBytes:
		w.Header().Set("Connection", "close")
		writeError(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("request body over %d bytes", maxBodyBytes))
		return false
	}
	// No deadline while the request is answered: net/http's read that watches for the
	// client going away would end the request's context at it.
	_ = rc.SetReadDeadline(time.Time{})
	r.Body = io.NopCloser(bytes.NewReader(body))
	return true
}

// turnedAway marks the node saturated: a request or connection was refused for want
// of room.
func (s *Server) turnedAway() { s.refusedAt.Store(int64(max(s.mono(), 1))) }

// metrics serves the Prometheus registry.
func (s *Server) metrics(w http.ResponseWriter, r *http.Request) {
	if s.metricsH == nil {
		writeError(w, http.StatusNotFound, "metrics are not configured on this dispenser")
		return
	}
	s.metricsH.ServeHTTP(w, r)
}

// own serves one of this project's own pages: GET and HEAD only.
func (s *Server) own(w http.ResponseWriter, r *http.Request, h http.HandlerFunc) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		writeError(w, http.StatusMethodNotAllowed, fmt.Sprintf("method %s not allowed on %s: use GET or HEAD", r.Method, r.URL.Path))
		return
	}
	h(w, r)
}

// registerInFlight adds leafbus_http_requests_in_flight and the connection figures to
// the metrics registry, when the Metrics has one (*metrics.Metrics does).
func (s *Server) registerInFlight() error {
	r, ok := s.cfg.Metrics.(interface{ Registerer() prometheus.Registerer })
	if !ok {
		return nil
	}
	for _, c := range []prometheus.Collector{
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "leafbus_http_requests_in_flight",
			Help: "HTTP requests being answered (the probes excepted); at MaxInFlight, new ones are answered 503.",
		}, func() float64 { return float64(min(max(s.inFlight.Load(), 0), int64(s.cfg.MaxInFlight))) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "leafbus_http_answer_bytes",
			Help: "Bytes of HTTP answers over 4 KB being written to clients; beyond MaxAnswerBytes such an answer is a 503.",
		}, func() float64 { return float64(max(s.answers.Load(), 0)) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "leafbus_http_connections",
			Help: "HTTP connections open; at --http-max-conns a new one closes the one idle longest, or is refused.",
		}, func() float64 { return float64(s.conns.open()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "leafbus_http_connections_refused_total",
			Help: "HTTP connections refused with 503 at --http-max-conns, every open one having a request in progress.",
		}, func() float64 { return float64(s.conns.refusedTotal.Load()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "leafbus_http_connections_closed_idle_total",
			Help: "Idle HTTP connections closed at --http-max-conns to make room for new ones.",
		}, func() float64 { return float64(s.conns.closedIdle.Load()) }),
	} {
		if err := r.Registerer().Register(c); err != nil {
			return fmt.Errorf("httpapi: register the HTTP gauges: %w", err)
		}
	}
	return nil
}
