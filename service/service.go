package service

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/leafbus/leafbus/segment"
	"github.com/leafbus/leafbus/snowflake"
	"github.com/leafbus/leafbus/wire"
)

// SegmentSource hands out segment IDs (segment.Generator). TryFill never waits and does
// no I/O: ok=false means the IDs are not in memory yet and Fill (which may wait) must be
// called off the NATS delivery goroutine.
type SegmentSource interface {
	TryFill(tag string, dst []int64) (ok bool, err error)
	Fill(ctx context.Context, tag string, dst []int64) error
}

// SnowflakeSource hands out snowflake IDs (snowflake.Generator). Fill waits at most
// about a millisecond (a spent sequence) or twice a small clock step back.
type SnowflakeSource interface {
	Fill(dst []int64) error
}

// TagAdmin manages segment tags (segment.Store).
type TagAdmin interface {
	Tags(ctx context.Context) ([]segment.Tag, error)
	AddTag(ctx context.Context, t segment.Tag) (segment.Tag, error)
	UpdateTag(ctx context.Context, u segment.TagUpdate) (segment.Tag, error)
}

// Batches hands out ready-made replies (package pools): ok=false when it has none of
// that shape, and the service makes the reply itself.
type Batches interface {
	Take(kind wire.Kind, tag string, n int, enc wire.Encoding) (reply []byte, ok bool)
}

// Observer is told about every answer of the ID and decode endpoints, so that NATS and
// HTTP requests are counted alike (*metrics.Metrics is one). It is declared here, not
// taken from package metrics, so that the service does not depend on Prometheus.
// Observe runs on the request path: it must not block, and should not allocate.
type Observer interface {
	// Observe records one answer: transport is TransportNATS; kind "segment",
	// "snowflake" or KindDecode; code 200 or the error's wire code; seconds from the
	// request's arrival to its answer; ids how many IDs it carried (0 for an error).
	Observe(transport, kind string, code int, seconds float64, ids int)
}

// rejecter is the optional part of an Observer that counts requests refused at once
// because MaxWaiting requests were already waiting (*metrics.Metrics has it).
type rejecter interface {
	Rejected(transport string)
}

// The transport and the kind of decode requests as the service reports them to its
// Observer: the label values of package metrics (metrics.NATS, metrics.KindDecode).
const (
	TransportNATS = "nats"
	KindDecode    = "decode"
)

// Config describes the micro service a dispenser runs. Sources left nil answer 503.
type Config struct {
	Prefix   string // subject prefix, service name and queue group ("leaf")
	Version  string // semantic version shown by $SRV.INFO
	MaxBatch int    // largest count a request may ask for (10000)

	Segments   SegmentSource
	Snowflakes SnowflakeSource
	Layout     snowflake.Layout // decodes snowflake IDs
	Tags       TagAdmin
	Batches    Batches
	// Monotonic serves the tags marked monotonic (never from Batches or Segments) and
	// keeps the marks; nil: no tag is monotonic, and setting the mark is refused.
	Monotonic Monotonic

	// WaitMax bounds how long a request waits for a segment that is being loaded or a
	// tag being looked up; MaxWaiting bounds how many requests may wait at once (beyond
	// it they are answered 503 at once, so a stalled store cannot pile up goroutines).
	WaitMax    time.Duration
	MaxWaiting int
	// AdminTimeout bounds one admin call (a store round trip).
	AdminTimeout time.Duration

	// Stats adds data to an endpoint's $SRV.STATS entry ("segment", "snowflake", ...).
	Stats  func(endpoint string) any
	Logger *slog.Logger

	// Observer, when set, is told about every answer of the ID and decode endpoints.
	Observer Observer
	// Metadata is added to the service's $SRV.INFO metadata (the dispenser's node_id and
	// worker_id, which discovery reads); max_batch is always there and set by MaxBatch.
	Metadata map[string]string
}

