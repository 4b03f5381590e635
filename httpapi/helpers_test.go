package httpapi_test

import (
	"bufio"
	"context"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/leafbus/leafbus/core"
	"github.com/leafbus/leafbus/httpapi"
	"github.com/leafbus/leafbus/internal/testutil"
	"github.com/leafbus/leafbus/segment"
	"github.com/leafbus/leafbus/snowflake"
)

// newSegments runs a real segment generator over an in-memory store holding tags, and
// waits until it has loaded the tag list.
func newSegments(tb testing.TB, tags ...segment.Tag) (*segment.Generator, *segment.InmemStore) {
	tb.Helper()
	store := segment.NewInmemStore()
	ctx := testutil.Context(tb, 10*time.Second)
	for _, t := range tags {
		if _, err := store.AddTag(ctx, t); err != nil {
			tb.Fatalf("AddTag(%s): %v", t.Name, err)
		}
	}
	cfg := segment.DefaultConfig()
	cfg.Store = store
	cfg.Logger = testutil.Logger(tb)
	gen, err := segment.New(cfg)
	if err != nil {
		tb.Fatalf("segment.New: %v", err)
	}
	testutil.Run(tb, "segment generator", gen.Run)
	select {
	case <-gen.Ready():
	case <-ctx.Done():
		tb.Fatalf("segment generator not ready: %v", ctx.Err())
	}
	return gen, store
}

// sfTime is the fake clock's reading in the tests: 2025-11-22T06:20:00.123Z.
var sfTime = time.UnixMilli(1_763_792_400_123)

// newSnowflakes returns a real snowflake generator with worker ID worker on a clock
// that stands at sfTime, with dense sequences, so its IDs are known in advance.
func newSnowflakes(tb testing.TB, worker int64) (*snowflake.Generator, *snowflake.FakeClock) {
	tb.Helper()
	clock := snowflake.NewFakeClock(sfTime)
	gen, err := snowflake.New(snowflake.Config{WorkerID: worker, Clock: clock, DenseSequence: true})
	if err != nil {
		tb.Fatalf("snowflake.New: %v", err)
	}
	return gen, clock
}

// sfID is the ID the default layout gives worker at sfTime with sequence seq.
func sfID(worker, seq int64) int64 {
	l := snowflake.DefaultLayout()
	return (sfTime.UnixMilli()-l.Epoch)<<(l.WorkerBits+l.SequenceBits) | worker<<l.SequenceBits | seq
}

// startServer serves cfg on a loopback port chosen by the system until the test ends,
// and returns the address.
func startServer(tb testing.TB, cfg httpapi.Config) (*httpapi.Server, string) {
	tb.Helper()
	return startServerOn(tb, cfg, nil)
}

// startServerOn is startServer on ln (nil: the server binds 127.0.0.1:0 itself).
func startServerOn(tb testing.TB, cfg httpapi.Config, ln net.Listener) (*httpapi.Server, string) {
	tb.Helper()
	if cfg.Core == nil {
		cfg.Core = coreOf(tb, nil) // no sources: every ID request a 503
	}
	if cfg.Logger == nil {
		cfg.Logger = testutil.Logger(tb)
	}
	srv, err := httpapi.New("127.0.0.1:0", cfg)
	if err != nil {
		tb.Fatalf("httpapi.New: %v", err)
	}
	if ln != nil {
		err = srv.UseListener(ln)
	} else {
		err = srv.Listen(true)
	}
	if err != nil {
		tb.Fatalf("Listen: %v", err)
	}
	testutil.Run(tb, "http server", srv.Run)
	return srv, srv.Addr().String()
}

// coreOf builds the core a test's server answers from: core.DefaultConfig with set
// applied (nil: no sources).
func coreOf(tb testing.TB, set func(*core.Config)) *core.Core {
	tb.Helper()
	cc := core.DefaultConfig()
	if set != nil {
		set(&cc)
	}
	c, err := core.New(cc)
	if err != nil {
		tb.Fatalf("core.New: %v", err)
	}
	tb.Cleanup(c.Stop)
	return c
}

// answer is a response as read off the wire.
type answer struct {
	status int
	header http.Header
	body   string
}

// raw sends request (a request line and headers, without the blank line; body after)
// byte for byte, so that nothing cleans or re-encodes the path on the way, and reads
// the answer.
func raw(tb testing.TB, addr, method, target string, headers []string, body string) answer {
	tb.Helper()
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		tb.Fatalf("dial %s: %v", addr, err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	var b strings.Builder
	b.WriteString(method + " " + target + " HTTP/1.1\r\nHost: leaf\r\nConnection: close\r\n")
	for _, h := range headers {
		b.WriteString(h + "\r\n")
	}
	if body != "" {
		b.WriteString("Content-Length: " + strconv.Itoa(len(body)) + "\r\n")
	}
	b.WriteString("\r\n" + body)
	if _, err := io.WriteString(conn, b.String()); err != nil {
		tb.Fatalf("write %s %s: %v", method, target, err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), &http.Request{Method: method})
	if err != nil {
		tb.Fatalf("read the answer to %s %s: %v", method, target, err)
	}
	defer resp.Body.Close()
	got, err := io.ReadAll(resp.Body)
	if err != nil {
		tb.Fatalf("read the body of %s %s: %v", method, target, err)
	}
	return answer{resp.StatusCode, resp.Header, string(got)}
}

// get fetches url with a bounded wait and returns the status and body.
func get(tb testing.TB, url string) (int, string) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		tb.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		tb.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		tb.Fatalf("GET %s: read body: %v", url, err)
	}
	return resp.StatusCode, string(b)
}
