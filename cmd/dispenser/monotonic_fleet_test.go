package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/leafbus/leafbus/client"
	"github.com/leafbus/leafbus/internal/testutil"
	"github.com/leafbus/leafbus/testenv"
	"github.com/leafbus/leafbus/wire"
)

// Monotonic tags across a fleet of real dispenser processes (issues 21 and 24): three
// binaries on one NATS server, clients through the hedging client, every reply checked
// against every reply received before its request was sent.

// fleet is n dispenser processes on one NATS server.
type fleet struct {
	t     *testing.T
	nats  *testenv.NATS
	nc    *nats.Conn
	js    jetstream.JetStream
	admin *client.Client
	procs map[string]*process
	dirs  map[string]string
	args  []string
}

// startFleet starts n dispensers (m1..mn) with args on a NATS server of their own.
func startFleet(t *testing.T, n int, args ...string) *fleet {
	t.Helper()
	if testing.Short() {
		t.Skip("builds the binary")
	}
	f := &fleet{t: t, nats: testenv.StartNATS(t), procs: map[string]*process{}, dirs: map[string]string{}, args: args}
	f.nc = f.nats.Connect(t)
	var err error
	if f.js, err = jetstream.New(f.nc); err != nil {
		t.Fatal(err)
	}
	if f.admin, err = client.NewClient(f.nc, client.WithTimeout(20*time.Second)); err != nil {
		t.Fatal(err)
	}
	for i := range n {
		f.start(fmt.Sprintf("m%d", i+1))
	}
	return f
}

// start starts dispenser name, on its data dir of any earlier start.
func (f *fleet) start(name string) *process {
	f.t.Helper()
	if f.dirs[name] == "" {
		f.dirs[name] = f.t.TempDir()
	}
	args := append([]string{"--nats", f.nats.URL(), "--data-dir", f.dirs[name], "--node-id", name, "--http", "", "--sample-tag=false"}, f.args...)
	p := startProcess(f.t, args...)
	f.procs[name] = p
	return p
}

// startProcess runs the compiled dispenser with exactly args and waits for its ready
// line (startBinary, without the embedded server's --listen).
func startProcess(t testing.TB, args ...string) *process {
	t.Helper()
	bin, err := buildDispenser()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	p := &process{cmd: cmd, stderr: &testutil.SyncBuffer{}, done: make(chan error, 1)}
	cmd.Stderr = p.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ready := make(chan struct{})
	go func() {
		sc := bufio.NewScanner(stdout)
		once := sync.Once{}
		for sc.Scan() {
			if strings.Contains(sc.Text(), "req leaf.segment.") {
				once.Do(func() { close(ready) })
			}
		}
	}()
	go func() { p.done <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		err := <-p.done
		p.done <- err
		if t.Failed() {
			t.Logf("%v log:\n%s", args, p.stderr.String())
		}
	})
	select {
	case <-ready:
	case err := <-p.done:
		p.done <- err
		t.Fatalf("dispenser %v exited before it was ready: %v\nstderr:\n%s", args, err, p.stderr.String())
	case <-time.After(60 * time.Second):
		t.Fatalf("dispenser %v not ready within 60s\nstderr:\n%s", args, p.stderr.String())
	}
	return p
}

// stop stops dispenser name with SIGTERM and waits for its exit.
func (f *fleet) stop(name string) {
	f.t.Helper()
	p := f.procs[name]
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		f.t.Fatal(err)
	}
	select {
	case err := <-p.done:
		p.done <- err
	case <-time.After(30 * time.Second):
		f.t.Fatalf("%s did not exit within 30s of SIGTERM", name)
	}
}

// addMonotonic adds tag, marked monotonic, through the admin API.
func (f *fleet) addMonotonic(tag string, step int64) {
	f.t.Helper()
	on := true
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	info, err := f.admin.AddTag(ctx, wire.AddTagRequest{Tag: tag, Step: &step, Monotonic: &on})
	if err != nil || !info.Monotonic {
		f.t.Fatalf("add monotonic tag %s = %+v, %v", tag, info, err)
	}
}

// leader waits until tag's lease record names a live leader and returns its node.
func (f *fleet) leader(tag string, within time.Duration) string {
	f.t.Helper()
	var node string
	testutil.Eventually(f.t, within, "a leader of "+tag, func() bool {
		kv, err := f.js.KeyValue(context.Background(), "leaf_leaders")
		if err != nil {
			return false
		}
		e, err := kv.Get(context.Background(), tag)
		if err != nil {
			return false
		}
		var rec struct {
			Node     string `json:"node"`
			Released bool   `json:"released"`
		}
		if json.Unmarshal(e.Value(), &rec) != nil || rec.Released || f.procs[rec.Node] == nil {
			return false
		}
		node = rec.Node
		return true
	})
	return node
}