// DefaultConfig is the configuration of the protocol's defaults.
func DefaultConfig() Config {
	return Config{
		Prefix:       wire.DefaultPrefix,
		Version:      "1.0.0",
		MaxBatch:     wire.DefaultMaxBatch,
		Layout:       snowflake.DefaultLayout(),
		WaitMax:      2 * time.Second,
		MaxWaiting:   4096,
		AdminTimeout: 10 * time.Second,
	}
}

// Validate names the field, value and bound of the first bad setting.
func (c Config) Validate() error {
	if err := wire.CheckPrefix(c.Prefix); err != nil {
		return err
	}
	if c.MaxBatch < 1 || c.MaxBatch > wire.MaxBatchLimit {
		return fmt.Errorf("--max-batch %d: want 1 to %d", c.MaxBatch, wire.MaxBatchLimit)
	}
	if err := c.Layout.Validate(); err != nil {
		return err
	}
	if c.WaitMax <= 0 {
		return fmt.Errorf("wait max %v: want > 0", c.WaitMax)
	}
	if c.MaxWaiting < 1 {
		return fmt.Errorf("max waiting %d: want >= 1", c.MaxWaiting)
	}
	if c.AdminTimeout <= 0 {
		return fmt.Errorf("admin timeout %v: want > 0", c.AdminTimeout)
	}
	return nil
}

// Service is the dispenser's NATS face: a micro service named after the prefix, in the
// queue group of the same name, with endpoints for segment and snowflake IDs, decoding
// and tag admin. It owns its connection, so that stopping it can drain every request
// already delivered without cutting the connection the heartbeats use.
type Service struct {
	cfg    Config
	nc     *nats.Conn
	svc    micro.Service
	logger *slog.Logger

	subjects         wire.Subjects
	segmentSubject   string // "leaf.segment." : the tag follows
	snowflakeSubject string
	guard            *replyGuard
	refused          map[string]*atomic.Uint64 // per endpoint: requests whose reply subject was refused

	waiting  chan struct{} // a slot per request waiting off the delivery goroutine
	waitMu   sync.Mutex    // orders startWaiter's wg.Add before Stop's wg.Wait
	stopping bool          // under waitMu: no new waiter may start
	wg       sync.WaitGroup
	ids      sync.Pool // *[]int64
	bufs     sync.Pool // *[]byte

	segStats, sfStats endpointCounters
	observer          Observer  // nil: nothing observed
	rejecter          rejecter  // nil: the Observer does not count refusals
	epoch             time.Time // requests are timed from here on the monotonic clock alone
	stopOnce          sync.Once
	stopErr           error
}

// endpointCounters are the service's own figures per ID endpoint; micro counts
// requests and errors answered inline, these add what it cannot see.
type endpointCounters struct {
	waited      atomic.Uint64 // requests answered off the delivery goroutine
	waitErrors  atomic.Uint64 // of those, answered with an error
	overloaded  atomic.Uint64 // refused because MaxWaiting requests were already waiting
	pooled      atomic.Uint64 // answered with a ready-made batch
	idsIssued   atomic.Uint64
	lastErrText atomic.Value // string
}

