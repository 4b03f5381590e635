package httpapi_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/leafbus/leafbus/core"
	"github.com/leafbus/leafbus/httpapi"
	"github.com/leafbus/leafbus/internal/testutil"
	"github.com/leafbus/leafbus/metrics"
	"github.com/leafbus/leafbus/segment"
)

// dialTiny opens a connection to addr whose receive buffer is as small as the kernel
// allows, so that an answer it does not read fills it at once and the server's write
// blocks.
func dialTiny(t *testing.T, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{Timeout: 5 * time.Second, Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		err := rc.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, 1024) })
		if err != nil {
			return err
		}
		return serr
	}}
	c, err := d.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("dial %s: %v", addr, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// segmentServer serves a segment tag "orders" of 13-digit IDs with room for every test,
// and metrics, with edit applied to the configuration.
func segmentServer(t *testing.T, edit func(*httpapi.Config)) (*httpapi.Server, string) {
	t.Helper()
	return segmentServerOn(t, nil, edit)
}

// segmentServerOn is segmentServer on ln (nil: its own listener).
func segmentServerOn(t *testing.T, ln net.Listener, edit func(*httpapi.Config)) (*httpapi.Server, string) {
	t.Helper()
	segs, _ := newSegments(t, segment.Tag{Name: "orders", MaxID: 1_000_000_000_000, Step: 1_000_000})
	m, err := metrics.New(metrics.Config{})
	if err != nil {
		t.Fatal(err)
	}
	cfg := httpapi.DefaultConfig()
	cfg.Core = coreOf(t, func(c *core.Config) { c.Segments = segs })
	cfg.Metrics = m
	if edit != nil {
		edit(&cfg)
	}
	return startServerOn(t, cfg, ln)
}

// TestSlowBodiesDoNotCount: clients that send their bodies slowly take no room among
// the requests in progress (the body is read first), so a normal client is answered
// while more of them wait than MaxInFlight allows; each is cut off after ReadTimeout.
func TestSlowBodiesDoNotCount(t *testing.T) {
	_, addr := segmentServer(t, func(c *httpapi.Config) { c.MaxInFlight, c.ReadTimeout = 2, 3*time.Second })
	var slow []net.Conn
	for range 5 {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		io.WriteString(c, "POST /api/segment/get/orders HTTP/1.1\r\nHost: leaf\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: 100\r\n\r\ncount=1")
		slow = append(slow, c)
	}
	testutil.Eventually(t, 10*time.Second, "the five slow connections accepted", func() bool {
		return value(t, testutil.Scrape(t, "http://"+addr+"/metrics"), "leafbus_http_connections", nil) >= 5
	})
	status, body := get(t, "http://"+addr+"/api/segment/get/orders")
	if status != http.StatusOK {
		t.Fatalf("GET beside 5 slow bodies with MaxInFlight 2: %d %q, want 200", status, body)
	}
	for i, c := range slow {
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("slow body %d: %v, want an answer once ReadTimeout passed", i, err)
		}
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), "not received in full within 3s") {
			t.Errorf("slow body %d: %d %q, want 400 naming ReadTimeout", i, resp.StatusCode, b)
		}
	}
}

// TestSlowReadersDoNotCount: clients that ask for a large answer and do not read it take
// no room among the requests in progress once their answer is being written, and their
// answers share MaxAnswerBytes: beyond it a large answer is a 503 at once, while small
// answers go on.
func TestSlowReadersDoNotCount(t *testing.T) {
	// The server's connections get a send buffer of a few KB (a listener's socket
	// options pass to the connections it accepts, and a set size stops the kernel's
	// growing it): with the reader's tiny receive buffer, each reader's first 140 KB
	// answer blocks for good, holding its share of the budget. With buffers the kernel
	// grows (to 4 MB here), each reader's first answers complete one after another
	// instead, each counted as in progress while it is made, and a reading of the
	// budget says nothing of the next moment (under load, /metrics itself was turned
	// away and a large answer served with the budget read as spent).
	lc := net.ListenConfig{Control: func(_, _ string, rc syscall.RawConn) error {
		var serr error
		if err := rc.Control(func(fd uintptr) { serr = syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_SNDBUF, 4096) }); err != nil {
			return err
		}
		return serr
	}}
	ln, err := lc.Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	_, addr := segmentServerOn(t, ln, func(c *httpapi.Config) { c.MaxInFlight, c.MaxAnswerBytes = 5, 1<<20 })
	// Five slow readers, each with 40 requests for 10,000 IDs in a row (140 KB each),
	// each blocked writing its first; five such answers fit the budget of 1 MB.
	pipelined := strings.Repeat("GET /api/segment/get/orders?count=10000 HTTP/1.1\r\nHost: leaf\r\n\r\n", 40)
	for range 5 {
		io.WriteString(dialTiny(t, addr), pipelined)
	}
	waitAnswerBytes(t, addr, "five large answers being written", 5*139_999)
	for i := range 20 {
		status, body := get(t, "http://"+addr+"/api/segment/get/orders")
		if status != http.StatusOK {
			t.Fatalf("GET %d beside 5 slow readers with MaxInFlight 5: %d %q, want 200", i, status, body)
		}
	}
	// Five more slow readers: two more answers fit (seven hold 980 KB for good), then the
	// budget is spent, and the rest are told so at once.
	for range 5 {
		io.WriteString(dialTiny(t, addr), pipelined)
	}
	waitAnswerBytes(t, addr, "the budget spent", 1<<20-139_999)
	a := raw(t, addr, "GET", "/api/segment/get/orders?count=10000", nil, "")
	if a.status != http.StatusServiceUnavailable || !strings.Contains(a.body, "large answers already being written") {
		t.Errorf("a large answer with the budget spent: %d %.200q, want 503 naming the budget", a.status, a.body)
	}
	if status, _ := get(t, "http://"+addr+"/api/segment/get/orders?count=100"); status != http.StatusOK {
		t.Errorf("a small answer with the budget spent: %d, want 200", status)
	}
}

