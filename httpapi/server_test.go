package httpapi_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/leafbus/leafbus/core"
	"github.com/leafbus/leafbus/httpapi"
	"github.com/leafbus/leafbus/internal/testutil"
	"github.com/leafbus/leafbus/metrics"
	"github.com/leafbus/leafbus/wire"
)

// blockingSegments is a SegmentSource whose tags are never in memory: Fill waits for
// release (or its context) and then hands out IDs from 1.
type blockingSegments struct {
	entered chan struct{} // one send per Fill that started waiting
	release chan struct{}
	mu      sync.Mutex
	next    int64
}

func newBlockingSegments() *blockingSegments {
	return &blockingSegments{entered: make(chan struct{}, 16), release: make(chan struct{}), next: 1}
}

func (b *blockingSegments) TryFill(string, []int64) (bool, error) { return false, nil }

func (b *blockingSegments) Fill(ctx context.Context, _ string, dst []int64) error {
	b.entered <- struct{}{}
	select {
	case <-b.release:
	case <-ctx.Done():
		return ctx.Err()
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	for i := range dst {
		dst[i] = b.next
		b.next++
	}
	return nil
}

// waitEntered waits for a Fill to start waiting.
func waitEntered(t *testing.T, b *blockingSegments) {
	t.Helper()
	select {
	case <-b.entered:
	case <-time.After(10 * time.Second):
		t.Fatal("no request reached Fill within 10s")
	}
}

// asyncGet starts a GET and returns a channel with its status and body.
func asyncGet(t *testing.T, url string) <-chan answer {
	out := make(chan answer, 1)
	go func() {
		resp, err := http.Get(url)
		if err != nil {
			out <- answer{status: -1, body: err.Error()}
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		out <- answer{status: resp.StatusCode, body: string(b)}
	}()
	return out
}

func receive(t *testing.T, ch <-chan answer) answer {
	t.Helper()
	select {
	case a := <-ch:
		return a
	case <-time.After(10 * time.Second):
		t.Fatal("no answer within 10s")
		return answer{}
	}
}

// TestInFlightBound: beyond MaxInFlight a request is answered 503 at once and counted;
// the probes still answer.
func TestInFlightBound(t *testing.T) {
	segs := newBlockingSegments()
	m, err := metrics.New(metrics.Config{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := httpapi.DefaultConfig()
	cfg.Core = coreOf(t, func(c *core.Config) { c.Segments = segs })
	cfg.MaxInFlight, cfg.Metrics = 1, m
	_, addr := startServer(t, cfg)
	url := "http://" + addr
	first := asyncGet(t, url+"/api/segment/get/orders")
	waitEntered(t, segs)

	start := time.Now()
	status, body := get(t, url+"/api/segment/get/orders")
	if status != http.StatusServiceUnavailable || body != "1 HTTP requests already in progress\n" {
		t.Errorf("second request: %d %q, want 503 at once", status, body)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("the refused request took %v, want an answer at once", d)
	}
	if status, _ := get(t, url+"/healthz"); status != http.StatusOK {
		t.Errorf("GET /healthz with the bound reached: %d, want 200", status)
	}
	close(segs.release)
	if a := receive(t, first); a.status != http.StatusOK || a.body != "1" {
		t.Errorf("first request: %d %q, want 200 1", a.status, a.body)
	}
	fams := testutil.Scrape(t, url+"/metrics")
	if got := value(t, fams, "leafbus_requests_rejected_total", map[string]string{"transport": "http"}); got != 1 {
		t.Errorf("rejected = %v, want 1", got)
	}
}

// TestGracefulShutdown: a request in progress when the context ends still gets its
// answer, and Run returns nil.
func TestGracefulShutdown(t *testing.T) {
	segs := newBlockingSegments()
	cfg := httpapi.DefaultConfig()
	cfg.Core = coreOf(t, func(c *core.Config) { c.Segments = segs })
	cfg.Logger = testutil.Logger(t)
	srv, err := httpapi.New("127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Listen(true); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- srv.Run(ctx) }()
	inFlight := asyncGet(t, "http://"+srv.Addr().String()+"/api/segment/get/orders?count=2")
	waitEntered(t, segs)
	cancel()
	// Shutdown closes the listener at once, then waits for the request in progress.
	testutil.Eventually(t, 5*time.Second, "the listener closed once the context ended", func() bool {
		c, err := net.DialTimeout("tcp", srv.Addr().String(), time.Second)
		if err == nil {
			c.Close()
		}
		return err != nil
	})
	close(segs.release)
	if a := receive(t, inFlight); a.status != http.StatusOK || a.body != "1\n2" {
		t.Errorf("request in progress at the stop: %d %q, want 200 \"1\\n2\"", a.status, a.body)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("Run = %v, want nil", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not return within 10s of its context ending")
	}
}

// TestSegmentWaitIsBounded: a tag whose segment does not come within WaitMax is a 503
// naming the wait, as over NATS.
func TestSegmentWaitIsBounded(t *testing.T) {
	cfg := httpapi.DefaultConfig()
	cfg.Core = coreOf(t, func(c *core.Config) { c.Segments, c.WaitMax = newBlockingSegments(), 50*time.Millisecond })
	_, addr := startServer(t, cfg)
	status, body := get(t, "http://"+addr+"/api/segment/get/orders")
	want := "unavailable: no IDs of \"orders\" within 50ms: context deadline exceeded\n"
	if status != http.StatusServiceUnavailable || body != want {
		t.Errorf("GET: %d %q, want 503 %q", status, body, want)
	}
}

func TestNoGenerators(t *testing.T) {
	_, addr := startServer(t, httpapi.DefaultConfig())
	for kind, path := range map[string]string{"segment": "/api/segment/get/a", "snowflake": "/api/snowflake/get/a"} {
		status, body := get(t, "http://"+addr+path)
		if want := "unavailable: " + kind + " IDs are not configured on this dispenser\n"; status != 503 || body != want {
			t.Errorf("GET %s: %d %q, want 503 %q", path, status, body, want)
		}
	}
	if status, _ := get(t, "http://"+addr+"/metrics"); status != http.StatusNotFound {
		t.Errorf("GET /metrics without metrics: %d, want 404", status)
	}
}

func TestOwnPathsAreGETOnly(t *testing.T) {
	_, addr := startServer(t, httpapi.DefaultConfig())
	for _, p := range []string{"/", "/metrics", "/healthz", "/readyz"} {
		a := raw(t, addr, "POST", p, nil, "")
		if a.status != http.StatusMethodNotAllowed || a.header.Get("Allow") != "GET, HEAD" {
			t.Errorf("POST %s: %d, Allow %q, want 405 GET, HEAD", p, a.status, a.header.Get("Allow"))
		}
	}
}

// TestSlowClients: a client that never finishes its header is cut off after
// ReadHeaderTimeout, and a header over MaxHeaderBytes is refused.
func TestSlowClients(t *testing.T) {
	cfg := httpapi.DefaultConfig()
	cfg.ReadHeaderTimeout, cfg.MaxHeaderBytes = 200*time.Millisecond, 4096
	_, addr := startServer(t, cfg)
	cfg2 := httpapi.DefaultConfig()
	cfg2.ReadTimeout = 300 * time.Millisecond
	cfg2.Core = coreOf(t, nil)
	_, addr2 := startServer(t, cfg2)

	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	io.WriteString(conn, "GET /healthz HTTP/1.1\r\nHost: leaf\r\nX-Slow: ")
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	start := time.Now()
	if _, err := io.ReadAll(conn); err != nil {
		t.Fatalf("read from a slow connection: %v, want the server to close it", err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("a half-sent header held the connection %v, want about ReadHeaderTimeout (200ms)", d)
	}

	// A body sent too slowly, whether the handler reads it (a POST form) or not (the
	// server discards it): the connection is closed after ReadTimeout.
	for _, target := range []string{"/api/segment/get/s01", "/healthz"} {
		slowBody, err := net.Dial("tcp", addr2)
		if err != nil {
			t.Fatal(err)
		}
		io.WriteString(slowBody, "POST "+target+" HTTP/1.1\r\nHost: leaf\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: 100\r\n\r\ncount=1")
		slowBody.SetReadDeadline(time.Now().Add(5 * time.Second))
		start = time.Now()
		io.ReadAll(slowBody) //nolint:errcheck // an answer or none: the time is what counts
		if d := time.Since(start); d > 3*time.Second {
			t.Errorf("POST %s: a body cut short held the connection %v, want about ReadTimeout (300ms)", target, d)
		}
		slowBody.Close()
	}

	big := raw(t, addr, "GET", "/healthz", []string{"X-Big: " + strings.Repeat("a", 8192)}, "")
	if big.status != http.StatusRequestHeaderFieldsTooLarge {
		t.Errorf("a 8 KiB header over a 4 KiB limit: status %d, want 431", big.status)
	}
}

// TestListenRule: PROTOCOL.md's rule for --http.
func TestListenRule(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	addr := taken.Addr().String()

	if _, err := httpapi.Listen(addr, false); !errors.Is(err, httpapi.ErrDefaultTaken) {
		t.Errorf("Listen(taken, default) = %v, want ErrDefaultTaken (warn, serve without HTTP)", err)
	}
	_, err = httpapi.Listen(addr, true)
	if err == nil || errors.Is(err, httpapi.ErrDefaultTaken) || !strings.Contains(err.Error(), "--http "+addr) {
		t.Errorf("Listen(taken, explicit) = %v, want a start-up error naming --http %s", err, addr)
	}
	if _, err := httpapi.Listen("256.0.0.1:1", false); err == nil || errors.Is(err, httpapi.ErrDefaultTaken) {
		t.Errorf("Listen(bad address, default) = %v, want a start-up error: only a taken port is forgiven", err)
	}
	if ln, err := httpapi.Listen("", true); ln != nil || err != nil {
		t.Errorf("Listen(\"\") = %v, %v, want nil, nil (HTTP off)", ln, err)
	}
	ln, err := httpapi.Listen("127.0.0.1:0", false)
	if err != nil {
		t.Fatalf("Listen(free port) = %v", err)
	}
	ln.Close()
}

// TestCloseWithoutRun: Close gives back the port Listen bound though Run never served
// on it (a dispenser whose start failed later), and a Run after Close fails.
func TestCloseWithoutRun(t *testing.T) {
	srv, err := httpapi.New("127.0.0.1:0", httpapi.Config{Core: coreOf(t, nil)})
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Listen(true); err != nil {
		t.Fatal(err)
	}
	addr := srv.Addr().String()
	if err := srv.Close(); err != nil {
		t.Fatalf("Close = %v", err)
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatalf("bind %s after Close: %v, want the port free", addr, err)
	}
	ln.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := srv.Run(ctx); err == nil {
		t.Error("Run after Close = nil, want an error")
	}
}

func TestConfigValidate(t *testing.T) {
	for _, c := range []struct {
		name   string
		change func(*httpapi.Config)
		want   string
	}{
		{"WriteTimeoutBelowWaitMax", func(c *httpapi.Config) { c.WriteTimeout = 2 * time.Second }, "WriteTimeout 2s must exceed the core's WaitMax 2s"},
		{"NoCore", func(c *httpapi.Config) { c.Core = nil }, "Core is required"},
		{"NegativeTimeout", func(c *httpapi.Config) { c.ReadHeaderTimeout = -time.Second }, "ReadHeaderTimeout -1s"},
		{"MaxInFlight", func(c *httpapi.Config) { c.MaxInFlight = -1 }, "MaxInFlight -1"},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := httpapi.DefaultConfig()
			cfg.Core = coreOf(t, nil)
			c.change(&cfg)
			if _, err := httpapi.New("127.0.0.1:0", cfg); err == nil || !strings.Contains(err.Error(), c.want) {
				t.Errorf("New = %v, want an error containing %q", err, c.want)
			}
		})
	}
}

// TestZeroConfigTakesDefaults: a Config with only sources set serves with the defaults.
func TestZeroConfigTakesDefaults(t *testing.T) {
	sf, _ := newSnowflakes(t, 9)
	_, addr := startServer(t, httpapi.Config{Core: coreOf(t, func(c *core.Config) { c.Snowflakes = sf })})
	if status, body := get(t, "http://"+addr+"/api/snowflake/get/a?count=10000"); status != 200 || strings.Count(body, "\n") != 9999 {
		t.Errorf("GET count=10000 with a zero Config: %d, %d lines, want 200 and the default max batch", status, strings.Count(body, "\n")+1)
	}
}

// TestBatchesServeHTTPToo: a ready-made reply of a pool is answered as it is.
func TestBatchesServeHTTPToo(t *testing.T) {
	cfg := httpapi.DefaultConfig()
	cfg.Core = coreOf(t, func(c *core.Config) {
		c.Batches = fixedBatch{kind: wire.Segment, tag: "orders", n: 3, reply: []byte("7\n8\n9")}
		c.Segments = newBlockingSegments() // would block: the pool must answer
	})
	_, addr := startServer(t, cfg)
	if status, body := get(t, "http://"+addr+"/api/segment/get/orders?count=3"); status != 200 || body != "7\n8\n9" {
		t.Errorf("GET count=3 with a ready batch: %d %q, want 200 \"7\\n8\\n9\"", status, body)
	}
}

type fixedBatch struct {
	kind  wire.Kind
	tag   string
	n     int
	reply []byte
}

func (f fixedBatch) Take(kind wire.Kind, tag string, n int, enc wire.Encoding) ([]byte, bool) {
	return f.reply, kind == f.kind && tag == f.tag && n == f.n && enc == wire.Text
}