// NewService registers the service on nc, which it then owns (Stop drains and closes
// it). Requests are served from the moment it returns.
func New(nc *nats.Conn, cfg Config) (*Service, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if need := int64(cfg.MaxBatch) * wire.MaxTextID; need > nc.MaxPayload() {
		return nil, fmt.Errorf("--max-batch %d: a text reply may need %d bytes, but the NATS server's max_payload is %d", cfg.MaxBatch, need, nc.MaxPayload())
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	s := &Service{
		cfg:              cfg,
		nc:               nc,
		logger:           logger,
		subjects:         wire.Subjects{Prefix: cfg.Prefix},
		segmentSubject:   wire.Subjects{Prefix: cfg.Prefix}.IDsPrefix(wire.Segment),
		snowflakeSubject: wire.Subjects{Prefix: cfg.Prefix}.IDsPrefix(wire.Snowflake),
		refused:          map[string]*atomic.Uint64{},
		waiting:          make(chan struct{}, cfg.MaxWaiting),
		observer:         cfg.Observer,
		epoch:            time.Now(),
	}
	s.rejecter, _ = cfg.Observer.(rejecter)
	s.guard = newReplyGuard(s.subjects, logger)
	endpoints := s.endpoints()
	for _, e := range endpoints {
		s.refused[e.name] = new(atomic.Uint64) // before the stats handler can read the map
	}
	svc, err := micro.AddService(nc, micro.Config{
		Name:        cfg.Prefix,
		Version:     cfg.Version,
		Description: "Leaf ID dispenser: segment and snowflake IDs over NATS",
		QueueGroup:  cfg.Prefix,
		Metadata:    cfg.metadata(),
		StatsHandler: func(e *micro.Endpoint) any {
			return s.endpointStats(e.Name)
		},
		ErrorHandler: func(_ micro.Service, err *micro.NATSError) {
			logger.Error("service subscription error", "subject", err.Subject, "err", err.Description)
		},
	})
	if err != nil {
		return nil, fmt.Errorf("add micro service %q: %w", cfg.Prefix, err)
	}
	s.svc = svc
	for _, e := range endpoints {
		h := s.guard.wrap(e.name, s.refused[e.name], e.handler)
		if err := svc.AddEndpoint(e.name, h, micro.WithEndpointSubject(e.subject)); err != nil {
			svc.Stop()
			return nil, fmt.Errorf("add endpoint %s on %q: %w", e.name, e.subject, err)
		}
	}
	// Subscriptions reach the server asynchronously; a round trip makes sure it has them
	// all, so that a dispenser that says it serves does not answer "no responders".
	if err := nc.FlushTimeout(10 * time.Second); err != nil {
		svc.Stop()
		return nil, fmt.Errorf("register service %q with the NATS server: %w", cfg.Prefix, err)
	}
	return s, nil
}

// metadata is the $SRV.INFO metadata: Metadata's entries and max_batch.
func (c Config) metadata() map[string]string {
	m := make(map[string]string, len(c.Metadata)+1)
	for k, v := range c.Metadata {
		m[k] = v
	}
	m["max_batch"] = strconv.Itoa(c.MaxBatch)
	return m
}

// endpoint is one subject of the service and its handler.
type endpoint struct {
	name, subject string
	handler       micro.HandlerFunc
}

func (s *Service) endpoints() []endpoint {
	sub := s.subjects
	return []endpoint{
		{"segment", sub.IDsWildcard(wire.Segment), s.handleIDs(wire.Segment)},
		{"snowflake", sub.IDsWildcard(wire.Snowflake), s.handleIDs(wire.Snowflake)},
		{"decode", sub.Decode(), s.handleDecode},
		{"tags-add", sub.AdminTags("add"), s.admin(s.addTag)},
		{"tags-list", sub.AdminTags("list"), s.admin(s.listTags)},
		{"tags-update", sub.AdminTags("update"), s.admin(s.updateTag)},
	}
}

// errOverloaded is the refusal when MaxWaiting requests are already waiting.
var errOverloaded = fmt.Errorf("%w: too many requests are already waiting for segments or admin calls", wire.ErrUnavailable)

// startWaiter reserves a slot for a request answered off the delivery goroutine (a
// segment not in memory yet, an admin call) and registers it with Stop. It refuses with
// a 503 when MaxWaiting requests already wait or the service is stopping. Every
// successful call is paired with one endWaiter.
func (s *Service) startWaiter() error {
	s.waitMu.Lock()
	defer s.waitMu.Unlock()
	if s.stopping {
		return fmt.Errorf("%w: the dispenser is stopping", wire.ErrUnavailable)
	}
	select {
	case s.waiting <- struct{}{}:
	default:
		return errOverloaded
	}
	s.wg.Add(1)
	return nil
}

func (s *Service) endWaiter() {
	<-s.waiting
	s.wg.Done()
}

// Info is the service's $SRV.INFO answer.
func (s *Service) Info() micro.Info { return s.svc.Info() }

// Stop stops taking requests, answers every request already delivered (including
// those waiting for a segment, at most WaitMax), then closes the connection. The
// result of the first call is returned by every call.
func (s *Service) Stop() error {
	s.stopOnce.Do(func() { s.stopErr = s.stop() })
	return s.stopErr
}

func (s *Service) stop() error {
	var errs []error
	if err := s.svc.Stop(); err != nil {
		errs = append(errs, fmt.Errorf("stop service: %w", err))
	}
	// micro drains the subscriptions asynchronously: wait until every one is gone,
	// meaning every message delivered before the stop went through its handler.
	deadline := time.Now().Add(s.cfg.WaitMax + 5*time.Second)
	for s.nc.NumSubscriptions() > 0 && !s.nc.IsClosed() && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	// From here no handler starts a waiter (startWaiter refuses under the same lock), so
	// Wait cannot race an Add; the waiters end within WaitMax and publish before the
	// connection is closed below.
	s.waitMu.Lock()
	s.stopping = true
	s.waitMu.Unlock()
	s.wg.Wait()
	if err := s.nc.Flush(); err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
		errs = append(errs, fmt.Errorf("flush replies: %w", err))
	}
	s.nc.Close()
	return errors.Join(errs...)
}