// monoLoad is clients taking IDs of one monotonic tag through the hedging client,
// each reply recorded with when its request was sent and its answer received.
type monoLoad struct {
	start time.Time
	tag   string

	mu       sync.Mutex
	replies  []testutil.Reply
	ids      []int64
	failures map[string]int
	lastErr  map[string]string
	failedAt []time.Duration

	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// startMonoLoad runs workers goroutines over conns (one hedging client each), asking
// for 1 to 5 IDs of tag in a loop; the client waits up to timeout for an answer.
func startMonoLoad(t *testing.T, conns []*nats.Conn, tag string, workers int, timeout time.Duration) *monoLoad {
	t.Helper()
	l := &monoLoad{start: time.Now(), tag: tag, failures: map[string]int{}, lastErr: map[string]string{}}
	ctx, cancel := context.WithCancel(context.Background())
	l.cancel = cancel
	for w := range workers {
		c, err := client.NewClient(conns[w%len(conns)], client.WithTimeout(timeout))
		if err != nil {
			t.Fatal(err)
		}
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			rng := rand.New(rand.NewPCG(uint64(w), 21))
			for ctx.Err() == nil {
				n := 1
				if rng.IntN(4) == 0 {
					n = 1 + rng.IntN(5)
				}
				sent := time.Since(l.start)
				ids, err := c.SegmentN(context.Background(), tag, n)
				recv := time.Since(l.start)
				l.record(sent, recv, ids, err)
				if err != nil {
					time.Sleep(5 * time.Millisecond)
				}
			}
		}()
	}
	return l
}

func (l *monoLoad) record(sent, recv time.Duration, ids []int64, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err != nil {
		kind := "other"
		switch {
		case errors.Is(err, wire.ErrUnavailable):
			kind = "503"
		case errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout):
			kind = "timeout"
		}
		l.failures[kind]++
		l.lastErr[kind] = err.Error()
		l.failedAt = append(l.failedAt, recv)
		return
	}
	l.replies = append(l.replies, testutil.Reply{First: ids[0], Last: ids[len(ids)-1], Sent: sent, Recv: recv})
	l.ids = append(l.ids, ids...)
}

// since is now on the load's clock.
func (l *monoLoad) since() time.Duration { return time.Since(l.start) }

// stop ends the load and waits for its clients.
func (l *monoLoad) stop() {
	l.cancel()
	l.wg.Wait()
}

// check fails t on an ID handed out twice or a reply not above every reply received
// before its request was sent, and returns the replies checked.
func (l *monoLoad) check(t *testing.T) int {
	t.Helper()
	l.mu.Lock()
	defer l.mu.Unlock()
	dups := testutil.Duplicates(l.ids)
	bad := testutil.BrokenPromises(l.replies)
	if len(dups) > 0 || len(bad) > 0 {
		var ex []string
		for _, b := range bad[:min(len(bad), 5)] {
			r := l.replies[b.Reply]
			ex = append(ex, fmt.Sprintf("reply [%d..%d] sent %v, received %v, is not above ID %d received before it was sent", r.First, r.Last, r.Sent, r.Recv, b.Above))
		}
		t.Fatalf("%d IDs handed out twice (first %v), %d of %d replies out of order:\n%s",
			len(dups), dups[:min(len(dups), 5)], len(bad), len(l.replies), strings.Join(ex, "\n"))
	}
	return len(l.replies)
}

// summary says how many replies and failures there were.
func (l *monoLoad) summary() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	var b strings.Builder
	fmt.Fprintf(&b, "%d replies, %d IDs", len(l.replies), len(l.ids))
	for kind, n := range l.failures {
		fmt.Fprintf(&b, "; %d %s (last: %s)", n, kind, l.lastErr[kind])
	}
	return b.String()
}

// failed is how many requests got no IDs.
func (l *monoLoad) failed() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, k := range l.failures {
		n += k
	}
	return n
}

// waitReplies waits until n requests sent at or after at were answered with IDs, and
// fails t when that takes longer than within: the tests below go on when the fleet has
// served, never after a fixed time that a busy machine could make too short.
func (l *monoLoad) waitReplies(t *testing.T, at time.Duration, n int, within time.Duration) {
	t.Helper()
	testutil.Eventually(t, within, fmt.Sprintf("%d replies to requests sent after %v", n, at), func() bool {
		l.mu.Lock()
		defer l.mu.Unlock()
		got := 0
		for _, r := range l.replies {
			if r.Sent >= at {
				got++
			}
		}
		return got >= n
	})
}

