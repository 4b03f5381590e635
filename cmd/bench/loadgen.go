package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/leafbus/leafbus/wire"
)

// maxErrorSamples bounds the example messages kept per error key.
const maxErrorSamples = 3

// loadSpec is one phase of traffic. The dispenser run and the echo baseline use the same
// spec except for the subjects, so the two are loaded identically.
type loadSpec struct {
	label    string   // "dispenser" or "echo", for the progress line
	subjects []string // one per tag; requests go round robin over them
	body     []byte   // nil for one ID
	header   nats.Header
	batch    int
	enc      wire.Encoding

	clients  int
	inflight int     // closed loop
	rate     float64 // > 0: open loop
	warmup   time.Duration
	duration time.Duration
	requests int64
	timeout  time.Duration

	// checks keep the IDs to look for duplicates in, one checker per ID space: one per
	// tag for segment IDs (each tag counts from its own max_id, so two tags may share a
	// number), one for all snowflake IDs (unique across tags). Empty: IDs are parsed,
	// then dropped.
	checks    []*checker
	monotonic bool // count per-client regressions of IDs across replies

	cpuPIDs map[string]int // processes whose CPU per request to measure, by label
}

// phaseResult is what one phase measured, the workers' parts merged.
type phaseResult struct {
	elapsed         time.Duration    // end of warm-up to the last measured completion
	sent            int64            // measured requests sent
	ok              int64            // measured requests with a good reply
	ids             int64            // IDs in those replies
	errors          map[string]int64 // measured requests by error key
	errorSamples    map[string][]string
	hist            *hist // latency of the good measured replies
	sendLag         *hist // open loop: how late the sender published measured requests
	late            int64 // replies that came after their request had timed out
	orderViolations int64 // replies with IDs not strictly increasing, warm-up included
	regressions     int64 // replies whose first ID is not above the client's previous for the tag
	slowConsumers   int64
	collectors      [][]*collector     // per checker, the workers' IDs for its final merge
	cpu             map[string]float64 // µs of CPU per good measured reply, by process
}

// pending is one request in a worker's window.
type pending struct {
	at       time.Duration // since the phase's epoch: sent (closed loop) or due (open loop)
	tag      int32
	measured bool
	done     bool
}

// liveCounters feed the progress line while the run goes on.
type liveCounters struct {
	sent, ok, errs, ids atomic.Int64
}

// worker drives one client connection. Its replies arrive on one wildcard inbox; the
// reply subject's last token is the request's sequence number, which indexes a window of
// outstanding requests. One goroutine receives, times out, records and (closed loop)
// sends, so the histogram, the counters and the ID collector need no lock. In the open
// loop a second goroutine sends on the timetable; it shares only an atomic high-water mark.
type worker struct {
	id     int
	spec   *loadSpec
	sched  schedule
	cl     *benchConn
	logger *slog.Logger
	epoch  time.Time
	done   <-chan struct{} // the run was interrupted
	stop   *atomic.Bool    // same, for the hot path
	budget *atomic.Int64   // closed loop: measured requests left, shared by the workers

	inbox string
	msgs  chan *nats.Msg
	sub   *nats.Subscription
	gone  chan struct{} // --http: closed when the phase ends, so late answers are dropped
	// reply is inbox + "." and room for a sequence number: the reply subject of the next
	// request is written here. Only the goroutine that publishes uses it (the receiver
	// in the closed loop, the sender in the open loop).
	reply []byte

	// Owned by the receiving goroutine.
	base     int64 // sequence number of win[0]
	win      []pending
	open     int   // entries of win not done
	nextSeq  int64 // closed loop: next sequence number
	lastDone time.Duration
	lastID   []int64 // per tag, for the regression count
	idbuf    []int64
	cols     []*collector // one per spec.checks
	res      phaseResult

	// Owned by the open-loop sender until it ends.
	lag *hist

	// Shared with the open-loop sender and the progress line.
	sentHigh atomic.Int64 // open loop: requests published so far
	sendErrs atomic.Int64
	live     liveCounters
}