// handleIDs serves leaf.segment.<tag> and leaf.snowflake.<tag>. Everything here runs
// on the endpoint's delivery goroutine, serially, so nothing here may wait on I/O: a
// segment that is not in memory is waited for on a goroutine of its own.
func (s *Service) handleIDs(kind wire.Kind) micro.HandlerFunc {
	subjectPrefix, counters := s.segmentSubject, &s.segStats
	if kind == wire.Snowflake {
		subjectPrefix, counters = s.snowflakeSubject, &s.sfStats
	}
	return func(req micro.Request) {
		start := s.clock()
		n, err := s.serveIDs(req, kind, subjectPrefix, counters, start)
		switch {
		case err != nil:
			s.observe(kind.String(), s.fail(req, counters, err), start, 0)
		case n > 0:
			s.observe(kind.String(), codeOK, start, n)
		}
	}
}

// codeOK is the code an Observer is told for a success, as HTTP has it.
const codeOK = 200

// serveIDs parses one ID request and answers it with IDs, returning how many; or returns
// the error to answer instead; or hands the request to waitForSegment (or, refused by a
// generator that may issue again soon, waitForSnowflake), which answers and observes it
// later, and returns 0 and no error.
func (s *Service) serveIDs(req micro.Request, kind wire.Kind, subjectPrefix string, counters *endpointCounters, start time.Duration) (int, error) {
	subject := req.Subject()
	tag := subject[min(len(subjectPrefix), len(subject)):]
	if err := wire.CheckTag(tag); err != nil {
		return 0, err
	}
	n, err := wire.ParseCount(req.Data(), s.cfg.MaxBatch)
	if err != nil {
		return 0, err
	}
	enc, err := wire.ParseEncoding(req.Headers().Get(wire.EncodingHeader))
	if err != nil {
		return 0, err
	}
	if kind == wire.Segment && s.cfg.Monotonic != nil { // service/monotonic.go
		if mine, answered, err := s.serveMonotonic(req, tag, n, enc, start); mine {
			return answered, err
		}
	}
	if s.cfg.Batches != nil {
		if reply, ok := s.cfg.Batches.Take(kind, tag, n, enc); ok {
			counters.pooled.Add(1)
			counters.idsIssued.Add(uint64(n))
			s.respond(req, reply)
			return n, nil
		}
	}
	p := s.getIDs(n)
	ids := *p
	switch kind {
	case wire.Snowflake:
		if s.cfg.Snowflakes == nil {
			err = fmt.Errorf("%w: snowflake IDs are not configured on this dispenser", wire.ErrUnavailable)
		} else if err = s.cfg.Snowflakes.Fill(ids); mayResume(err) {
			s.waitForSnowflake(req, p, enc, start, err) // snowflake_wait.go
			return 0, nil
		}
	default:
		if s.cfg.Segments == nil {
			err = fmt.Errorf("%w: segment IDs are not configured on this dispenser", wire.ErrUnavailable)
			break
		}
		var ok bool
		if ok, err = s.cfg.Segments.TryFill(tag, ids); err == nil && !ok {
			s.waitForSegment(req, tag, p, enc, start)
			return 0, nil
		}
	}
	if err != nil {
		s.putIDs(p)
		return 0, err
	}
	counters.idsIssued.Add(uint64(n))
	s.respondIDs(req, p, enc)
	return n, nil
}

