package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/leafbus/leafbus/internal/testutil"
	"github.com/leafbus/leafbus/wire"
)

// The run's monotonic tag (PROTOCOL.md "Monotonic tags"): every ID of a reply must be
// above every ID of any reply received before its request was sent, across all
// dispensers and through every fault. The load of the tag is apart from the steady
// load: its clients send plain requests (no hedging: a copy sent later would blur when
// the request was sent) and may get 503 while no leader is known, which the steady
// load's rules would count as failures.
const (
	monoTag = "chaos-mono"
	// monoLeaseTTL is the dispensers' --monotonic-lease-ttl: short, so that a failover
	// (about one TTL, at most two: the contract) keeps the run short.
	monoLeaseTTL = 2 * time.Second
	// monoPatient is the request timeout of every fourth client of the tag: longer than
	// any pause of a leader, so that an answer the resumed process sends late is seen
	// and checked. The others give up after monoQuick, as a client would, so that the
	// failover gap shows the tag's unavailability, not clients stuck on a paused process.
	monoPatient = 30 * time.Second
	monoQuick   = 2 * time.Second
)

// monoSpec is the load of the monotonic tag: clients paced to rate requests a second
// each, asking for one ID, or one in four times for up to maxCount.
type monoSpec struct {
	clients  int
	rate     float64
	maxCount int
}

// monoReply is one answered request: sent before the request left and recv after the
// answer arrived, both on the one monotonic clock of the test process (since start).
type monoReply struct {
	sent, recv  time.Duration
	first, last int64
	client      int
}

// monoFailure is a request that got no IDs: when its answer (or time-out) came, and why.
type monoFailure struct {
	at   time.Duration
	code string
}

// monoLoad runs the clients of the monotonic tag and keeps every reply and failure.
type monoLoad struct {
	spec    monoSpec
	subject string
	start   time.Time

	mu       sync.Mutex
	replies  []monoReply
	ids      []int64
	failures []monoFailure
	samples  []string
	flagged  []string // what the run must fail for besides the checks: a resumed leader's old term

	cancel context.CancelFunc
	wg     sync.WaitGroup // clients
	checks sync.WaitGroup // watches of resumed leaders
}

// since is now on the load's clock.
func (m *monoLoad) since() time.Duration { return time.Since(m.start) }

// at is t on the load's clock.
func (m *monoLoad) at(t time.Time) time.Duration { return t.Sub(m.start) }