// waitAnswerBytes waits until the server's gauge of large answers being written reaches
// least. /metrics counts among the requests in progress like any other, so while slow
// readers' requests are being made it may be turned away: that is asked again.
func waitAnswerBytes(t *testing.T, addr, what string, least float64) {
	t.Helper()
	last := "no scrape"
	defer func() {
		if t.Failed() {
			t.Logf("%s: last seen %s", what, last)
		}
	}()
	testutil.Eventually(t, 30*time.Second, what, func() bool {
		fams, status, body := testutil.TryScrape(t, "http://"+addr+"/metrics")
		if status != http.StatusOK {
			last = fmt.Sprintf("/metrics answered %d %q", status, body)
			return false
		}
		v := value(t, fams, "leafbus_http_answer_bytes", nil)
		last = fmt.Sprintf("leafbus_http_answer_bytes %.0f", v)
		return v >= least
	})
}

// TestReadyzSaturated: a request turned away at MaxInFlight makes /readyz say the node
// is saturated.
func TestReadyzSaturated(t *testing.T) {
	segs := newBlockingSegments()
	cfg := httpapi.DefaultConfig()
	cfg.Core = coreOf(t, func(c *core.Config) { c.Segments = segs })
	cfg.MaxInFlight = 1
	cfg.Readiness = core.ReadinessFunc(func() core.Health {
		return core.Health{TagsLoaded: true, WorkerIDHeld: true, LastBeat: time.Now()}
	})
	_, addr := startServer(t, cfg)
	url := "http://" + addr
	if status, body := get(t, url+"/readyz"); status != http.StatusOK {
		t.Fatalf("/readyz before any load: %d %q, want 200", status, body)
	}
	first := asyncGet(t, url+"/api/segment/get/orders")
	waitEntered(t, segs)
	if status, _ := get(t, url+"/api/segment/get/orders"); status != http.StatusServiceUnavailable {
		t.Fatalf("a second request with MaxInFlight 1: %d, want 503", status)
	}
	status, body := get(t, url+"/readyz")
	if status != http.StatusServiceUnavailable || !strings.Contains(body, "saturated: HTTP requests or connections turned away") || !strings.Contains(body, "1 of 1 requests in progress") {
		t.Errorf("/readyz after a request was turned away: %d %q, want 503 saying saturated", status, body)
	}
	close(segs.release)
	receive(t, first)
}

// TestBodyBounds: a body over 64 KB is refused (413) before the request counts.
func TestBodyBounds(t *testing.T) {
	_, addr := segmentServer(t, nil)
	a := raw(t, addr, "POST", "/api/segment/get/orders", []string{"Content-Type: application/x-www-form-urlencoded"}, "count=2&pad="+strings.Repeat("x", 70<<10))
	if a.status != http.StatusRequestEntityTooLarge {
		t.Errorf("a 70 KB body: %d %q, want 413", a.status, a.body)
	}
	a = raw(t, addr, "POST", "/api/segment/get/orders", []string{"Content-Type: application/x-www-form-urlencoded"}, "count=2")
	if a.status != http.StatusOK || len(strings.Split(a.body, "\n")) != 2 {
		t.Errorf("a form asking for 2 IDs: %d %q, want 200 and two IDs", a.status, a.body)
	}
}
