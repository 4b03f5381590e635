package service

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

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

// Config describes the service a dispenser runs: plain queue subscriptions that speak
// the protocol `nats micro` reads ($SRV). Sources left nil answer 503.
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
	// Metadata is added to the service's $SRV metadata (the dispenser's node_id and
	// worker-ID range, which discovery reads); max_batch is always there and set by
	// MaxBatch.
	Metadata map[string]string
	// LiveMetadata, when set, is asked on every $SRV PING, INFO and STATS for the entries that
	// change while the service runs (the worker ID, replaced after a lost lease); they
	// override Metadata's. $SRV requests are rare, so it may allocate.
	LiveMetadata func() map[string]string
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

// Service is the dispenser's NATS face: a service named after the prefix, in the queue
// group of the same name, with endpoints for segment and snowflake IDs, decoding and tag
// admin, which the NATS service API ($SRV PING, INFO and STATS; `nats micro`) lists and
// counts as it does any nats.go/micro service. It owns its connection, so that stopping
// it can drain every request already delivered without cutting the connection the
// heartbeats use.
//
// Each endpoint is a plain queue subscription rather than a micro endpoint, and answers
// with a plain publish: on the ID subjects micro's request wrapper, reply message,
// clocks and lock per request cost about as much CPU as the dispenser's own work
// (BENCHMARKS.md, issue 14), and an ID reply here allocates nothing.
type Service struct {
	cfg      Config
	nc       *nats.Conn
	logger   *slog.Logger
	id       string            // this instance's ID in $SRV
	metadata map[string]string // $SRV metadata (Config.metadata); never written after New
	started  time.Time         // as $SRV.STATS shows it

	subjects         wire.Subjects
	segmentSubject   string // "leaf.segment." : the tag follows
	snowflakeSubject string
	guard            *replyGuard
	endpoints        []*endpoint
	verbSubs         []*nats.Subscription

	waiting  chan struct{} // a slot per request waiting off the delivery goroutine
	waitMu   sync.Mutex    // orders startWaiter's wg.Add before Stop's wg.Wait
	stopping bool          // under waitMu: no new waiter may start
	wg       sync.WaitGroup
	ids      sync.Pool // *[]int64, for requests answered off the delivery goroutine
	bufs     sync.Pool // *[]byte, likewise

	segStats, sfStats endpointCounters
	observer          Observer  // nil: nothing observed
	rejecter          rejecter  // nil: the Observer does not count refusals
	epoch             time.Time // requests are timed from here on the monotonic clock alone
	stopOnce          sync.Once
	stopErr           error
	verbsRefused      atomic.Uint64 // $SRV requests dropped by the reply guard
}

// endpointCounters are the service's own figures per ID endpoint, shown as the data of
// its $SRV.STATS entry beside the request and error counts.
type endpointCounters struct {
	waited      atomic.Uint64 // requests answered off the delivery goroutine
	waitErrors  atomic.Uint64 // of those, answered with an error
	overloaded  atomic.Uint64 // refused because MaxWaiting requests were already waiting
	pooled      atomic.Uint64 // answered with a ready-made batch
	idsIssued   atomic.Uint64
	lastErrText atomic.Value // string
}

// description is the service's $SRV.INFO description.
const description = "Leaf ID dispenser: segment and snowflake IDs over NATS"

// New registers the service on nc, which it then owns (Stop drains and closes it).
// Requests are served from the moment it returns.
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
	subjects := wire.Subjects{Prefix: cfg.Prefix}
	s := &Service{
		cfg:              cfg,
		nc:               nc,
		logger:           logger,
		id:               strings.TrimPrefix(nats.NewInbox(), nats.InboxPrefix), // a NUID, as micro's
		metadata:         cfg.metadata(),
		subjects:         subjects,
		segmentSubject:   subjects.IDsPrefix(wire.Segment),
		snowflakeSubject: subjects.IDsPrefix(wire.Snowflake),
		waiting:          make(chan struct{}, cfg.MaxWaiting),
		observer:         cfg.Observer,
		epoch:            time.Now(),
	}
	s.rejecter, _ = cfg.Observer.(rejecter)
	s.guard = newReplyGuard(subjects, logger)
	s.endpoints = s.newEndpoints()
	s.watchAsyncErrors()
	if err := s.subscribe(); err != nil {
		s.unsubscribe()
		return nil, err
	}
	// Subscriptions reach the server asynchronously; a round trip makes sure it has them
	// all, so that a dispenser that says it serves does not answer "no responders".
	if err := nc.FlushTimeout(10 * time.Second); err != nil {
		s.unsubscribe()
		return nil, fmt.Errorf("register service %q with the NATS server: %w", cfg.Prefix, err)
	}
	s.started = time.Now().UTC()
	return s, nil
}

