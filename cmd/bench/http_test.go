package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leafbus/leafbus/wire"
)

// fakeLeaf answers Leaf's HTTP API from one counter, with faults at given request
// numbers (1-based; 0 never): a reply repeating the previous reply's last ID, an error
// status, and a request held until the client gives up.
type fakeLeaf struct {
	leafFaults

	mu       sync.Mutex
	next     int64
	requests int
	paths    map[string]int
}

type leafFaults struct{ dupAt, errAt, holdAt int }

func (f *fakeLeaf) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	f.requests++
	k := f.requests
	f.paths[r.URL.Path]++
	count := 1
	if c := r.URL.Query().Get("count"); c != "" {
		count, _ = strconv.Atoi(c)
	}
	start := f.next
	if k == f.dupAt {
		start--
	}
	f.next = max(f.next, start+int64(count))
	f.mu.Unlock()
	switch k {
	case f.errAt:
		http.Error(w, "planted error", http.StatusServiceUnavailable)
		return
	case f.holdAt:
		<-r.Context().Done()
		return
	}
	var b []byte
	for i := range count {
		if i > 0 {
			b = append(b, '\n')
		}
		b = strconv.AppendInt(b, start+int64(i), 10)
	}
	w.Write(b)
}

func startFakeLeaf(tb testing.TB, f *fakeLeaf) string {
	tb.Helper()
	f.next, f.paths = 1000, map[string]int{}
	srv := httptest.NewServer(f)
	tb.Cleanup(srv.Close)
	return srv.URL
}

// TestRunHTTP: --http drives Leaf's API with the same loops, counts and checks as NATS:
// every request sent once, an error status counted by its code, a planted duplicate
// found, a held request counted as a timeout, round robin over the tags' paths.
func TestRunHTTP(t *testing.T) {
	for _, tt := range []struct {
		name  string
		setup func(c *Config)
		fake  leafFaults
		want  map[string]int64
	}{
		{"ClosedLoop", func(c *Config) { c.Clients, c.Inflight, c.Batch = 2, 4, 3 },
			leafFaults{dupAt: 10, errAt: 20}, map[string]int64{"503": 1}},
		{"OpenLoopSnowflakeTwoTagsTimeout", func(c *Config) {
			// The held request costs one timeout of waiting. In open loop a reply later
			// than the timeout after its due time is a timeout too, so 5 s leaves room for
			// a starved machine under -race (2 s saw a second timeout at load average 17).
			c.Clients, c.Rate, c.Inflight, c.Tags, c.Timeout = 2, 400, 1, []string{"a", "b"}, 5*time.Second
			c.Kind = wire.Snowflake // one ID space over both tags: the planted repeat is a duplicate
		}, leafFaults{dupAt: 10, errAt: 20, holdAt: 30}, map[string]int64{"503": 1, "timeout": 1}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			fake := &fakeLeaf{leafFaults: tt.fake}
			cfg := defaultConfig()
			cfg.HTTP = startFakeLeaf(t, fake)
			cfg.Warmup, cfg.Duration, cfg.Requests, cfg.Check = 0, 0, 200, true
			tt.setup(&cfg)
			rep := runBounded(t, cfg)
			d := rep.Dispenser
			var errs int64
			for k, want := range tt.want {
				if d.Errors[k] != want {
					t.Errorf("errors[%q] = %d, want %d (all: %v, samples %v)", k, d.Errors[k], want, d.Errors, d.ErrorSamples)
				}
				errs += want
			}
			if t.Failed() {
				fake.mu.Lock()
				t.Logf("the server saw %d requests", fake.requests)
				fake.mu.Unlock()
			}
			if len(d.Errors) != len(tt.want) || d.Sent != 200 || d.OK != 200-errs || d.IDs != d.OK*int64(cfg.Batch) {
				t.Errorf("sent %d ok %d IDs %d errors %v; want 200 sent, %d good of %d IDs each", d.Sent, d.OK, d.IDs, d.Errors, 200-errs, cfg.Batch)
			}
			if rep.Check == nil || rep.Check.Duplicates != 1 || !rep.Failed() {
				t.Errorf("check %+v, Failed %v; want the planted duplicate found", rep.Check, rep.Failed())
			}
			if rep.Transport != "http" || rep.Target != cfg.HTTP {
				t.Errorf("report transport %q target %q, want http %s", rep.Transport, rep.Target, cfg.HTTP)
			}
			fake.mu.Lock()
			defer fake.mu.Unlock()
			for _, tag := range cfg.Tags {
				path := "/api/" + cfg.Kind.String() + "/get/" + tag
				if n := fake.paths[path]; n < 200/len(cfg.Tags)-1 {
					t.Errorf("GET %s %d times, want round robin over %d tags (paths %v)", path, n, len(cfg.Tags), fake.paths)
				}
			}
		})
	}
}