// runLoad runs one phase on clients and returns once every worker has stopped.
func runLoad(ctx context.Context, clients []*benchConn, spec *loadSpec, progressOut io.Writer, logger *slog.Logger) (*phaseResult, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	stop := &atomic.Bool{}
	unhook := context.AfterFunc(ctx, func() { stop.Store(true) })
	defer unhook()
	budget := &atomic.Int64{}
	budget.Store(spec.requests)

	var slowBefore int64
	workers := make([]*worker, 0, len(clients))
	defer func() {
		for _, w := range workers {
			w.unsubscribe()
		}
	}()
	for i, cl := range clients {
		slowBefore += cl.slow.Load()
		w := newWorker(i, cl, spec, len(clients), logger)
		w.done, w.stop, w.budget = ctx.Done(), stop, budget
		if err := w.subscribe(); err != nil {
			return nil, err
		}
		workers = append(workers, w)
	}
	for i, cl := range clients {
		if cl.nc == nil {
			continue // HTTP: each request finds out for itself
		}
		if err := cl.nc.FlushTimeout(spec.timeout); err != nil {
			return nil, fmt.Errorf("client %d: NATS server does not answer: %w", i, err)
		}
		if err := inboxRefused(cl.nc, workers[i].inbox); err != nil {
			return nil, fmt.Errorf("client %d: %w", i, err)
		}
	}
	cpu := drive(workers, spec, progressOut)

	res := newPhaseResult(spec.rate > 0)
	var lastDone time.Duration
	for _, w := range workers {
		res.add(w)
		lastDone = max(lastDone, w.lastDone)
	}
	for _, cl := range clients {
		res.slowConsumers += cl.slow.Load()
	}
	res.slowConsumers -= slowBefore
	res.elapsed = max(lastDone-spec.warmup, 0)
	res.cpu = cpu.perRequest(res.ok)
	return res, nil
}

// newWorker prepares client number id of clients for spec; the caller sets the run's
// shared state (done, stop, budget) and subscribes it.
func newWorker(id int, cl *benchConn, spec *loadSpec, clients int, logger *slog.Logger) *worker {
	w := &worker{
		id: id, spec: spec, cl: cl, logger: logger,
		sched:  newSchedule(spec.rate, clients, spec.warmup, spec.duration, spec.requests),
		lastID: make([]int64, len(spec.subjects)),
		idbuf:  make([]int64, 0, spec.batch),
		res:    *newPhaseResult(false),
	}
	for _, c := range spec.checks {
		w.cols = append(w.cols, c.collector())
	}
	if spec.rate > 0 {
		w.lag = newHist()
	}
	return w
}

// subscribe opens the worker's reply inbox. An HTTP client's answers come to the same
// channel, under made-up reply subjects.
func (w *worker) subscribe() error {
	if w.cl.web != nil {
		w.inbox, w.gone = "http", make(chan struct{})
		w.reply = newReplyBuffer(w.inbox)
		w.msgs = make(chan *nats.Msg, w.replyBuffer())
		return nil
	}
	w.inbox = w.cl.nc.NewInbox()
	w.reply = newReplyBuffer(w.inbox)
	w.msgs = make(chan *nats.Msg, w.replyBuffer())
	sub, err := w.cl.nc.ChanSubscribe(w.inbox+".*", w.msgs)
	if err != nil {
		return fmt.Errorf("subscribe reply inbox of client %d: %w", w.id, err)
	}
	w.sub = sub
	return nil
}

// inboxRefused is the server's refusal of nc's subscription to its reply inbox, once a
// flush has made sure the refusal, if any, arrived: without the subscription every
// request would only time out. The advice covers the usual cause, a user confined to
// inboxes of its own prefix.
func inboxRefused(nc *nats.Conn, inbox string) error {
	err := nc.LastError()
	if !errors.Is(err, nats.ErrPermissionViolation) || !strings.Contains(err.Error(), inbox) {
		return nil
	}
	return fmt.Errorf("the NATS server refuses this user its reply inbox %s.* (%w): a user that may only subscribe to inboxes of its own prefix (deploy/nats-roles.conf: _INBOX_<user>) needs that prefix in --inbox-prefix", inbox, err)
}

