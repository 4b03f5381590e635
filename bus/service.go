package bus

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

	"github.com/leafbus/leafbus/core"
	"github.com/leafbus/leafbus/wire"
)

// Core is what a request means (package core's *Core): the face parses a request into
// a core.Request, asks Take on the delivery goroutine (never waits), and Wait when the
// answer needs a wait; decoding and the admin calls are the core's too.
type Core interface {
	MaxBatch() int
	Take(r core.Request, dst []int64) (core.Answer, bool)
	Wait(r core.Request, done func(core.Answer)) error
	Stats(kind wire.Kind) core.KindStats
	Decode(id int64) (core.Decoded, error)
	Admin(call func(ctx context.Context)) error
	AddTag(ctx context.Context, r wire.AddTagRequest) (wire.TagInfo, error)
	ListTags(ctx context.Context) ([]wire.TagInfo, error)
	UpdateTag(ctx context.Context, r wire.UpdateTagRequest) (wire.TagInfo, error)
}

var _ Core = (*core.Core)(nil)

// Observer is told about every answer of the ID and decode endpoints, so that NATS and
// HTTP requests are counted alike (*metrics.Metrics is one). It is declared here, not
// taken from package metrics, so that the service does not depend on Prometheus.
// Observe runs on the request path: it must not block, and should not allocate.
type Observer interface {
	// Observe records one answer: transport is wire.TransportNATS; kind "segment",
	// "snowflake" or wire.KindDecode; code 200 or the error's wire code; seconds from the
	// request's arrival to its answer; ids how many IDs it carried (0 for an error).
	Observe(transport, kind string, code int, seconds float64, ids int)
}

// rejecter is the optional part of an Observer that counts requests refused at once
// because MaxWaiting requests were already waiting (*metrics.Metrics has it).
type rejecter interface {
	Rejected(transport string)
}

// Config describes the service a dispenser runs: plain queue subscriptions that speak
// the protocol `nats micro` reads ($SRV).
type Config struct {
	Prefix  string // subject prefix, service name and queue group ("leaf")
	Version string // semantic version shown by $SRV.INFO (the dispenser's build; wire.DevelVersion by default)
	Core    Core   // what every request means; required

	// Stats adds data to an endpoint's $SRV.STATS entry ("segment", "snowflake", ...).
	Stats  func(endpoint string) any
	Logger *slog.Logger

	// Observer, when set, is told about every answer of the ID and decode endpoints.
	Observer Observer
	// Metadata is added to the service's $SRV metadata (the dispenser's node_id and
	// worker-ID range, which discovery reads); max_batch is always there, the core's.
	Metadata map[string]string
	// LiveMetadata, when set, is asked on every $SRV PING, INFO and STATS for the entries that
	// change while the service runs (the worker ID, replaced after a lost lease); they
	// override Metadata's. $SRV requests are rare, so it may allocate.
	LiveMetadata func() map[string]string
}

// DefaultConfig is the configuration of the protocol's defaults; Core is the caller's.
func DefaultConfig() Config {
	return Config{Prefix: wire.DefaultPrefix, Version: wire.DevelVersion}
}

// Validate names the field, value and bound of the first bad setting.
func (c Config) Validate() error {
	if err := wire.CheckPrefix(c.Prefix); err != nil {
		return err
	}
	if c.Core == nil {
		return errors.New("bus: config: Core is required")
	}
	return nil
}

// Service is the dispenser's NATS face: a service named after the prefix, in the queue
// group of the same name, with endpoints for segment and snowflake IDs, decoding and tag
// admin, which the NATS service API ($SRV PING, INFO and STATS; `nats micro`) lists and
// counts as it does any nats.go/micro service. It only parses and encodes: what a request
// means is the Core's. It owns its connection, so that stopping it can drain every
// request already delivered without cutting the connection the heartbeats use.
//
// Each endpoint is a plain queue subscription rather than a micro endpoint, and answers
// with a plain publish: on the ID subjects micro's request wrapper, reply message,
// clocks and lock per request cost about as much CPU as the dispenser's own work
// (BENCHMARKS.md, issue 14), and an ID reply here allocates nothing.
type Service struct {
	cfg      Config
	core     Core
	nc       *nats.Conn
	logger   *slog.Logger
	id       string            // this instance's ID in $SRV
	metadata map[string]string // $SRV metadata (Config.metadata); never written after New
	started  time.Time         // as $SRV.STATS shows it
	maxBatch int

	subjects         wire.Subjects
	segmentSubject   string // "leaf.segment." : the tag follows
	snowflakeSubject string
	guard            *replyGuard
	endpoints        []*endpoint
	verbSubs         []*nats.Subscription

	pending sync.WaitGroup // answers the core will deliver (Wait), and admin calls
	bufs    sync.Pool      // *[]byte, for answers encoded off the delivery goroutine

	observer     Observer  // nil: nothing observed
	rejecter     rejecter  // nil: the Observer does not count refusals
	epoch        time.Time // requests are timed from here on the monotonic clock alone
	stopOnce     sync.Once
	stopErr      error
	verbsRefused atomic.Uint64 // $SRV requests dropped by the reply guard
}

