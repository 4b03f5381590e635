package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/leafbus/leafbus/dispenser"
	"github.com/leafbus/leafbus/internal/testutil"
	"github.com/leafbus/leafbus/testenv"
	"github.com/leafbus/leafbus/wire"
)

// The dispenser under hostile and careless clients, as its own process: slow senders
// and readers, a flood of connections on a low file limit, and a rogue $SRV / leaf.time
// responder with 10,000 fake dispensers. Each shows the bound holding and the node
// serving; each failed on main before issue 24 (the HTTP face answered 503 to everyone,
// the process ran out of descriptors, the node would not start).

// latencies asks url n times in a row on one keep-alive connection and returns each
// answer's time; any answer but 200, or none within 5 s, fails t.
func latencies(t *testing.T, url string, n int) []time.Duration {
	t.Helper()
	c := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 1}}
	defer c.CloseIdleConnections()
	out := make([]time.Duration, 0, n)
	for i := range n {
		start := time.Now()
		resp, err := c.Get(url)
		if err != nil {
			t.Fatalf("GET %s (%d of %d): %v", url, i+1, n, err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s (%d of %d): %d %q, want 200", url, i+1, n, resp.StatusCode, b)
		}
		out = append(out, time.Since(start))
	}
	return out
}

// quantiles is the p50, p99 and max of ds, for the log.
func quantiles(ds []time.Duration) string {
	s := slices.Clone(ds)
	slices.Sort(s)
	q := func(p float64) time.Duration { return s[min(len(s)-1, int(p*float64(len(s))))] }
	return fmt.Sprintf("p50 %v, p99 %v, max %v", q(0.5).Round(time.Microsecond), q(0.99).Round(time.Microsecond), s[len(s)-1].Round(time.Microsecond))
}

// tinyDialer's connections have a receive buffer as small as the kernel allows, so that
// an answer they do not read blocks the server's write soon.
var tinyDialer = net.Dialer{Timeout: 5 * time.Second, Control: func(_, _ string, rc syscall.RawConn) error {
	var serr error
	err := rc.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 1024) })
	if err != nil {
		return err
	}
	return serr
}}

// httpIDsIssued is the IDs the dispenser at url has issued over HTTP, from /metrics.
func httpIDsIssued(t *testing.T, url string) float64 {
	t.Helper()
	fam := testutil.Scrape(t, url+"/metrics")["leafbus_ids_issued_total"]
	total := 0.0
	for _, m := range fam.GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == "transport" && l.GetValue() == "http" {
				total += m.GetCounter().GetValue()
			}
		}
	}
	return total
}

// TestBinarySlowClients: 1,000 slow clients (900 sending a form body a byte a second,
// connecting again when cut off; 100 asking for 10,000 IDs forty times in a row and
// reading nothing) leave the HTTP face answering everyone else: the API, /, /metrics
// and /readyz answer 200 while they hold on. On main, 260 slow bodies made them answer
// 503 for 22 of 25 s.
func TestBinarySlowClients(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	httpAddr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	b := startBinary(t, t.TempDir(), "--http", httpAddr)
	url := "http://" + httpAddr
	api := url + "/api/segment/get/" + dispenser.SampleTagName
	before := latencies(t, api, 300)
	rssBefore := rssMB(t, b.cmd.Process.Pid)

	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	var cuts atomic.Int64 // slow senders the server cut off
	for range 900 {
		wg.Go(func() {
			for ctx.Err() == nil {
				c, err := net.DialTimeout("tcp", httpAddr, 5*time.Second)
				if err != nil {
					continue
				}
				io.WriteString(c, "POST /api/segment/get/"+dispenser.SampleTagName+" HTTP/1.1\r\nHost: leaf\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: 100\r\n\r\nc")
				for sent := false; ; sent = true {
					select {
					case <-ctx.Done():
					case <-time.After(time.Second):
						if _, err := c.Write([]byte("o")); err == nil {
							continue
						}
						if sent {
							cuts.Add(1)
						}
					}
					break
				}
				c.Close()
			}
		})
	}
	pipelined := strings.Repeat("GET /api/segment/get/"+dispenser.SampleTagName+"?count=10000 HTTP/1.1\r\nHost: leaf\r\n\r\n", 40)
	for i := range 100 {
		c, err := tinyDialer.Dial("tcp", httpAddr)
		if err != nil {
			t.Fatalf("slow reader %d: %v", i, err)
		}
		t.Cleanup(func() { c.Close() })
		io.WriteString(c, pipelined)
	}
	// The slow readers are stuck once the IDs issued over HTTP stop growing: each has
	// an answer the server cannot write.
	var last float64
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(500 * time.Millisecond) {
		n := httpIDsIssued(t, url)
		if n == last && n >= 100*10_000 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the slow readers still got answers after 30s (%v IDs issued over HTTP)", n)
		}
		last = n
	}
	during := latencies(t, api, 300)
	for _, page := range []string{"/", "/metrics", "/readyz"} {
		latencies(t, url+page, 1)
	}
	rssDuring := rssMB(t, b.cmd.Process.Pid)
	t.Logf("single IDs over HTTP, 300 in a row on one connection: before %s; beside 1,000 slow clients %s", quantiles(before), quantiles(during))
	t.Logf("dispenser RSS: %.0f MB before, %.0f MB beside the slow clients; %d slow senders cut off by the body timeout so far", rssBefore, rssDuring, cuts.Load())
	if strings.Contains(b.stderr.String(), "too many open files") {
		t.Errorf("the dispenser ran out of descriptors:\n%s", b.stderr.String())
	}
}