// TestRunHTTPNoServer: nothing listening is a transport error per request, not a
// failed run.
func TestRunHTTPNoServer(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	url := srv.URL
	srv.Close()
	cfg := defaultConfig()
	cfg.HTTP, cfg.Warmup, cfg.Duration, cfg.Requests = url, 0, 0, 20
	rep := runBounded(t, cfg)
	if rep.Dispenser.Errors[errKeyTransport] != 20 || rep.Dispenser.OK != 0 {
		t.Fatalf("no server: errors %v ok %d, want 20 %s", rep.Dispenser.Errors, rep.Dispenser.OK, errKeyTransport)
	}
}

// TestBenchCommandHTTP: the command with --http prints the JSON report of the HTTP run.
func TestBenchCommandHTTP(t *testing.T) {
	url := startFakeLeaf(t, &fakeLeaf{})
	var stdout, stderr bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	args := []string{"--http", url, "--kind", "snowflake", "--requests", "100", "--warmup", "0", "--check", "--json"}
	if code := bench(ctx, args, &stdout, &stderr, false); code != exitOK {
		t.Fatalf("bench %v = exit %d, want 0:\n%s%s", args, code, stdout.String(), stderr.String())
	}
	var rep Report
	if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil || rep.Transport != "http" || rep.Dispenser.OK != 100 {
		t.Fatalf("report %+v (%v): want 100 good replies over http", rep, err)
	}
}

func TestLeafURL(t *testing.T) {
	for _, tt := range []struct {
		base string
		kind wire.Kind
		tag  string
		n    int
		want string
	}{
		{"http://h:8080", wire.Segment, "leaf-segment-test", 1, "http://h:8080/api/segment/get/leaf-segment-test"},
		{"http://h:8080/", wire.Snowflake, "any", 5, "http://h:8080/api/snowflake/get/any?count=5"},
		{"http://h/leaf", wire.Segment, "a_b", 1, "http://h/leaf/api/segment/get/a_b"},
		{"http://h", wire.Segment, "com.acme.order", 2, "http://h/api/segment/get/com.acme.order/?count=2"},
		{"http://h", wire.Segment, "order:create 订单", 1, "http://h/api/segment/get/order:create%20%E8%AE%A2%E5%8D%95"},
	} {
		if got := leafURL(tt.base, tt.kind, tt.tag, tt.n); got != tt.want {
			t.Errorf("leafURL(%q, %v, %q, %d) = %q, want %q", tt.base, tt.kind, tt.tag, tt.n, got, tt.want)
		}
	}
	if err := checkHTTPBase("http://h:8080?x=1"); err == nil || !strings.Contains(err.Error(), "query") {
		t.Errorf("checkHTTPBase with a query = %v, want an error", err)
	}
}

// TestHTTPKeepsConnectionsAlive: a client reuses its connections, one per request in
// flight, instead of dialling per request (which would measure TCP set-up, and run the
// host out of ports at a high rate).
func TestHTTPKeepsConnectionsAlive(t *testing.T) {
	fake := &fakeLeaf{}
	fake.next, fake.paths = 1000, map[string]int{}
	srv := httptest.NewUnstartedServer(fake)
	var dialled atomic.Int64
	srv.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		if s == http.StateNew {
			dialled.Add(1)
		}
	}
	srv.Start()
	t.Cleanup(srv.Close)
	cfg := defaultConfig()
	cfg.HTTP, cfg.Warmup, cfg.Duration, cfg.Requests = srv.URL, 0, 0, 300
	cfg.Clients, cfg.Inflight = 2, 2
	if rep := runBounded(t, cfg); rep.Dispenser.OK != 300 {
		t.Fatalf("%d good replies of 300 (errors %v)", rep.Dispenser.OK, rep.Dispenser.Errors)
	}
	if n := dialled.Load(); n > 2*int64(cfg.Clients*cfg.Inflight) {
		t.Errorf("%d connections for 300 requests with %d in flight, want them kept alive", n, cfg.Clients*cfg.Inflight)
	}
}

// TestHTTPEcho: `bench http-echo` answers every request with the next number, as
// text/plain with a Content-Length, on keep-alive connections.
func TestHTTPEcho(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	r, w := io.Pipe()
	done := make(chan int, 1)
	go func() { done <- httpEchoMain(ctx, []string{"--listen", "127.0.0.1:0", "--start", "41"}, w, io.Discard) }()
	line, err := bufio.NewReader(r).ReadString('\n')
	if err != nil {
		t.Fatal(err)
	}
	base := strings.TrimSpace(strings.TrimPrefix(line, "ready "))
	go io.Copy(io.Discard, r) //nolint:errcheck
	for want := 41; want < 44; want++ {
		resp, err := http.Get(base + "/api/segment/get/anything")
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if string(body) != strconv.Itoa(want) || resp.Header.Get("Content-Type") != "text/plain;charset=UTF-8" || resp.ContentLength != int64(len(body)) {
			t.Fatalf("answer %q (%s, length %d), want %d as text/plain", body, resp.Header.Get("Content-Type"), resp.ContentLength, want)
		}
	}
	cancel()
	select {
	case code := <-done:
		if code != exitOK {
			t.Fatalf("exit %d", code)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("http-echo did not stop within 10s")
	}
}
