package dispenser

import (
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"

	"github.com/leafbus/leafbus/internal/buildinfo"
	"github.com/leafbus/leafbus/internal/testutil"
	"github.com/leafbus/leafbus/wire"
)

// runUntilCleanup runs d until the test ends and waits until it serves.
func runUntilCleanup(tb testing.TB, d *Dispenser) {
	tb.Helper()
	testutil.Run(tb, "Dispenser.Run", d.Run) // stopped at cleanup, before Close
	select {
	case <-d.Ready():
	case <-time.After(30 * time.Second):
		tb.Fatal("not ready within 30s")
	}
}

// httpGet GETs url and returns the status and body.
func httpGet(tb testing.TB, url string) (int, string) {
	tb.Helper()
	resp, err := http.Get(url)
	if err != nil {
		tb.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		tb.Fatalf("GET %s: read the body: %v", url, err)
	}
	return resp.StatusCode, string(b)
}

// metricValue returns the counter or gauge of family name whose labels include want; ok
// is false when there is none.
func metricValue(fams map[string]*dto.MetricFamily, name string, want map[string]string) (v float64, ok bool) {
next:
	for _, m := range fams[name].GetMetric() {
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
			return m.Counter.GetValue(), true
		}
		return m.Gauge.GetValue(), true
	}
	return 0, false
}