// clock is the time since the service started, when there is an Observer to time
// requests for: one read of the monotonic clock, where time.Now reads the wall clock too.
func (s *Service) clock() time.Duration {
	if s.observer == nil {
		return 0
	}
	return time.Since(s.epoch)
}

// observe tells the Observer about one answer of kind, received at start (clock).
func (s *Service) observe(kind string, code int, start time.Duration, ids int) {
	if s.observer != nil {
		s.observer.Observe(TransportNATS, kind, code, (s.clock() - start).Seconds(), ids)
	}
}

// waitForSegment answers a segment request whose IDs are not in memory (a tag seen for
// the first time, or both buffers spent while the next segment loads) off the delivery
// goroutine, so other tags keep being served meanwhile. It answers through the reply
// subject, not req: micro reads req's state once the handler returns.
func (s *Service) waitForSegment(req micro.Request, tag string, p *[]int64, enc wire.Encoding, start time.Duration) {
	kind, ids := wire.Segment.String(), *p
	if err := s.startWaiter(); err != nil {
		s.putIDs(p)
		if errors.Is(err, errOverloaded) {
			s.segStats.overloaded.Add(1)
			if s.rejecter != nil {
				s.rejecter.Rejected(TransportNATS)
			}
		}
		s.observe(kind, s.fail(req, &s.segStats, err), start, 0)
		return
	}
	s.segStats.waited.Add(1)
	reply, subject := req.Reply(), req.Subject()
	go func() {
		defer s.endWaiter()
		ctx, cancel := context.WithTimeout(context.Background(), s.cfg.WaitMax)
		defer cancel()
		if err := s.cfg.Segments.Fill(ctx, tag, ids); err != nil {
			if ctx.Err() != nil && !errors.Is(err, segment.ErrUnavailable) && !errors.Is(err, segment.ErrTagNotFound) {
				err = fmt.Errorf("%w: no segment for %q within %v: %w", wire.ErrUnavailable, tag, s.cfg.WaitMax, err)
			}
			s.putIDs(p)
			s.segStats.waitErrors.Add(1)
			code, desc := s.describe(subject, &s.segStats, err)
			s.publish(subject, &nats.Msg{Subject: reply, Header: nats.Header{
				wire.ServiceErrorCodeHeader: []string{strconv.Itoa(code)},
				wire.ServiceErrorHeader:     []string{desc},
			}})
			s.observe(kind, code, start, 0)
			return
		}
		n := len(ids)
		s.segStats.idsIssued.Add(uint64(n))
		bp := s.getBuf(n * wire.MaxTextID)
		b := wire.AppendIDs((*bp)[:0], ids, enc)
		s.putIDs(p)
		s.publish(subject, &nats.Msg{Subject: reply, Data: b})
		*bp = b
		s.bufs.Put(bp)
		s.observe(kind, codeOK, start, n)
	}()
}

func (s *Service) publish(subject string, m *nats.Msg) {
	if err := s.nc.PublishMsg(m); err != nil {
		s.logger.Warn("reply not sent", "subject", subject, "err", err)
	}
}