// firstAfter is when the first request sent at or after at was answered with IDs.
func (l *monoLoad) firstAfter(at time.Duration) (time.Duration, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	first, ok := time.Duration(0), false
	for _, r := range l.replies {
		if r.Sent >= at && (!ok || r.Recv < first) {
			first, ok = r.Recv, true
		}
	}
	return first, ok
}

// longestGap is the longest time from at on without an answer with IDs.
func (l *monoLoad) longestGap(at, until time.Duration) time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	var recvs []time.Duration
	for _, r := range l.replies {
		if r.Recv >= at && r.Recv <= until {
			recvs = append(recvs, r.Recv)
		}
	}
	slices.Sort(recvs)
	longest, prev := time.Duration(0), at
	for _, recv := range append(recvs, until) {
		longest, prev = max(longest, recv-prev), recv
	}
	return longest
}

// conns opens n client connections to the fleet's NATS server.
func (f *fleet) conns(n int) []*nats.Conn {
	var out []*nats.Conn
	for range n {
		out = append(out, f.nats.Connect(f.t))
	}
	return out
}

// TestBinaryMonotonicMarksLost is issue 21's lost-marks scenario: three dispensers, a
// monotonic tag under load, the <prefix>_tagopts bucket deleted, one dispenser
// restarted. No reply is out of order or repeats an ID (the restarted one remembers the
// tag in its data dir, and another leads it under a live lease), and `tag list` still
// shows the tag monotonic (the marks are written back).
func TestBinaryMonotonicMarksLost(t *testing.T) {
	f := startFleet(t, 3, "--monotonic-lease-ttl", "2s")
	f.addMonotonic("ordered", 20)
	leader := f.leader("ordered", 20*time.Second)
	load := startMonoLoad(t, f.conns(3), "ordered", 12, 10*time.Second)
	load.waitReplies(t, 0, 100, 20*time.Second)

	if err := f.js.DeleteKeyValue(context.Background(), "leaf_tagopts"); err != nil {
		t.Fatal(err)
	}
	restarted := "m1"
	if leader == restarted {
		restarted = "m2"
	}
	f.stop(restarted)
	f.start(restarted)
	load.waitReplies(t, load.since(), 200, 20*time.Second)
	load.stop()
	t.Log(load.summary())
	if n := load.check(t); n < 200 {
		t.Fatalf("only %d replies", n)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	tags, err := f.admin.Tags(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, info := range tags {
		if info.Tag == "ordered" && !info.Monotonic {
			t.Fatalf("tag list after the marks bucket was lost: %+v; want ordered monotonic", info)
		}
	}
	if !slices.ContainsFunc(tags, func(i wire.TagInfo) bool { return i.Tag == "ordered" }) {
		t.Fatalf("tag list %+v has no ordered", tags)
	}
	opts, err := f.js.KeyValue(ctx, "leaf_tagopts")
	if err != nil {
		t.Fatal(err)
	}
	if e, err := opts.Get(ctx, "ordered"); err != nil || !strings.Contains(string(e.Value()), `"monotonic":true`) {
		t.Fatalf("the mark is not back in leaf_tagopts: %v", err)
	}
}

// forgedLeader writes a lease record for a tag over whatever is there, again and
// again, naming an inbox of its own with a ttl_ms of an hour; the inbox answers every
// forwarded message with the same low IDs. It answers no $SRV.
type forgedLeader struct {
	sub      *nats.Subscription
	answered atomic.Int64
	stop     chan struct{}
	done     sync.WaitGroup
}

func startForgedLeader(t *testing.T, f *fleet, tag string, every time.Duration) *forgedLeader {
	t.Helper()
	nc := f.nats.Connect(t)
	kv, err := f.js.KeyValue(context.Background(), "leaf_leaders")
	if err != nil {
		t.Fatal(err)
	}
	fl := &forgedLeader{stop: make(chan struct{})}
	inbox := nc.NewInbox()
	fl.sub, err = nc.Subscribe(inbox, func(m *nats.Msg) {
		total := 0
		for field := range strings.FieldsSeq(string(m.Data)) {
			var n int
			fmt.Sscan(field, &n)
			total += n
		}
		ids := make([]int64, total)
		for i := range ids {
			ids[i] = int64(i + 1)
		}
		fl.answered.Add(1)
		_ = m.Respond(wire.AppendIDs(nil, ids, wire.Binary))
	})
	if err != nil {
		t.Fatal(err)
	}
	rec, _ := json.Marshal(map[string]any{"node": "forger", "instance": "FORGED", "subject": inbox, "ttl_ms": time.Hour.Milliseconds()})
	fl.done.Add(1)
	go func() {
		defer fl.done.Done()
		tick := time.NewTicker(every)
		defer tick.Stop()
		for {
			_, _ = kv.Put(context.Background(), tag, rec)
			select {
			case <-fl.stop:
				return
			case <-tick.C:
			}
		}
	}()
	return fl
}

func (fl *forgedLeader) leave() {
	close(fl.stop)
	fl.done.Wait()
	_ = fl.sub.Unsubscribe()
}

// TestBinaryMonotonicForgedLeader is issue 21's forged-record scenario: under load, a
// lease record naming a fake inbox that answers overlapping IDs, with a ttl_ms of an
// hour, is written over the leader's for 3 s. No reply repeats an ID or is out of
// order, and once the forger leaves the tag is served again within about one of the
// dispensers' own lease TTLs (2 s), not the record's hour.
func TestBinaryMonotonicForgedLeader(t *testing.T) {
	const ttl = 2 * time.Second
	f := startFleet(t, 3, "--monotonic-lease-ttl", ttl.String())
	f.addMonotonic("ordered", 20)
	f.leader("ordered", 20*time.Second)
	load := startMonoLoad(t, f.conns(3), "ordered", 12, 3*time.Second)
	load.waitReplies(t, 0, 100, 20*time.Second)
	forger := startForgedLeader(t, f, "ordered", 300*time.Millisecond)
	time.Sleep(3 * time.Second)
	forger.leave()
	left := load.since()
	load.waitReplies(t, left, 100, 3*ttl)
	load.stop()
	t.Log(load.summary())
	load.check(t)
	back, ok := load.firstAfter(left)
	if !ok {
		t.Fatalf("no answer after the forger left: %s", load.summary())
	}
	t.Logf("served again %v after the forger left (lease TTL %v); its inbox was asked %d times", back-left, ttl, forger.answered.Load())
	if back-left > ttl+ttl/2 {
		t.Fatalf("served again %v after the forger left; want about one lease TTL (%v)", back-left, ttl)
	}
	if n := forger.answered.Load(); n != 0 {
		t.Errorf("requests were forwarded to the forged record's inbox %d times: it names no live dispenser", n)
	}
}

// TestBinaryMonotonicFreshTagUnderLoad: a tag added monotonic and used at once, under
// load from the moment the add was answered, with the default lease TTL (6 s): no
// request fails (issue 24: today's main answers 503 for the first 3 s, half a lease,
// "once the previous leader's lease is surely over", though there never was one).
func TestBinaryMonotonicFreshTagUnderLoad(t *testing.T) {
	f := startFleet(t, 3)
	conns := f.conns(3)
	added := time.Now()
	f.addMonotonic("fresh", 20)
	t.Logf("add answered in %v", time.Since(added).Round(time.Millisecond))
	load := startMonoLoad(t, conns, "fresh", 12, 10*time.Second)
	load.waitReplies(t, 0, 300, 20*time.Second)
	load.stop()
	t.Log(load.summary())
	load.check(t)
	if n := load.failed(); n > 0 {
		t.Fatalf("%d requests of a fresh monotonic tag failed: %s", n, load.summary())
	}
	first, _ := load.firstAfter(0)
	t.Logf("first reply %v after the add was answered", first)
}

// TestBinaryMonotonicLeaderKill9 is issue 24's hand-over under load: the leader process
// of a monotonic tag is killed with SIGKILL (no release). Requests that find no leader
// wait for the next one (within the 2 s wait bound) instead of getting 503, and the
// hedging client resends what the killed process held: no request fails. The longest
// time without a reply is logged.
func TestBinaryMonotonicLeaderKill9(t *testing.T) {
	const ttl = 2 * time.Second
	f := startFleet(t, 3, "--monotonic-lease-ttl", ttl.String())
	f.addMonotonic("ordered", 20)
	leader := f.leader("ordered", 20*time.Second)
	load := startMonoLoad(t, f.conns(3), "ordered", 12, 10*time.Second)
	load.waitReplies(t, 0, 100, 20*time.Second)
	killed := load.since()
	if err := f.procs[leader].cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	load.waitReplies(t, killed, 200, 6*ttl)
	end := load.since()
	load.stop()
	t.Log(load.summary())
	load.check(t)
	next := f.leader("ordered", 10*time.Second)
	back, ok := load.firstAfter(killed)
	if !ok {
		t.Fatalf("no answer after the kill: %s", load.summary())
	}
	gap := load.longestGap(killed, end)
	t.Logf("leader %s killed; %s leads; first reply to a request sent after the kill %v later; longest time without a reply %v (lease TTL %v)",
		leader, next, back-killed, gap, ttl)
	if n := load.failed(); n > 0 {
		t.Fatalf("%d requests failed through the leader's kill -9: %s", n, load.summary())
	}
}