// TestHTTPServesBesideNATS: a dispenser serves Leaf's HTTP API from the generators the
// NATS service uses, /metrics counts the answers of both transports, /readyz says it
// is ready, $SRV.INFO names the node and its worker ID for discovery, the banner names
// the status page, the build's version (internal/buildinfo) is the same in $SRV.INFO,
// the banner, the status page and leafbus_build_info, and Close frees the port.
func TestHTTPServesBesideNATS(t *testing.T) {
	banner := &testutil.SyncBuffer{}
	d, err := newTest(t, testConfig(t), WithBanner(banner))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	runUntilCleanup(t, d)
	addr := d.HTTPAddr()
	if addr == nil {
		t.Fatal("HTTPAddr() = nil, want the HTTP face on a port of its own")
	}
	base := "http://" + addr.String()
	if want := "status page: " + base + "/\n"; !strings.HasSuffix(banner.String(), want) {
		t.Errorf("banner %q: want it to end with %q", banner.String(), want)
	}

	// Leaf's API.
	if code, body := httpGet(t, base+"/api/segment/get/"+SampleTagName); code != 200 || body != "1" {
		t.Errorf("GET segment = %d %q, want 200 \"1\" (the sample tag's first ID)", code, body)
	}
	if code, body := httpGet(t, base+"/api/segment/get/"+SampleTagName+"?count=3"); code != 200 || body != "2\n3\n4" {
		t.Errorf("GET segment ?count=3 = %d %q, want 200 \"2\\n3\\n4\"", code, body)
	}
	if code, body := httpGet(t, base+"/api/segment/get/no-such-tag"); code != 404 || !strings.Contains(body, "no-such-tag") {
		t.Errorf("GET segment of a missing tag = %d %q, want 404 naming it", code, body)
	}
	code, body := httpGet(t, base+"/api/snowflake/get/any")
	if _, err := strconv.ParseInt(body, 10, 64); code != 200 || err != nil {
		t.Fatalf("GET snowflake = %d %q, want 200 and an ID", code, body)
	}
	code, decoded := httpGet(t, base+"/decodeSnowflakeId?snowflakeId="+body)
	var leaf struct{ WorkerID string }
	if err := json.Unmarshal([]byte(decoded), &leaf); code != 200 || err != nil {
		t.Fatalf("GET decodeSnowflakeId = %d %q (%v), want Leaf's JSON", code, decoded, err)
	}
	workerID := strconv.FormatInt(d.heartbeat.WorkerID(), 10)
	if leaf.WorkerID != workerID {
		t.Errorf("decoded workerId %q, want this node's %s", leaf.WorkerID, workerID)
	}

	// The same generators over NATS; discovery's metadata.
	nc, c := exactClient(t, d)
	ctx := testutil.Context(t, 20*time.Second)
	if id, err := c.Segment(ctx, SampleTagName); err != nil || id != 5 {
		t.Errorf("NATS segment = %d, %v; want 5, after the 4 HTTP took", id, err)
	}
	msg, err := nc.Request("$SRV.INFO.leaf", nil, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var info struct {
		Version  string
		Metadata map[string]string
	}
	if err := json.Unmarshal(msg.Data, &info); err != nil || info.Metadata["node_id"] != "test-node" || info.Metadata["worker_id"] != workerID {
		t.Errorf("$SRV.INFO metadata %v (%v): want node_id test-node and worker_id %s", info.Metadata, err, workerID)
	}
	build := buildinfo.Read()
	if info.Version != build.Semver() || info.Metadata[wire.MetaBuild] != build.String() {
		t.Errorf("$SRV.INFO version %q, metadata %s %q: want %q and %q (internal/buildinfo)", info.Version, wire.MetaBuild, info.Metadata[wire.MetaBuild], build.Semver(), build.String())
	}
	if want := "version: " + build.String() + "\n"; !strings.Contains(banner.String(), want) {
		t.Errorf("banner %q: want the line %q", banner.String(), want)
	}
	if v, ok := metricValue(testutil.Scrape(t, base+"/metrics"), "leafbus_build_info",
		map[string]string{"version": build.Version, "revision": build.Revision, "goversion": build.GoVersion}); !ok || v != 1 {
		t.Errorf("leafbus_build_info{version=%q,revision=%q,goversion=%q} = %v (there: %v), want 1", build.Version, build.Revision, build.GoVersion, v, ok)
	}

	testutil.Eventually(t, 10*time.Second, "/readyz 200", func() bool {
		code, _ := httpGet(t, base+"/readyz")
		return code == 200
	})
	checkScrape(t, base+"/metrics", workerID)
	if code, page := httpGet(t, base+"/"); code != 200 || !strings.Contains(page, SampleTagName) || !strings.Contains(page, "test-node") || !strings.Contains(page, "version "+build.String()) {
		t.Errorf("GET / = %d, want the status page naming the node, the sample tag and version %q:\n%s", code, build.String(), page)
	}

	if err := d.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if conn, err := net.DialTimeout("tcp", addr.String(), time.Second); err == nil {
		conn.Close()
		t.Errorf("HTTP still accepts connections on %s after Close", addr)
	}
}

// checkScrape parses /metrics and checks what the requests of TestHTTPServesBesideNATS
// moved, per transport, and the state of the parts.
func checkScrape(t *testing.T, url, workerID string) {
	t.Helper()
	fams := testutil.Scrape(t, url)
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64 // -1: any value, as long as the series is there
	}{
		{"leafbus_requests_total", map[string]string{"transport": "http", "kind": "segment", "code": "200"}, 2},
		{"leafbus_requests_total", map[string]string{"transport": "http", "kind": "segment", "code": "404"}, 1},
		{"leafbus_requests_total", map[string]string{"transport": "http", "kind": "decode", "code": "200"}, 1},
		{"leafbus_ids_issued_total", map[string]string{"transport": "http", "kind": "segment"}, 4},
		{"leafbus_ids_issued_total", map[string]string{"transport": "http", "kind": "snowflake"}, 1},
		{"leafbus_requests_total", map[string]string{"transport": "nats", "kind": "segment", "code": "200"}, 1},
		{"leafbus_ids_issued_total", map[string]string{"transport": "nats", "kind": "segment"}, 1},
		{"leafbus_snowflake_worker_id", map[string]string{"registry": "kv"}, float64(mustAtoi(t, workerID))},
		{"leafbus_snowflake_lease_state", map[string]string{"state": "held"}, 1},
		{"leafbus_segment_remaining_ids", map[string]string{"tag": SampleTagName}, -1},
		{"leafbus_segment_store_loads_total", map[string]string{"tag": SampleTagName}, -1},
		{"leafbus_nats_connections", nil, -1},
		{"leafbus_faults_total", nil, -1},
		{"leafbus_nats_jetstream_used_bytes", map[string]string{"storage": "file"}, -1},
	} {
		got, ok := metricValue(fams, c.name, c.labels)
		if !ok || (c.want >= 0 && got != c.want) {
			t.Errorf("%s%v = %v (there: %v), want %v", c.name, c.labels, got, ok, c.want)
		}
	}
}