// newReplyBuffer is inbox + "." with room for any sequence number (at most 20 digits).
func newReplyBuffer(inbox string) []byte {
	return append(append(make([]byte, 0, len(inbox)+21), inbox...), '.')
}

// drive starts the phase's clock and its workers, shows progress, and returns when every
// worker has stopped, with the CPU the watched processes used after the warm-up.
func drive(workers []*worker, spec *loadSpec, progressOut io.Writer) *cpuWatch {
	epoch := time.Now()
	for _, w := range workers {
		w.epoch = epoch
	}
	cpu := startCPUWatch(spec.cpuPIDs, spec.warmup)
	prog := startProgress(progressOut, spec.label, workers, epoch)
	var wg sync.WaitGroup
	for _, w := range workers {
		if spec.rate > 0 {
			wg.Go(w.runOpen)
		} else {
			wg.Go(w.runClosed)
		}
	}
	wg.Wait()
	cpu.stop()
	prog.Stop()
	return cpu
}

// newPhaseResult makes an empty result; open adds the open loop's sender-lag histogram.
func newPhaseResult(open bool) *phaseResult {
	r := &phaseResult{hist: newHist(), errors: map[string]int64{}, errorSamples: map[string][]string{}}
	if open {
		r.sendLag = newHist()
	}
	return r
}

// add merges what worker w measured into r (merge, as for two phases); the worker must
// have stopped. Its sender's lag, send errors and ID collectors are kept beside its
// result while it runs, and join it here.
func (r *phaseResult) add(w *worker) {
	wr := &w.res
	wr.sendLag = w.lag
	if n := w.sendErrs.Load(); n > 0 {
		wr.errors[errKeySend] += n
	}
	wr.collectors = make([][]*collector, len(w.cols))
	for i, col := range w.cols {
		wr.collectors[i] = []*collector{col}
	}
	r.merge(wr)
}

// sample keeps msg as an example of error key k, up to maxErrorSamples different ones.
func (r *phaseResult) sample(k, msg string) {
	if have := r.errorSamples[k]; len(have) < maxErrorSamples && !slices.Contains(have, msg) {
		r.errorSamples[k] = append(have, msg)
	}
}

// replyBuffer sizes the inbox channel: nats.go drops replies (a slow-consumer event)
// when it is full, and a dropped reply would be misreported as a timeout.
func (w *worker) replyBuffer() int {
	if w.spec.rate == 0 {
		return max(1024, 2*w.spec.inflight)
	}
	perClient := w.spec.rate / float64(w.spec.clients) * w.spec.timeout.Seconds()
	return int(min(max(perClient, 1024), 1<<17))
}

// sweepEvery is how often timeouts are looked for: a tenth of the timeout, 1 to 20 ms.
func (w *worker) sweepEvery() time.Duration {
	return min(max(w.spec.timeout/10, time.Millisecond), 20*time.Millisecond)
}

// runClosed keeps spec.inflight requests outstanding until the phase ends, then waits
// for the last replies (or their timeouts).
func (w *worker) runClosed() {
	for range w.spec.inflight {
		if !w.sendNext() {
			break
		}
	}
	tick := time.NewTicker(w.sweepEvery())
	defer tick.Stop()
	for w.open > 0 {
		var completed int
		select {
		case m := <-w.msgs:
			completed = w.handle(m)
		case <-tick.C:
			completed = w.sweep(true)
		}
		for range completed {
			if !w.sendNext() {
				break
			}
		}
	}
}

// sendNext sends the closed loop's next request unless the phase is over.
func (w *worker) sendNext() bool {
	if w.stop.Load() {
		return false
	}
	now := time.Since(w.epoch)
	measured := now >= w.spec.warmup
	if measured && w.spec.duration > 0 && now >= w.spec.warmup+w.spec.duration {
		return false
	}
	if measured && w.spec.requests > 0 && w.budget.Add(-1) < 0 {
		return false
	}
	seq := w.nextSeq
	tag := w.tag(seq)
	if err := w.publish(seq, tag); err != nil {
		w.sendFailed(err)
		return false
	}
	w.nextSeq++
	w.win = append(w.win, pending{at: now, tag: tag, measured: measured})
	w.open++
	if measured {
		w.res.sent++
	}
	w.live.sent.Add(1)
	return true
}