func (s *Service) respondIDs(req micro.Request, p *[]int64, enc wire.Encoding) {
	ids := *p
	bp := s.getBuf(len(ids) * wire.MaxTextID)
	b := wire.AppendIDs((*bp)[:0], ids, enc)
	s.putIDs(p)
	s.respond(req, b) // the connection copies the reply into its write buffer
	*bp = b
	s.bufs.Put(bp)
}

func (s *Service) respond(req micro.Request, b []byte) {
	if err := req.Respond(b); err != nil {
		s.logger.Warn("reply not sent", "subject", req.Subject(), "err", err)
	}
}

// fail answers an error with its wire code, which it returns; a 500 is logged in full
// since the wire only says "internal error".
func (s *Service) fail(req micro.Request, counters *endpointCounters, err error) int {
	code, desc := s.describe(req.Subject(), counters, err)
	if rerr := req.Error(strconv.Itoa(code), desc, nil); rerr != nil {
		s.logger.Warn("error reply not sent", "subject", req.Subject(), "code", code, "err", rerr)
	}
	return code
}

// describe turns err into its wire code and description, logging a 500 in full and
// remembering the last refusal for the stats.
func (s *Service) describe(subject string, counters *endpointCounters, err error) (int, string) {
	code, desc := CodeOf(err)
	if code == 500 {
		s.logger.Error("request failed", "subject", subject, "err", err)
	}
	if counters != nil && code >= 500 {
		counters.lastErrText.Store(desc)
	}
	return code, desc
}

// getIDs returns a slice of n IDs from the pool. Give the same pointer back with
// putIDs: a new pointer to the slice would be an allocation per request.
func (s *Service) getIDs(n int) *[]int64 {
	if p, ok := s.ids.Get().(*[]int64); ok && cap(*p) >= n {
		*p = (*p)[:n]
		return p
	}
	ids := make([]int64, n, max(n, 16))
	return &ids
}

func (s *Service) putIDs(p *[]int64) {
	s.ids.Put(p)
}

func (s *Service) getBuf(n int) *[]byte {
	if p, ok := s.bufs.Get().(*[]byte); ok && cap(*p) >= n {
		return p
	}
	b := make([]byte, 0, max(n, 64))
	return &b
}

func (s *Service) handleDecode(req micro.Request) {
	start := s.clock()
	b, err := s.decode(req.Data())
	if err != nil {
		s.observe(KindDecode, s.fail(req, nil, err), start, 0)
		return
	}
	s.respond(req, b)
	s.observe(KindDecode, codeOK, start, 0)
}

// decode is the JSON answer of a decode request's body.
func (s *Service) decode(body []byte) ([]byte, error) {
	id, err := wire.ParseID(body)
	if err != nil {
		return nil, err
	}
	d, err := s.cfg.Layout.Decode(id)
	if err != nil {
		return nil, err
	}
	return json.Marshal(wire.DecodedID{
		ID:        strconv.FormatInt(d.ID, 10),
		Timestamp: d.Timestamp,
		Time:      d.Time().UTC().Format("2006-01-02T15:04:05.000Z07:00"),
		WorkerID:  d.WorkerID,
		Sequence:  d.Sequence,
	})
}

func (s *Service) endpointStats(name string) any {
	data := map[string]any{}
	if r := s.refused[name]; r != nil && r.Load() > 0 {
		data["refused_replies"] = r.Load()
	}
	var c *endpointCounters
	switch name {
	case "segment":
		c = &s.segStats
	case "snowflake":
		c = &s.sfStats
	}
	if c != nil {
		data["ids_issued"] = c.idsIssued.Load()
		data["pooled_replies"] = c.pooled.Load()
		data["waited"] = c.waited.Load()
		data["wait_errors"] = c.waitErrors.Load()
		data["overloaded"] = c.overloaded.Load()
		if v, _ := c.lastErrText.Load().(string); v != "" {
			data["last_unavailable"] = v
		}
	}
	if s.cfg.Stats != nil {
		if extra := s.cfg.Stats(name); extra != nil {
			data["source"] = extra
		}
	}
	if len(data) == 0 {
		return nil
	}
	return data
}
