package httpapi_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/leafbus/leafbus/core"
	"github.com/leafbus/leafbus/httpapi"
	"github.com/leafbus/leafbus/internal/testutil"
	"github.com/leafbus/leafbus/metrics"
	"github.com/leafbus/leafbus/segment"
	"github.com/leafbus/leafbus/snowflake"
)

// benchHandler is the whole HTTP face with real generators and metrics, without a
// network: what one request costs inside the dispenser.
func benchHandler(b testing.TB) http.Handler {
	segs, _ := newSegments(b, segment.Tag{Name: "orders", MaxID: 1, Step: 100_000})
	sf, err := snowflake.New(snowflake.Config{WorkerID: 1})
	if err != nil {
		b.Fatal(err)
	}
	m, err := metrics.New(metrics.Config{})
	if err != nil {
		b.Fatal(err)
	}
	srv, err := httpapi.New("127.0.0.1:0", httpapi.Config{Core: coreOf(b, func(c *core.Config) { c.Segments, c.Snowflakes = segs, sf }), Metrics: m})
	if err != nil {
		b.Fatal(err)
	}
	return srv.Handler()
}

func benchmarkPath(b *testing.B, target string) {
	h := benchHandler(b)
	req := httptest.NewRequest(http.MethodGet, target, nil)
	b.ReportAllocs()
	for b.Loop() {
		w := httptest.NewRecorder()
		h.ServeHTTP(w, req)
		if w.Code != http.StatusOK {
			b.Fatalf("GET %s: %d %s", target, w.Code, w.Body)
		}
	}
}

func BenchmarkSegmentOne(b *testing.B)   { benchmarkPath(b, "/api/segment/get/orders") }
func BenchmarkSnowflakeOne(b *testing.B) { benchmarkPath(b, "/api/snowflake/get/orders") }
func BenchmarkSegmentBatch(b *testing.B) { benchmarkPath(b, "/api/segment/get/orders?count=100") }
func BenchmarkDecodeSnowflake(b *testing.B) {
	benchmarkPath(b, "/decodeSnowflakeId?snowflakeId=1860000000000000000")
}

// nopWriter is a ResponseWriter that keeps nothing, so that what a request allocates
// is the handler's alone.
type nopWriter struct{ h http.Header }

func (w *nopWriter) Header() http.Header         { return w.h }
func (w *nopWriter) Write(b []byte) (int, error) { return len(b), nil }
func (w *nopWriter) WriteHeader(int)             {}

// TestIDRequestAllocatesNothing: a Leaf ID request answered from memory (routing, the
// core, content negotiation, the reply, the metrics) allocates nothing in the handler;
// net/http's own allocations per request are the same for any handler.
func TestIDRequestAllocatesNothing(t *testing.T) {
	if testutil.RaceEnabled {
		t.Skip("the race detector allocates")
	}
	h := benchHandler(t)
	w := &nopWriter{h: http.Header{}}
	for _, target := range []string{"/api/segment/get/orders", "/api/snowflake/get/orders", "/api/segment/get/orders.json"} {
		req := httptest.NewRequest(http.MethodGet, target, nil)
		req.Header.Set("Accept", "text/plain, application/json, application/*+json, */*")
		if n := testing.AllocsPerRun(1000, func() { h.ServeHTTP(w, req) }); n != 0 {
			t.Errorf("GET %s: %v allocations per request, want 0", target, n)
		}
	}
}