// description is the service's $SRV.INFO description.
const description = "Leaf ID dispenser: segment and snowflake IDs over NATS"

// New registers the service on nc, which it then owns (Stop drains and closes it).
// Requests are served from the moment it returns.
func New(nc *nats.Conn, cfg Config) (*Service, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	maxBatch := cfg.Core.MaxBatch()
	if need := int64(maxBatch) * wire.MaxTextID; need > nc.MaxPayload() {
		return nil, fmt.Errorf("--max-batch %d: a text reply may need %d bytes, but the NATS server's max_payload is %d", maxBatch, need, nc.MaxPayload())
	}
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	subjects := wire.Subjects{Prefix: cfg.Prefix}
	s := &Service{
		cfg:              cfg,
		core:             cfg.Core,
		nc:               nc,
		logger:           logger,
		id:               strings.TrimPrefix(nats.NewInbox(), nats.InboxPrefix), // a NUID, as micro's
		metadata:         cfg.metadata(maxBatch),
		maxBatch:         maxBatch,
		subjects:         subjects,
		segmentSubject:   subjects.IDsPrefix(wire.Segment),
		snowflakeSubject: subjects.IDsPrefix(wire.Snowflake),
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
func (c Config) metadata(maxBatch int) map[string]string {
	m := make(map[string]string, len(c.Metadata)+1)
	for k, v := range c.Metadata {
		m[k] = v
	}
	m[wire.MetaMaxBatch] = strconv.Itoa(maxBatch)
	return m
}

func (s *Service) newEndpoints() []*endpoint {
	sub := s.subjects
	return []*endpoint{
		{name: "segment", subject: sub.IDsWildcard(wire.Segment), handle: s.handleIDs(wire.Segment), kind: wire.Segment, isIDs: true},
		{name: "snowflake", subject: sub.IDsWildcard(wire.Snowflake), handle: s.handleIDs(wire.Snowflake), kind: wire.Snowflake, isIDs: true},
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

// Stop stops taking requests, answers every request already delivered (including
// those the core answers after a wait, within its WaitMax), then closes the connection.
// The result of the first call is returned by every call.
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
	// message delivered before the stop went through its handler. Then no handler
	// starts another wait, and the ones started end within the core's WaitMax (or an
	// admin call's timeout) and publish before the connection is closed below.
	deadline := time.Now().Add(drainMax)
	for s.nc.NumSubscriptions() > 0 && !s.nc.IsClosed() && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	s.pending.Wait()
	if err := s.nc.Flush(); err != nil && !errors.Is(err, nats.ErrConnectionClosed) {
		errs = append(errs, fmt.Errorf("flush replies: %w", err))
	}
	s.nc.Close()
	return errors.Join(errs...)
}

// drainMax bounds Stop's wait for its subscriptions to drain.
const drainMax = 10 * time.Second

// handleIDs serves leaf.segment.<tag> and leaf.snowflake.<tag>. Everything here runs
// on the endpoint's delivery goroutine, serially, so nothing here may wait: the core's
// Take answers from memory, and an answer that needs a wait comes later through Wait. A
// request that is answered here allocates nothing: the tag is a slice of the subject,
// the IDs and the reply are the endpoint's scratch space, and the reply is a plain
// publish.
func (s *Service) handleIDs(kind wire.Kind) handler {
	subjectPrefix := s.segmentSubject
	if kind == wire.Snowflake {
		subjectPrefix = s.snowflakeSubject
	}
	return func(e *endpoint, m *nats.Msg, start time.Duration) outcome {
		r, err := s.parseIDsRequest(kind, m.Subject[min(len(subjectPrefix), len(m.Subject)):], m)
		if err != nil {
			return outcome{kind.String(), s.fail(e, m, err), 0}
		}
		a, ok := s.core.Take(r, e.scratchIDs(r.Count))
		if !ok {
			return s.wait(e, m, r, start)
		}
		if a.Err != nil {
			return outcome{kind.String(), s.fail(e, m, a.Err), 0}
		}
		body := a.Reply
		if body == nil {
			body = e.encode(a.IDs, r.Encoding)
		}
		s.reply(e, m.Subject, m.Reply, body)
		return outcome{kind.String(), codeOK, r.Count}
	}
}

// codeOK is the code an Observer is told for a success, as HTTP has it.
const codeOK = 200

// parseIDsRequest reads an ID request: the tag from the subject's last token (in the
// tag encoding: a plain token is the tag itself, without an allocation), the count from
// the body and the encoding from its header.
func (s *Service) parseIDsRequest(kind wire.Kind, token string, m *nats.Msg) (core.Request, error) {
	tag, err := wire.ParseTagToken(token)
	if err != nil {
		return core.Request{}, err
	}
	n, err := wire.ParseCount(m.Data, s.maxBatch)
	if err != nil {
		return core.Request{}, err
	}
	enc, err := wire.ParseEncoding(m.Header.Get(wire.EncodingHeader))
	if err != nil {
		return core.Request{}, err
	}
	return core.Request{Kind: kind, Tag: tag, Count: n, Encoding: enc}, nil
}

// wait hands a request the core could not answer at once to core.Wait, which answers
// (and observes) it later, off the delivery goroutine; a request that may not wait is
// answered with the refusal now.
func (s *Service) wait(e *endpoint, m *nats.Msg, r core.Request, start time.Duration) outcome {
	subject, reply := m.Subject, m.Reply
	s.pending.Add(1)
	err := s.core.Wait(r, func(a core.Answer) {
		defer s.pending.Done()
		s.answerWaited(e, subject, reply, r, a, start)
	})
	if err != nil {
		s.pending.Done()
		if errors.Is(err, core.ErrOverloaded) && s.rejecter != nil {
			s.rejecter.Rejected(wire.TransportNATS)
		}
		return outcome{r.Kind.String(), s.fail(e, m, err), 0}
	}
	return outcome{}
}

// answerWaited answers a request that waited: with the IDs, encoded into a buffer of
// the pool (the endpoint's scratch space is the delivery goroutine's), or with the error.
func (s *Service) answerWaited(e *endpoint, subject, reply string, r core.Request, a core.Answer, start time.Duration) {
	defer a.Release()
	if a.Err != nil {
		code, desc := s.describe(subject, a.Err)
		s.replyError(e, subject, reply, code, desc)
		s.observe(r.Kind.String(), code, start, 0)
		return
	}
	bp := s.getBuf(len(a.IDs) * wire.MaxTextID)
	b := wire.AppendIDs((*bp)[:0], a.IDs, r.Encoding)
	s.reply(e, subject, reply, b)
	*bp = b
	s.bufs.Put(bp)
	s.observe(r.Kind.String(), codeOK, start, len(a.IDs))
}

// now is the time since the service started on the monotonic clock alone (time.Now
// reads the wall clock too): requests are timed with it.
func (s *Service) now() time.Duration {
	return time.Since(s.epoch)
}

// observe tells the Observer about one answer of kind, received at start (now).
func (s *Service) observe(kind string, code int, start time.Duration, ids int) {
	if s.observer != nil {
		s.observer.Observe(wire.TransportNATS, kind, code, (s.now() - start).Seconds(), ids)
	}
}

// fail answers an error with its wire code, which it returns; a 500 is logged in full
// since the wire only says "internal error".
func (s *Service) fail(e *endpoint, m *nats.Msg, err error) int {
	code, desc := s.describe(m.Subject, err)
	s.replyError(e, m.Subject, m.Reply, code, desc)
	return code
}

// describe turns err into its wire code and description, logging a 500 in full.
func (s *Service) describe(subject string, err error) (int, string) {
	code, desc := core.CodeOf(err)
	if code == 500 {
		s.logger.Error("request failed", "subject", wire.Quote(subject), "err", err)
	}
	return code, desc
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
		return outcome{wire.KindDecode, s.fail(e, m, err), 0}
	}
	s.reply(e, m.Subject, m.Reply, b)
	return outcome{wire.KindDecode, codeOK, 0}
}

// decode is the JSON answer of a decode request's body.
func (s *Service) decode(body []byte) ([]byte, error) {
	id, err := wire.ParseID(body)
	if err != nil {
		return nil, err
	}
	d, err := s.core.Decode(id)
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