// runOpen sends on the timetable from a second goroutine and receives here until every
// request sent has been answered or has timed out.
func (w *worker) runOpen() {
	senderDone := make(chan struct{})
	go func() {
		defer close(senderDone)
		w.sendScheduled()
	}()
	tick := time.NewTicker(w.sweepEvery())
	defer tick.Stop()
	finished := false
	for {
		select {
		case m := <-w.msgs:
			w.handle(m)
		case <-tick.C:
			w.sweep(true)
		case <-senderDone:
			finished, senderDone = true, nil
		}
		if finished {
			w.extend(w.sentHigh.Load())
			if w.open == 0 {
				return
			}
		}
	}
}

// sendScheduled publishes this client's slots when they fall due. It never waits for a
// reply; when it falls behind it sends the overdue slots at once, and their latency
// still counts from when they were due.
func (w *worker) sendScheduled() {
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()
	for seq := int64(0); ; seq++ {
		i := w.sched.slot(w.id, seq)
		if i >= w.sched.limit || w.stop.Load() {
			return
		}
		due := w.sched.at(i)
		if !waitUntil(w.epoch, due, timer, w.done) {
			return
		}
		if i >= w.sched.warmup {
			// Lateness is part of the measured latency by design; reporting it apart
			// tells a slow server from a bench that cannot keep its own timetable.
			w.lag.Record(time.Since(w.epoch) - due)
		}
		if err := w.publish(seq, w.tag(seq)); err != nil {
			w.sendFailed(err)
			return
		}
		w.sentHigh.Store(seq + 1)
		w.live.sent.Add(1)
	}
}

// tag is the index of the tag of this client's seq-th request: each client goes round
// the tags, starting one further than the previous client, so every client asks for
// every tag and, over the clients, the tags are asked for evenly.
func (w *worker) tag(seq int64) int32 {
	return int32((int64(w.id) + seq) % int64(len(w.spec.subjects)))
}

// unsubscribe closes the worker's reply inbox once the phase has ended.
func (w *worker) unsubscribe() {
	if w.sub != nil {
		w.sub.Unsubscribe()
	}
	if w.gone != nil {
		close(w.gone)
	}
}

// publish sends request seq for tag: over NATS, or as a GET of the tag's URL (--http,
// where spec.subjects holds URLs). A NATS request costs one allocation, the reply
// subject's string (a plain client allocates one per request as well): the subject is
// written into a reused buffer, and without a header no nats.Msg is built.
func (w *worker) publish(seq int64, tag int32) error {
	w.reply = strconv.AppendInt(w.reply[:len(w.inbox)+1], seq, 10)
	reply := string(w.reply)
	if w.cl.web != nil {
		w.cl.web.send(w.spec.subjects[tag], reply, w.msgs, w.gone)
		return nil
	}
	if w.spec.header == nil {
		return w.cl.nc.PublishRequest(w.spec.subjects[tag], reply, w.spec.body)
	}
	return w.cl.nc.PublishMsg(&nats.Msg{Subject: w.spec.subjects[tag], Reply: reply, Header: w.spec.header, Data: w.spec.body})
}

// sendFailed stops this client: nats.go buffers publishes while it reconnects, so a
// publish fails only on a closed connection or a payload the server refuses.
func (w *worker) sendFailed(err error) {
	if w.sendErrs.Add(1) == 1 {
		w.logger.Error("publish failed; this client stops sending", "client", w.id, "err", err)
	}
	w.live.errs.Add(1)
}