// markMonotonic marks tag monotonic through the admin API and waits until every one of
// nodes knows its leader (one leads it, the others follow), so the load starts on a
// tag that is served.
func (w *world) markMonotonic(tag string, nodes []string) {
	w.t.Helper()
	on := true
	b, _ := json.Marshal(wire.UpdateTagRequest{Tag: tag, Monotonic: &on})
	// A 503 means "not now" (PROTOCOL.md): the dispenser the queue group picked may still
	// be loading its marks. Ask again, within a bound, as a client must.
	var msg *nats.Msg
	var err error
	for again := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		msg, err = w.nc.Request(wire.Subjects{Prefix: wire.DefaultPrefix}.AdminTags("update"), b, 10*time.Second)
		if err == nil {
			err = wire.ReplyError(msg.Header.Get(wire.ServiceErrorCodeHeader), msg.Header.Get(wire.ServiceErrorHeader))
		}
		if !errors.Is(err, wire.ErrUnavailable) || time.Now().After(again) {
			break
		}
	}
	var info wire.TagInfo
	if err == nil {
		err = json.Unmarshal(msg.Data, &info)
	}
	if err != nil || !info.Monotonic {
		w.t.Fatalf("mark %s monotonic: %+v, %v", tag, info, err)
	}
	deadline := time.Now().Add(10 * monoLeaseTTL)
	for {
		leader, _, roles := w.monoLeader(nodes)
		if leader != "" && len(roles) == len(nodes) && !slices.Contains(roles, "none") && !slices.Contains(roles, "starting") {
			w.t.Logf("chaos: %s is monotonic, led by %s", tag, leader)
			return
		}
		if time.Now().After(deadline) {
			w.t.Fatalf("%s: no leader known to all of %v within %s: %v", tag, nodes, 10*monoLeaseTTL, roles)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// monoLeader is the one of nodes that leads monoTag now ("" when none or more than
// one does) with the leases it took so far (its terms), and the roles the answering
// nodes report.
func (w *world) monoLeader(nodes []string) (leader string, terms uint64, roles []string) {
	hs := w.probe(len(nodes), 300*time.Millisecond)
	leaders := 0
	for _, n := range nodes {
		h, ok := hs[n]
		if !ok {
			continue
		}
		roles = append(roles, h.mono.Role)
		if h.mono.Role == "leader" {
			leader, terms = n, h.mono.Terms
			leaders++
		}
	}
	if leaders != 1 {
		leader = ""
	}
	return leader, terms, roles
}

// waitMonoLeader waits (up to 10 lease TTLs) until one of nodes leads monoTag, and
// returns it and its terms.
func (w *world) waitMonoLeader(nodes []string) (string, uint64) {
	w.t.Helper()
	deadline := time.Now().Add(10 * monoLeaseTTL)
	for {
		if leader, terms, _ := w.monoLeader(nodes); leader != "" {
			return leader, terms
		}
		if time.Now().After(deadline) {
			w.t.Fatalf("no leader of %s among %v within %s", monoTag, nodes, 10*monoLeaseTTL)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// startMono starts spec.clients clients of monoTag, spread over connections to each
// NATS node in turn (each fails over to the others), so the queue group spreads their
// requests over every dispenser.
func startMono(w *world, spec monoSpec) *monoLoad {
	w.t.Helper()
	m := &monoLoad{spec: spec, subject: wire.Subjects{Prefix: wire.DefaultPrefix}.IDs(wire.Segment, monoTag), start: time.Now()}
	var conns []*nats.Conn
	for i := range w.nats.Nodes {
		var urls []string
		for j := range w.nats.Nodes {
			urls = append(urls, w.nats.Nodes[(i+j)%len(w.nats.Nodes)].URL())
		}
		nc, err := nats.Connect(strings.Join(urls, ","), nats.Name(fmt.Sprintf("chaos monotonic %d", i)),
			nats.DontRandomize(), nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond), nats.Timeout(5*time.Second))
		if err != nil {
			w.t.Fatalf("connect the monotonic clients: %v", err)
		}
		w.t.Cleanup(nc.Close)
		conns = append(conns, nc)
	}
	ctx, cancel := context.WithCancel(context.Background())
	m.cancel = cancel
	for c := range spec.clients {
		timeout := monoQuick
		if c%4 == 0 {
			timeout = monoPatient
		}
		m.wg.Add(1)
		go m.client(ctx, c, conns[c%len(conns)], timeout, rand.New(rand.NewPCG(uint64(c), 15)))
	}
	w.t.Cleanup(m.stop)
	return m
}

// stop ends the clients and the watches, and waits for them.
func (m *monoLoad) stop() {
	m.cancel()
	m.wg.Wait()
	m.checks.Wait()
}

// client asks for IDs of the tag until ctx ends, at the spec's rate.
func (m *monoLoad) client(ctx context.Context, c int, nc *nats.Conn, timeout time.Duration, rng *rand.Rand) {
	defer m.wg.Done()
	every := time.Duration(float64(time.Second) / m.spec.rate)
	next := time.Now()
	for ctx.Err() == nil {
		count := 1
		if m.spec.maxCount > 1 && rng.IntN(4) == 0 {
			count = 1 + rng.IntN(m.spec.maxCount)
		}
		rctx, cancel := context.WithTimeout(ctx, timeout)
		sent := m.since()
		msg, err := nc.RequestWithContext(rctx, m.subject, []byte(strconv.Itoa(count)))
		recv := m.since()
		cancel()
		if ctx.Err() != nil {
			return
		}
		m.record(c, count, sent, recv, msg, err)
		if !waitTurn(ctx, &next, every) {
			return
		}
	}
}

// record keeps an answer with IDs, or notes a failure.
func (m *monoLoad) record(c, count int, sent, recv time.Duration, msg *nats.Msg, err error) {
	var ids []int64
	if err == nil {
		err = wire.ReplyError(msg.Header.Get(wire.ServiceErrorCodeHeader), msg.Header.Get(wire.ServiceErrorHeader))
	}
	if err == nil {
		ids, err = wire.DecodeIDs(nil, msg.Data, wire.Text)
		if err == nil && len(ids) != count {
			err = fmt.Errorf("%d IDs for %d asked", len(ids), count)
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if err != nil {
		code := codeOf(err)
		if errors.Is(err, context.DeadlineExceeded) {
			code = "timeout"
		}
		m.failures = append(m.failures, monoFailure{at: recv, code: code})
		if code != "503" && code != "timeout" && code != "no-responders" {
			// Only 503 (no leader known) and no answer are allowed: anything else, a
			// wrong count included, fails the run.
			if len(m.samples) < 5 {
				m.samples = append(m.samples, fmt.Sprintf("client %d at %v: %v", c, recv, err))
			}
		}
		return
	}
	m.replies = append(m.replies, monoReply{sent: sent, recv: recv, first: ids[0], last: ids[len(ids)-1], client: c})
	m.ids = append(m.ids, ids...)
}

// monoCheck is what the promise check found over a set of replies.
type monoCheck struct {
	replies, ids int
	dups, broken int
	examples     []string
}

// check checks every reply so far: its IDs strictly increasing and above every ID of
// every reply received before it was sent, and no ID twice.
func (m *monoLoad) check() monoCheck {
	m.mu.Lock()
	defer m.mu.Unlock()
	return checkPromise(m.replies, m.ids)
}

// checkPromise is the promise check (testutil.BrokenPromises, which the monotonic
// package's tests share) over replies, and the duplicates among ids.
func checkPromise(replies []monoReply, ids []int64) monoCheck {
	res := monoCheck{replies: len(replies), ids: len(ids)}
	twice := testutil.Duplicates(ids)
	res.dups = len(twice)
	for _, id := range twice[:min(len(twice), 3)] {
		res.examples = append(res.examples, fmt.Sprintf("ID %d handed out twice", id))
	}
	bad := brokenReplies(replies)
	res.broken = len(bad)
	for _, b := range bad[:min(len(bad), 5)] {
		rep := replies[b.Reply]
		res.examples = append(res.examples, fmt.Sprintf("reply [%d..%d] (client %d, sent %v, received %v) is not above ID %d, received before it was sent",
			rep.first, rep.last, rep.client, rep.sent, rep.recv, b.Above))
	}
	return res
}

// brokenReplies is testutil.BrokenPromises over the load's replies.
func brokenReplies(replies []monoReply) []testutil.Broken {
	checked := make([]testutil.Reply, len(replies))
	for i, rep := range replies {
		checked[i] = testutil.Reply{First: rep.first, Last: rep.last, Sent: rep.sent, Recv: rep.recv}
	}
	return testutil.BrokenPromises(checked)
}

// monoWindow is what the tag's clients saw from one fault's start to the end of its
// settling: the replies, the failures by code, and the longest time without an answer
// with IDs (from the start to the first, or between two).
type monoWindow struct {
	replies  int
	failures map[string]int
	gap      time.Duration
	// after and afterBroken are the replies to requests sent from the fault's end on
	// (those a resumed leader may have answered), and how many of them broke the
	// promise (checked against every reply of the run).
	after, afterBroken int
	// late is the replies to requests sent while the fault lasted and received after
	// its end: answers a paused process sent when it was continued, among others.
	late int
}

// window is what happened from..until (on the wall clock's monotonic reading); end is
// the fault's end.
func (m *monoLoad) window(from, end, until time.Time) monoWindow {
	f, e, u := m.at(from), m.at(end), m.at(until)
	m.mu.Lock()
	defer m.mu.Unlock()
	win := monoWindow{failures: map[string]int{}}
	var recvs []time.Duration
	for _, rep := range m.replies {
		if rep.recv >= f && rep.recv <= u {
			recvs = append(recvs, rep.recv)
		}
		if rep.sent >= e && rep.recv <= u {
			win.after++
		}
		if rep.sent >= f && rep.sent < e && rep.recv > e {
			win.late++
		}
	}
	for _, b := range brokenReplies(m.replies) {
		if rep := m.replies[b.Reply]; rep.sent >= e && rep.recv <= u {
			win.afterBroken++
		}
	}
	for _, fl := range m.failures {
		if fl.at >= f && fl.at <= u {
			win.failures["segment/"+monoTag+" "+fl.code]++
		}
	}
	slices.Sort(recvs)
	prev := f
	for _, r := range recvs {
		win.gap, prev = max(win.gap, r-prev), r
	}
	win.gap = max(win.gap, u-prev)
	win.replies = len(recvs)
	return win
}

// killMonoLeader kills the dispenser that leads monoTag with SIGKILL (its lease is not
// released) and starts it again after down, as a supervisor would. Another dispenser
// must serve the tag within 2 lease TTLs; no reply may break the promise.
func killMonoLeader(down time.Duration) fault {
	return fault{name: "kill -9 the leader of " + monoTag + ", restarted after " + down.String(), strict: true,
		monoBound: true, monoWindow: 2*monoLeaseTTL + 500*time.Millisecond,
		run: func(w *world) time.Time {
			nodes := w.running()
			leader, _ := w.waitMonoLeader(nodes)
			w.note("leader " + leader)
			n := w.proc(leader).node
			w.stop(leader, syscall.SIGKILL)
			time.Sleep(down)
			w.start(n)
			return time.Now()
		}}
}

// pauseMonoLeader stops the dispenser that leads monoTag with SIGSTOP past its lease
// (at least 2 TTLs, and until another dispenser leads the tag), then continues it. On
// resume its clock says its term is over: it must not serve the tag again without a new
// lease. Its stats are watched for 2 TTLs after SIGCONT: it may not report itself
// leader of the term it had, and the promise check covers every reply it answered.
func pauseMonoLeader() fault {
	return fault{name: "SIGSTOP the leader of " + monoTag + " past its lease until another leads, SIGCONT", strict: true,
		monoBound: true, monoWindow: 2*monoLeaseTTL + 500*time.Millisecond,
		run: func(w *world) time.Time {
			nodes := w.running()
			leader, terms := w.waitMonoLeader(nodes)
			w.signal(leader, syscall.SIGSTOP, false)
			stopped := time.Now()
			time.Sleep(2 * monoLeaseTTL)
			var others []string
			for _, n := range nodes {
				if n != leader {
					others = append(others, n)
				}
			}
			next := ""
			for next == "" && time.Since(stopped) < 4*monoLeaseTTL { // below the worker-ID lease
				next, _, _ = w.monoLeader(others)
			}
			w.signal(leader, syscall.SIGCONT, false)
			w.note(fmt.Sprintf("leader %s (term %d) paused %s; %q led meanwhile", leader, terms, time.Since(stopped).Round(time.Millisecond), next))
			if next == "" {
				w.mono.flag(fmt.Sprintf("no other dispenser led %s while %s was paused for %s", monoTag, leader, time.Since(stopped).Round(time.Millisecond)))
			}
			w.mono.watchResumed(w, leader, terms, nodes)
			return time.Now()
		}}
}

// sigtermMonoLeader stops the dispenser that leads monoTag with SIGTERM (it stops
// serving and writes a released record, so that the next leader need not wait out the
// lease) and starts it again. Its gap is held to the failover bound of 2 lease TTLs,
// over a window of 4: a handover that waited for the released record to expire (2
// TTLs) and then for a fenced start, as one did before the fix of tryAcquire, fails it.
func sigtermMonoLeader() fault {
	return fault{name: "SIGTERM the leader of " + monoTag + ", restarted", strict: true, monoBound: true, monoWindow: 4 * monoLeaseTTL,
		run: func(w *world) time.Time {
			leader, _ := w.waitMonoLeader(w.running())
			w.note("leader " + leader)
			n := w.proc(leader).node
			w.stop(leader, syscall.SIGTERM)
			w.start(n)
			return time.Now()
		}}
}

// watchResumed watches name's stats for 2 lease TTLs after it was continued: it may
// report itself leader of monoTag only under a term newer than old.
func (m *monoLoad) watchResumed(w *world, name string, old uint64, nodes []string) {
	m.checks.Add(1)
	go func() {
		defer m.checks.Done()
		answered := false
		for end := time.Now().Add(2 * monoLeaseTTL); time.Now().Before(end); {
			h, ok := w.probe(len(nodes), 300*time.Millisecond)[name]
			if !ok {
				continue
			}
			answered = true
			if h.mono.Role == "leader" && h.mono.Terms <= old {
				m.flag(fmt.Sprintf("%s, resumed, serves %s as leader of its old term %d (terms %d)", name, monoTag, old, h.mono.Terms))
				return
			}
			time.Sleep(50 * time.Millisecond)
		}
		if !answered {
			m.flag(fmt.Sprintf("%s did not answer $SRV.STATS within %s of SIGCONT", name, 2*monoLeaseTTL))
		}
	}()
}

// flag notes something the run must fail for.
func (m *monoLoad) flag(s string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.flagged = append(m.flagged, s)
}

// flags is what flag noted.
func (m *monoLoad) flags() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.flagged)
}

// badSamples are a few failures the tag may not give: an error code but 503, a wrong
// count.
func (m *monoLoad) badSamples() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.samples)
}

// failureCodes counts the failures of the whole run by code.
func (m *monoLoad) failureCodes() map[string]int {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := map[string]int{}
	for _, f := range m.failures {
		out["segment/"+monoTag+" "+f.code]++
	}
	return out
}

// judgeMono fails the test for what issue 15 does not allow: a reply that breaks the
// promise, an ID twice, an answer but IDs or 503, a resumed leader that served its old
// term, a failover slower than 2 lease TTLs.
func judgeMono(t *testing.T, rep report) {
	t.Helper()
	m := rep.mono
	if m.replies == 0 {
		t.Errorf("%s: no reply at all", monoTag)
	}
	// A reply whose own IDs do not increase fails wire.DecodeIDs in record: an answer
	// neither IDs nor 503, among the samples below.
	if m.dups > 0 || m.broken > 0 {
		t.Errorf("%s: %d IDs twice, %d of %d replies broke the monotonic promise; first ones:\n%s",
			monoTag, m.dups, m.broken, m.replies, strings.Join(m.examples, "\n"))
	}
	for _, s := range rep.monoSamples {
		t.Errorf("%s: an answer neither IDs nor 503: %s", monoTag, s)
	}
	for _, s := range rep.monoFlags {
		t.Errorf("%s: %s", monoTag, s)
	}
	for _, r := range rep.results {
		if r.monoBound && r.mono.gap > 2*monoLeaseTTL {
			t.Errorf("%s: %s answered no request for %s, want at most 2 x the lease TTL (%s)", r.name, monoTag, r.mono.gap.Round(time.Millisecond), 2*monoLeaseTTL)
		}
	}
}