func mustAtoi(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// TestHTTPAddressTaken: PROTOCOL.md's rule for --http, on a port this test holds (never
// the real default, which may be anyone's): taken and not given explicitly, the
// dispenser warns and serves without HTTP; taken and explicit, it refuses to start,
// naming the flag; empty, HTTP is off.
func TestHTTPAddressTaken(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()

	t.Run("DefaultTaken", func(t *testing.T) {
		cfg := testConfig(t)
		cfg.HTTP, cfg.HTTPExplicit = taken.Addr().String(), false
		banner := &testutil.SyncBuffer{}
		d, err := newTest(t, cfg, WithBanner(banner))
		if err != nil {
			t.Fatalf("New with the default address taken = %v, want a start without HTTP", err)
		}
		runUntilCleanup(t, d)
		if d.HTTPAddr() != nil || strings.Contains(banner.String(), "status page") {
			t.Errorf("HTTPAddr() = %v, banner %q; want no HTTP", d.HTTPAddr(), banner.String())
		}
	})
	t.Run("ExplicitTaken", func(t *testing.T) {
		cfg := testConfig(t)
		cfg.HTTP, cfg.HTTPExplicit = taken.Addr().String(), true
		_, err := newTest(t, cfg)
		if err == nil || !strings.Contains(err.Error(), "--http "+taken.Addr().String()) {
			t.Fatalf("New with an explicit address taken = %v, want a start-up error naming --http %s", err, taken.Addr())
		}
		// The failed start gave everything back: the same configuration on a free port starts.
		cfg.HTTP = "127.0.0.1:0"
		if _, err := newTest(t, cfg); err != nil {
			t.Fatalf("New after the failed start = %v", err)
		}
	})
	t.Run("Off", func(t *testing.T) {
		cfg := testConfig(t)
		cfg.HTTP, cfg.HTTPExplicit = "", true
		d, err := newTest(t, cfg)
		if err != nil {
			t.Fatal(err)
		}
		if d.HTTPAddr() != nil {
			t.Errorf("HTTPAddr() = %v with --http \"\", want nil", d.HTTPAddr())
		}
	})
	t.Run("BadAddress", func(t *testing.T) {
		cfg := testConfig(t)
		cfg.HTTP = ":8080"
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), `--http ":8080"`) {
			t.Errorf("Validate with --http :8080 = %v, want an error naming it", err)
		}
	})
}

// TestHTTPConnCap: --http-max-conns stands while the open file limit leaves 1,024
// descriptors to the rest of the process (half of a smaller limit), and is lowered
// otherwise; an unknown limit leaves it as it is.
func TestHTTPConnCap(t *testing.T) {
	limit := func(n uint64, err error) func() (uint64, error) { return func() (uint64, error) { return n, err } }
	tests := []struct {
		name                   string
		flag                   int
		soft                   func() (uint64, error)
		wantMax                int
		wantLimit, wantReserve uint64
	}{
		{"OK/large limit", 4096, limit(1<<20, nil), 4096, 1 << 20, 1024},
		{"OK/just enough", 4096, limit(5120, nil), 4096, 5120, 1024},
		{"Lowered/4096", 4096, limit(4096, nil), 3072, 4096, 1024},
		{"Lowered/2048", 4096, limit(2048, nil), 1024, 2048, 1024},
		{"Lowered/1024 keeps half", 4096, limit(1024, nil), 512, 1024, 512},
		{"Lowered/tiny", 4096, limit(1, nil), 1, 1, 0},
		{"OK/unknown", 4096, limit(0, errors.New("no rlimit here")), 4096, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			gotMax, gotLimit, gotReserve := httpConnCap(tt.flag, tt.soft)
			if gotMax != tt.wantMax || gotLimit != tt.wantLimit || gotReserve != tt.wantReserve {
				t.Errorf("httpConnCap(%d) = %d, %d, %d; want %d, %d, %d", tt.flag, gotMax, gotLimit, gotReserve, tt.wantMax, tt.wantLimit, tt.wantReserve)
			}
		})
	}
}