// extend adds the open loop's requests published up to sequence upTo to the window.
func (w *worker) extend(upTo int64) {
	if w.spec.rate == 0 {
		return
	}
	for seq := w.base + int64(len(w.win)); seq < upTo; seq++ {
		i := w.sched.slot(w.id, seq)
		measured := i >= w.sched.warmup
		w.win = append(w.win, pending{at: w.sched.at(i), tag: w.tag(seq), measured: measured})
		w.open++
		if measured {
			w.res.sent++
		}
	}
}

// handle takes one reply and returns how many requests it completed (0 or 1).
func (w *worker) handle(m *nats.Msg) int {
	now := time.Since(w.epoch)
	if len(m.Subject) <= len(w.inbox)+1 {
		return 0
	}
	seq, err := strconv.ParseInt(m.Subject[len(w.inbox)+1:], 10, 64)
	if err != nil {
		return 0
	}
	if w.spec.rate > 0 {
		// The reply may beat the sender's high-water mark by one: it publishes first.
		high := w.sentHigh.Load()
		if seq > high {
			return 0
		}
		w.extend(max(high, seq+1))
	}
	idx := seq - w.base
	if idx >= int64(len(w.win)) {
		return 0
	}
	if idx < 0 || w.win[idx].done {
		// Counted as a timeout already, but its IDs were handed out all the same: a
		// duplicate among them is still a duplicate.
		w.res.late++
		ids, err := parseReply(m.Header, m.Data, w.spec.batch, w.spec.enc, w.idbuf[:0])
		switch {
		case errors.Is(err, wire.ErrOutOfOrder):
			w.res.orderViolations++
		case err == nil:
			w.keep(w.tag(seq), ids)
		}
		return 0
	}
	e := &w.win[idx]
	e.done = true
	w.open--
	w.complete(e, m, now)
	w.sweep(false)
	return 1
}

// keep hands the IDs of a reply for tag to the checker of their ID space.
func (w *worker) keep(tag int32, ids []int64) {
	switch len(w.cols) {
	case 0:
	case 1:
		w.cols[0].add(ids)
	default:
		w.cols[tag].add(ids)
	}
}

// complete checks and records the reply to e.
func (w *worker) complete(e *pending, m *nats.Msg, now time.Duration) {
	var err error
	w.idbuf, err = parseReply(m.Header, m.Data, w.spec.batch, w.spec.enc, w.idbuf[:0])
	if err != nil {
		if errors.Is(err, wire.ErrOutOfOrder) {
			w.res.orderViolations++
		}
		key := errKey(err)
		if len(w.res.errorSamples[key]) < maxErrorSamples { // spares err.Error() once there are enough
			w.res.sample(key, err.Error())
		}
		if e.measured {
			w.res.errors[key]++
			w.lastDone = max(w.lastDone, now)
		}
		w.live.errs.Add(1)
		return
	}
	ids := w.idbuf
	w.keep(e.tag, ids)
	if w.spec.monotonic {
		if last := w.lastID[e.tag]; last != 0 && ids[0] <= last {
			w.res.regressions++
		}
		w.lastID[e.tag] = ids[len(ids)-1]
	}
	if e.measured {
		w.res.hist.Record(now - e.at)
		w.res.ok++
		w.res.ids += int64(len(ids))
		w.lastDone = max(w.lastDone, now)
	}
	w.live.ok.Add(1)
	w.live.ids.Add(int64(len(ids)))
}

// sweep drops completed requests from the front of the window and, with timeouts, fails
// those older than the timeout. Requests enter the window in the order of their times,
// so only the front can have expired. It returns how many it timed out.
func (w *worker) sweep(timeouts bool) int {
	var now time.Duration
	if timeouts {
		w.extend(w.sentHigh.Load())
		now = time.Since(w.epoch)
	}
	expired := 0
	for len(w.win) > 0 {
		e := &w.win[0]
		if !e.done {
			if !timeouts || now-e.at < w.spec.timeout {
				break
			}
			e.done = true
			w.open--
			expired++
			if e.measured {
				w.res.errors[errKeyTimeout]++
				w.lastDone = max(w.lastDone, e.at+w.spec.timeout)
			}
			w.live.errs.Add(1)
		}
		w.win = w.win[1:]
		w.base++
	}
	return expired
}