// metadata is the $SRV.INFO metadata: Metadata's entries and max_batch.
func (c Config) metadata() map[string]string {
	m := make(map[string]string, len(c.Metadata)+1)
	for k, v := range c.Metadata {
		m[k] = v
	}
	m[wire.MetaMaxBatch] = strconv.Itoa(c.MaxBatch)
	return m
}

func (s *Service) newEndpoints() []*endpoint {
	sub := s.subjects
	return []*endpoint{
		{name: "segment", subject: sub.IDsWildcard(wire.Segment), handle: s.handleIDs(wire.Segment), counters: &s.segStats},
		{name: "snowflake", subject: sub.IDsWildcard(wire.Snowflake), handle: s.handleIDs(wire.Snowflake), counters: &s.sfStats},
		{name: "decode", subject: sub.Decode(), handle: s.handleDecode},
		{name: "tags-add", subject: sub.AdminTags("add"), handle: s.admin(s.addTag)},
		{name: "tags-list", subject: sub.AdminTags("list"), handle: s.admin(s.listTags)},
		{name: "tags-update", subject: sub.AdminTags("update"), handle: s.admin(s.updateTag)},
	}
}

// subscribe subscribes every endpoint, in the queue group, and the $SRV verbs.
func (s *Service) subscribe() error {
	for _, e := range s.endpoints {
		sub, err := s.nc.QueueSubscribe(e.subject, s.subjects.QueueGroup(), s.deliver(e))
		if err != nil {
			return fmt.Errorf("add endpoint %s on %q: %w", e.name, e.subject, err)
		}
		e.sub = sub
	}
	return s.subscribeVerbs()
}

// endpoint returns the endpoint named name, nil if there is none.
func (s *Service) endpoint(name string) *endpoint {
	for _, e := range s.endpoints {
		if e.name == name {
			return e
		}
	}
	return nil
}

// unsubscribe undoes a subscribe that failed half way.
func (s *Service) unsubscribe() {
	for _, e := range s.endpoints {
		if e.sub != nil {
			_ = e.sub.Unsubscribe() // the connection's error is the one New reports
		}
	}
	for _, sub := range s.verbSubs {
		_ = sub.Unsubscribe()
	}
}

