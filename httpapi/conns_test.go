package httpapi_test

import (
	"bufio"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/leafbus/leafbus/core"
	"github.com/leafbus/leafbus/httpapi"
	"github.com/leafbus/leafbus/internal/testutil"
	"github.com/leafbus/leafbus/metrics"
)

// TestConnCap: at MaxConns a new connection closes the one that waited longest without
// a request (connected and silent, or idle between requests); when every connection has
// a request in progress, it is refused with 503 and the node says it is saturated. The
// cap is logged once when it first bites, not once per connection.
func TestConnCap(t *testing.T) {
	segs := newBlockingSegments()
	m, err := metrics.New(metrics.Config{})
	if err != nil {
		t.Fatal(err)
	}
	var logs testutil.SyncBuffer
	cfg := httpapi.DefaultConfig()
	cfg.Core = coreOf(t, func(c *core.Config) { c.Segments, c.WaitMax = segs, 10*time.Second })
	cfg.MaxConns, cfg.Metrics = 3, m
	cfg.Logger = slog.New(slog.NewTextHandler(io.MultiWriter(&logs, testutil.LogWriter(t)), nil))
	cfg.Readiness = core.ReadinessFunc(func() core.Health {
		return core.Health{TagsLoaded: true, WorkerIDHeld: true, LastBeat: time.Now()}
	})
	_, addr := startServer(t, cfg)
	url := "http://" + addr

	// Three silent connections fill the cap; a client that wants an answer still gets
	// one, and the oldest silent one is closed for it.
	var silent []net.Conn
	for range 3 {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		silent = append(silent, c)
		time.Sleep(5 * time.Millisecond) // an order of age among them; not needed for the assertions below
	}
	a := raw(t, addr, "GET", "/healthz", nil, "")
	if a.status != http.StatusOK {
		t.Fatalf("GET /healthz with 3 silent connections at a cap of 3: %d %q, want 200", a.status, a.body)
	}
	silent[0].SetReadDeadline(time.Now().Add(10 * time.Second))
	if n, err := silent[0].Read(make([]byte, 1)); err == nil {
		t.Errorf("the oldest silent connection read %d bytes, want it closed", n)
	}
	for _, c := range silent[1:] {
		c.Close()
	}

	// Three requests in progress fill the cap: a fourth connection is refused at once.
	var inProgress []<-chan answer
	for range 3 {
		inProgress = append(inProgress, asyncGet(t, url+"/api/segment/get/orders"))
		waitEntered(t, segs)
	}
	for range 2 {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		io.WriteString(c, "GET /readyz HTTP/1.1\r\nHost: leaf\r\n\r\n")
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatalf("a connection beyond the cap: %v, want a 503 answer", err)
		}
		b, _ := io.ReadAll(resp.Body)
		c.Close()
		if resp.StatusCode != http.StatusServiceUnavailable || string(b) != "unavailable: too many HTTP connections open\n" {
			t.Errorf("a connection beyond the cap: %d %q, want 503 saying why", resp.StatusCode, b)
		}
	}
	close(segs.release)
	for _, ch := range inProgress {
		if a := receive(t, ch); a.status != http.StatusOK {
			t.Errorf("a request in progress at the cap: %d %q, want 200", a.status, a.body)
		}
	}
	status, body := get(t, url+"/readyz")
	if status != http.StatusServiceUnavailable || !strings.Contains(body, "saturated") {
		t.Errorf("/readyz after connections were refused: %d %q, want 503 saying saturated", status, body)
	}
	if n := strings.Count(logs.String(), "the cap (--http-max-conns)"); n != 1 {
		t.Errorf("%d lines about the cap, want 1 (at most one a minute):\n%s", n, logs.String())
	}
	fams := testutil.Scrape(t, url+"/metrics")
	if got := value(t, fams, "leafbus_http_connections_refused_total", nil); got != 2 {
		t.Errorf("connections refused = %v, want 2", got)
	}
	if got := value(t, fams, "leafbus_http_connections_closed_idle_total", nil); got < 1 {
		t.Errorf("idle connections closed = %v, want at least 1", got)
	}
}