// TestBinaryConnectionFlood: 10,000 keep-alive connections against a dispenser whose
// open file limit is 2,048. The HTTP face holds at most 1,024 of them (the rest of the
// descriptors are kept), closes the idle ones for newcomers, and says so in one log
// line; meanwhile NATS clients connect and get IDs, HTTP clients get answers, and the
// heartbeat goes on writing the cache file. On main, 4,500 connections took the last
// descriptor of a 4,096 limit: new NATS clients timed out and the cache file's writes
// failed.
func TestBinaryConnectionFlood(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	httpAddr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	dataDir := t.TempDir()
	b := startBinaryLimited(t, dataDir, 2048, "--http", httpAddr)
	// The ready line comes on stdout: stderr's lines before it may still be on their way
	// through the pipe into b.stderr.
	b.stderr.WaitLine(t, 20*time.Second, "--http-max-conns 4096 lowered to 1024: the open file limit is 2048")
	rssBefore := rssMB(t, b.cmd.Process.Pid)
	cache := filepath.Join(dataDir, "leaf-workerid-bin-test.json") // the worker-ID cache file (--node-id bin-test)
	if _, err := os.Stat(cache); err != nil {
		matches, _ := filepath.Glob(filepath.Join(dataDir, "*"))
		t.Fatalf("the cache file: %v (the data dir holds %v)", err, matches)
	}

	var conns []net.Conn
	t.Cleanup(func() {
		for _, c := range conns {
			c.Close()
		}
	})
	failed := 0
	start := time.Now()
	for range 10_000 {
		c, err := net.DialTimeout("tcp", httpAddr, 2*time.Second)
		if err != nil {
			failed++
			continue
		}
		conns = append(conns, c)
		io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: leaf\r\n\r\n") // then idle, kept alive
	}
	t.Logf("10,000 connections opened in %v (%d dials failed)", time.Since(start).Round(time.Millisecond), failed)

	// NATS: a new client connects to the embedded server and gets an ID.
	nc, err := nats.Connect(b.url, nats.Timeout(5*time.Second))
	if err != nil {
		t.Fatalf("a new NATS client beside 10,000 HTTP connections: %v\nstderr:\n%s", err, b.stderr.String())
	}
	defer nc.Close()
	if m, err := nc.Request("leaf.segment."+dispenser.SampleTagName, nil, 5*time.Second); err != nil {
		t.Fatalf("an ID over NATS beside 10,000 HTTP connections: %v", err)
	} else if _, err := strconv.ParseInt(string(m.Data), 10, 64); err != nil {
		t.Fatalf("an ID over NATS: %q", m.Data)
	}
	// HTTP: a client that wants an answer gets one.
	during := latencies(t, "http://"+httpAddr+"/api/segment/get/"+dispenser.SampleTagName, 50)
	t.Logf("single IDs over HTTP after the flood: %s", quantiles(during))
	// The heartbeat writes the cache file every beat (3 s).
	st, err := os.Stat(cache)
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		now, err := os.Stat(cache)
		if err == nil && now.ModTime().After(st.ModTime()) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the cache file was not written again within 15s of the flood\nstderr:\n%s", b.stderr.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	rss := rssMB(t, b.cmd.Process.Pid)
	t.Logf("dispenser RSS: %.0f MB before, %.0f MB after 10,000 connections", rssBefore, rss)
	if rss > 160 {
		t.Errorf("RSS %.0f MB after 10,000 connections at a cap of 1,024, want it bounded by the cap (about 30 + 1,024 x 20 KB)", rss)
	}
	// The cap's line was written when the 1,025th connection was accepted, before the
	// answers above; it may still be on its way through the pipe.
	b.stderr.WaitLine(t, 20*time.Second, "the cap (--http-max-conns)")
	logs := b.stderr.String()
	if strings.Contains(logs, "too many open files") {
		t.Errorf("the dispenser ran out of descriptors:\n%s", logs)
	}
	if n := strings.Count(logs, "the cap (--http-max-conns)"); n != 1 {
		t.Errorf("%d lines about the connection cap, want 1 (then at most one a minute)", n)
	}
}