// watchAsyncErrors counts an asynchronous error on an endpoint's subscription (a slow
// consumer: NATS dropped requests; a refused subscription) as an error of that endpoint
// and logs it, as micro does, then hands it on to the connection's own handler. The
// endpoint is found by subject and queue, not by its *Subscription, which subscribe
// writes on another goroutine.
func (s *Service) watchAsyncErrors() {
	prev := s.nc.ErrorHandler()
	s.nc.SetErrorHandler(func(nc *nats.Conn, sub *nats.Subscription, err error) {
		if sub != nil {
			for _, e := range s.endpoints {
				if sub.Subject == e.subject && sub.Queue == s.subjects.QueueGroup() {
					e.failed(err.Error())
				}
			}
			s.logger.Error("service subscription error", "subject", sub.Subject, "err", err)
		}
		if prev != nil {
			prev(nc, sub, err)
		}
	})
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

// Stop stops taking requests, answers every request already delivered (including
// those waiting for a segment, at most WaitMax), then closes the connection. The
// result of the first call is returned by every call.
func (s *Service) Stop() error {
	s.stopOnce.Do(func() { s.stopErr = s.stop() })
	return s.stopErr
}

func (s *Service) stop() error {
	var errs []error
	subs := slices.Clone(s.verbSubs)
	for _, e := range s.endpoints {
		subs = append(subs, e.sub)
	}
	for _, sub := range subs {
		if err := sub.Drain(); err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
			errs = append(errs, fmt.Errorf("stop service: drain %s: %w", sub.Subject, err))
		}
	}
	// Draining is asynchronous: wait until every subscription is gone, meaning every
	// message delivered before the stop went through its handler.
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
// segment that is not in memory is waited for on a goroutine of its own. A request that
// is answered here allocates nothing: the tag is a slice of the subject, the IDs and
// the reply are the endpoint's scratch space, and the reply is a plain publish.
func (s *Service) handleIDs(kind wire.Kind) handler {
	subjectPrefix := s.segmentSubject
	if kind == wire.Snowflake {
		subjectPrefix = s.snowflakeSubject
	}
	return func(e *endpoint, m *nats.Msg, start time.Duration) outcome {
		n, err := s.serveIDs(e, m, kind, subjectPrefix, e.counters, start)
		switch {
		case err != nil:
			return outcome{kind.String(), s.fail(e, m, e.counters, err), 0}
		case n > 0:
			return outcome{kind.String(), codeOK, n}
		}
		return outcome{}
	}
}

// codeOK is the code an Observer is told for a success, as HTTP has it.
const codeOK = 200

// serveIDs parses one ID request and answers it with IDs, returning how many; or returns
// the error to answer instead; or hands the request to waitForSegment (or, refused by a
// generator that may issue again soon, waitForSnowflake), which answers and observes it
// later, and returns 0 and no error (or the refusal to answer when it cannot wait).
func (s *Service) serveIDs(e *endpoint, m *nats.Msg, kind wire.Kind, subjectPrefix string, counters *endpointCounters, start time.Duration) (int, error) {
	tag := m.Subject[min(len(subjectPrefix), len(m.Subject)):]
	n, enc, err := s.parseIDsRequest(tag, m)
	if err != nil {
		return 0, err
	}
	if kind == wire.Segment && s.cfg.Monotonic != nil { // service/monotonic.go
		if mine, answered, err := s.serveMonotonic(e, m, tag, n, enc, start); mine {
			return answered, err
		}
	}
	if s.cfg.Batches != nil {
		if reply, ok := s.cfg.Batches.Take(kind, tag, n, enc); ok {
			counters.pooled.Add(1)
			counters.idsIssued.Add(uint64(n))
			s.reply(e, m.Subject, m.Reply, reply)
			return n, nil
		}
	}
	ids := e.scratchIDs(n)
	switch kind {
	case wire.Snowflake:
		if s.cfg.Snowflakes == nil {
			err = fmt.Errorf("%w: snowflake IDs are not configured on this dispenser", wire.ErrUnavailable)
		} else if err = s.cfg.Snowflakes.Fill(ids); mayResume(err) {
			return 0, s.waitForSnowflake(e, m, n, enc, start, err) // snowflake_wait.go
		}
	default:
		if s.cfg.Segments == nil {
			err = fmt.Errorf("%w: segment IDs are not configured on this dispenser", wire.ErrUnavailable)
			break
		}
		var ok bool
		if ok, err = s.cfg.Segments.TryFill(tag, ids); err == nil && !ok {
			return 0, s.waitForSegment(e, m, tag, n, enc, start)
		}
	}
	if err != nil {
		return 0, err
	}
	counters.idsIssued.Add(uint64(n))
	s.reply(e, m.Subject, m.Reply, e.encode(ids, enc))
	return n, nil
}

// parseIDsRequest checks the tag and reads the count and the encoding of an ID request.
func (s *Service) parseIDsRequest(tag string, m *nats.Msg) (int, wire.Encoding, error) {
	if err := wire.CheckTag(tag); err != nil {
		return 0, 0, err
	}
	n, err := wire.ParseCount(m.Data, s.cfg.MaxBatch)
	if err != nil {
		return 0, 0, err
	}
	enc, err := wire.ParseEncoding(m.Header.Get(wire.EncodingHeader))
	return n, enc, err
}

// now is the time since the service started on the monotonic clock alone (time.Now
// reads the wall clock too): requests are timed with it.
func (s *Service) now() time.Duration {
	return time.Since(s.epoch)
}

// observe tells the Observer about one answer of kind, received at start (now).
func (s *Service) observe(kind string, code int, start time.Duration, ids int) {
	if s.observer != nil {
		s.observer.Observe(TransportNATS, kind, code, (s.now() - start).Seconds(), ids)
	}
}

// refuseWaiter answers a request that could not start waiting (startWaiter's err) with
// answer, counting an overload refusal; the caller's handler returns it as an error.
func (s *Service) refuseWaiter(counters *endpointCounters, err, answer error) error {
	if errors.Is(err, errOverloaded) {
		counters.overloaded.Add(1)
		if s.rejecter != nil {
			s.rejecter.Rejected(TransportNATS)
		}
	}
	return answer
}

// waitForSegment answers a segment request whose IDs are not in memory (a tag seen for
// the first time, or both buffers spent while the next segment loads) off the delivery
// goroutine, so other tags keep being served meanwhile. The endpoint's scratch space is
// the delivery goroutine's, so the wait takes IDs and a reply buffer from the pools.
func (s *Service) waitForSegment(e *endpoint, m *nats.Msg, tag string, n int, enc wire.Encoding, start time.Duration) error {
	if err := s.startSegmentWaiter(); err != nil { // monotonic.go
		return err
	}
	s.segStats.waited.Add(1)
	reply, subject := m.Reply, m.Subject
	go func() {
		defer s.endWaiter()
		ctx, cancel := context.WithTimeout(context.Background(), s.cfg.WaitMax)
		defer cancel()
		p := s.getIDs(n)
		err := s.cfg.Segments.Fill(ctx, tag, *p)
		if err != nil && ctx.Err() != nil && !errors.Is(err, segment.ErrUnavailable) && !errors.Is(err, segment.ErrTagNotFound) {
			err = fmt.Errorf("%w: no segment for %q within %v: %w", wire.ErrUnavailable, tag, s.cfg.WaitMax, err)
		}
		s.answerWaited(e, subject, reply, wire.Segment, &s.segStats, p, enc, start, err)
	}()
	return nil
}

// answerWaited answers a request that waited off the delivery goroutine: with the IDs
// in p, or with err; p goes back to the pool either way.
func (s *Service) answerWaited(e *endpoint, subject, reply string, kind wire.Kind, counters *endpointCounters, p *[]int64, enc wire.Encoding, start time.Duration, err error) {
	ids := *p
	if err != nil {
		s.putIDs(p)
		counters.waitErrors.Add(1)
		code, desc := s.describe(subject, counters, err)
		s.replyError(e, subject, reply, code, desc)
		s.observe(kind.String(), code, start, 0)
		return
	}
	n := len(ids)
	counters.idsIssued.Add(uint64(n))
	bp := s.getBuf(n * wire.MaxTextID)
	b := wire.AppendIDs((*bp)[:0], ids, enc)
	s.putIDs(p)
	s.reply(e, subject, reply, b)
	*bp = b
	s.bufs.Put(bp)
	s.observe(kind.String(), codeOK, start, n)
}

// fail answers an error with its wire code, which it returns; a 500 is logged in full
// since the wire only says "internal error".
func (s *Service) fail(e *endpoint, m *nats.Msg, counters *endpointCounters, err error) int {
	code, desc := s.describe(m.Subject, counters, err)
	s.replyError(e, m.Subject, m.Reply, code, desc)
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

func (s *Service) handleDecode(e *endpoint, m *nats.Msg, _ time.Duration) outcome {
	b, err := s.decode(m.Data)
	if err != nil {
		return outcome{KindDecode, s.fail(e, m, nil, err), 0}
	}
	s.reply(e, m.Subject, m.Reply, b)
	return outcome{KindDecode, codeOK, 0}
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
