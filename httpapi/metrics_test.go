package httpapi_test

import (
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/leafbus/leafbus/core"
	"github.com/leafbus/leafbus/httpapi"
	"github.com/leafbus/leafbus/internal/testutil"
	"github.com/leafbus/leafbus/metrics"
	"github.com/leafbus/leafbus/segment"
)

// value is the counter or gauge of family name whose labels include want (0 if none).
func value(tb testing.TB, fams map[string]*dto.MetricFamily, name string, want map[string]string) float64 {
	tb.Helper()
	f := fams[name]
	if f == nil {
		tb.Fatalf("no metric family %s", name)
	}
next:
	for _, m := range f.GetMetric() {
		have := map[string]string{}
		for _, l := range m.GetLabel() {
			have[l.GetName()] = l.GetValue()
		}
		for k, v := range want {
			if have[k] != v {
				continue next
			}
		}
		if m.Counter != nil {
			return m.Counter.GetValue()
		}
		if m.Histogram != nil {
			return float64(m.Histogram.GetSampleCount())
		}
		return m.Gauge.GetValue()
	}
	return 0
}

// TestHTTPRequestsAreCounted: the HTTP face reports every ID and decode request to
// the metrics, as transport "http", and serves them on /metrics.
func TestHTTPRequestsAreCounted(t *testing.T) {
	segs, _ := newSegments(t, segment.Tag{Name: "orders", MaxID: 1, Step: 1000})
	sf, _ := newSnowflakes(t, 5)
	m, err := metrics.New(metrics.Config{MaxTags: 10})
	if err != nil {
		t.Fatal(err)
	}
	cfg := httpapi.DefaultConfig()
	cfg.Core = coreOf(t, func(c *core.Config) { c.Segments, c.Snowflakes = segs, sf })
	cfg.Metrics, cfg.Location = m, time.UTC
	_, addr := startServer(t, cfg)
	url := "http://" + addr
	for range 3 {
		get(t, url+"/api/segment/get/orders?count=4")
	}
	get(t, url+"/api/segment/get/missing")
	get(t, url+"/api/snowflake/get/x")
	get(t, url+"/decodeSnowflakeId?snowflakeId=1")

	fams := testutil.Scrape(t, url+"/metrics")
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"leafbus_requests_total", map[string]string{"transport": "http", "kind": "segment", "code": "200"}, 3},
		{"leafbus_requests_total", map[string]string{"transport": "http", "kind": "segment", "code": "404"}, 1},
		{"leafbus_requests_total", map[string]string{"transport": "http", "kind": "snowflake", "code": "200"}, 1},
		{"leafbus_requests_total", map[string]string{"transport": "http", "kind": "decode", "code": "200"}, 1},
		{"leafbus_ids_issued_total", map[string]string{"transport": "http", "kind": "segment"}, 12},
		{"leafbus_ids_issued_total", map[string]string{"transport": "http", "kind": "snowflake"}, 1},
		{"leafbus_request_duration_seconds", map[string]string{"transport": "http", "kind": "segment"}, 4},
		{"leafbus_requests_total", map[string]string{"transport": "nats", "kind": "segment", "code": "200"}, 0},
		{"leafbus_http_requests_in_flight", nil, 1}, // the scrape itself
	} {
		if got := value(t, fams, c.name, c.labels); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
}