// TestBinaryRogueResponders: a rogue on the deployment's NATS answers $SRV.INFO.leaf as
// 10,000 fake dispensers whose worker-ID range overlaps this node's (some with 20 KB
// node IDs), and leaf.time 10,000 times with a clock an hour ahead, from node IDs no
// dispenser has. A fresh dispenser still starts (its clock check counts only dispensers
// of the service), warns about the fakes' range in one line, and its status page stays
// small. On main it refused to start (the mean of the fakes' clocks was an hour off),
// and each range check wrote 10,000 warnings.
func TestBinaryRogueResponders(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	ns := testenv.StartNATS(t)
	// The fakes answer each ask at once, as 10,000 dispensers would, not after the
	// 10,000 answers to the ask before (a subscription's handler runs one message at a
	// time): on a busy machine those took longer than the range check's 2 s window. The
	// answering ends when the rogue's connection closes, before this wait; busy counts
	// the asks being answered.
	var answering sync.WaitGroup
	t.Cleanup(answering.Wait)
	var busy atomic.Int64
	rogue := ns.Connect(t, nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
	long := strings.Repeat("n", 20<<10)
	info, err := rogue.Subscribe("$SRV.INFO.leaf", func(m *nats.Msg) {
		busy.Add(1)
		answering.Go(func() {
			defer busy.Add(-1)
			for i := range 10_000 {
				node := fmt.Sprintf("ghost-%d", i)
				if i%100 == 0 {
					node += long
				}
				if rogue.Publish(m.Reply, fmt.Appendf(nil, `{"name":"leaf","id":"fake%d","version":"9.9.9","metadata":{"node_id":%q,"worker_id":"%d","worker_id_min":"0","worker_id_max":"1023"}}`, i, node, 600+i%400)) != nil {
					return
				}
			}
		})
	})
	if err != nil {
		t.Fatal(err)
	}
	defer info.Unsubscribe()
	clock, err := rogue.Subscribe("leaf.time", func(m *nats.Msg) {
		busy.Add(1)
		defer busy.Add(-1)
		body := strconv.AppendInt(nil, time.Now().Add(time.Hour).UnixMilli(), 10)
		for i := range 10_000 {
			reply := nats.NewMsg(m.Reply)
			reply.Header.Set(wire.NodeIDHeader, fmt.Sprintf("clock-%d", i))
			reply.Data = body
			_ = rogue.PublishMsg(reply)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	defer clock.Unsubscribe()
	if err := rogue.Flush(); err != nil {
		t.Fatal(err)
	}

	httpAddr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
	b := startBinary(t, t.TempDir(), "--nats", ns.URL(), "--http", httpAddr, "--worker-id-min", "0", "--worker-id-max", "511")
	// The start's range check has run once the warning is there (a check every 30 s:
	// the bound is for the first, with room for the start's own asks before it).
	b.stderr.WaitLine(t, 45*time.Second, "worker-ID range conflicts")
	// The page's discovery ends 100 ms after this node's own answer: on a busy machine
	// the fakes must not still be answering the start's asks when it asks.
	testutil.Eventually(t, time.Minute, "the rogue done answering the start's asks", func() bool { return busy.Load() == 0 })
	rssBefore := rssMB(t, b.cmd.Process.Pid)
	url := "http://" + httpAddr
	var pageBytes int
	first := time.Now()
	latencies(t, url+"/", 1) // the first load asks the dispensers
	firstLoad := time.Since(first)
	start := time.Now()
	for range 20 {
		resp, err := http.Get(url + "/")
		if err != nil {
			t.Fatalf("the status page beside 10,000 fakes: %v", err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("the status page beside 10,000 fakes: %d", resp.StatusCode)
		}
		pageBytes = len(body)
		if !strings.Contains(string(body), "listed: this node and the first by node ID") {
			t.Fatalf("the status page does not say it lists only some of the dispensers found:\n%.3000s", body)
		}
	}
	pageTime := time.Since(start) / 20
	rss := rssMB(t, b.cmd.Process.Pid)
	if pageBytes > 200<<10 {
		t.Errorf("the status page is %d bytes beside 10,000 fakes, want it bounded (100 dispensers listed)", pageBytes)
	}
	latencies(t, url+"/readyz", 1)
	nc, err := nats.Connect(ns.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if _, err := nc.Request("leaf.segment."+dispenser.SampleTagName, nil, 5*time.Second); err != nil {
		t.Fatalf("an ID over NATS beside the rogue: %v", err)
	}
	logs := b.stderr.String()
	warnings := strings.Count(logs, "worker-ID range conflicts")
	longest := 0
	for l := range strings.SplitSeq(logs, "\n") {
		if strings.Contains(l, "worker-ID range conflicts") {
			longest = max(longest, len(l))
		}
	}
	t.Logf("beside 10,000 fake dispensers: %d range warning lines (longest %d bytes), status page %d bytes, the first load in %v and %v a load after, RSS %.0f MB before the page loads and %.0f MB after 21",
		warnings, longest, pageBytes, firstLoad.Round(time.Millisecond), pageTime.Round(time.Millisecond), rssBefore, rss)
	if warnings > 17 || longest > 4000 {
		t.Errorf("%d range warning lines, the longest %d bytes: want at most 16 and a summary, each short", warnings, longest)
	}
	if !strings.Contains(logs, "peer time check") {
		t.Errorf("no line from the peer time check in:\n%s", logs)
	}
	r := bufio.NewScanner(strings.NewReader(logs))
	for r.Scan() {
		if strings.Contains(r.Text(), "peer time check") {
			t.Logf("%s", r.Text())
		}
	}
}
