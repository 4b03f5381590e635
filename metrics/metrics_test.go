package metrics_test

import (
	"fmt"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	lbtest "github.com/leafbus/leafbus/internal/testutil"
	dto "github.com/prometheus/client_model/go"

	"github.com/leafbus/leafbus/internal/buildinfo"
	"github.com/leafbus/leafbus/metrics"
)

// value returns the value of the one sample of family name whose labels include want.
func value(tb testing.TB, families map[string]*dto.MetricFamily, name string, want map[string]string) float64 {
	tb.Helper()
	f := families[name]
	if f == nil {
		tb.Fatalf("no metric family %s in the scrape", name)
	}
	for _, m := range f.GetMetric() {
		if hasLabels(m, want) {
			switch {
			case m.Counter != nil:
				return m.Counter.GetValue()
			case m.Gauge != nil:
				return m.Gauge.GetValue()
			case m.Histogram != nil:
				return float64(m.Histogram.GetSampleCount())
			case m.Summary != nil:
				return float64(m.Summary.GetSampleCount())
			}
		}
	}
	tb.Fatalf("%s: no sample with labels %v", name, want)
	return 0
}

func hasLabels(m *dto.Metric, want map[string]string) bool {
	have := map[string]string{}
	for _, l := range m.GetLabel() {
		have[l.GetName()] = l.GetValue()
	}
	for k, v := range want {
		if have[k] != v {
			return false
		}
	}
	return true
}

func labelValues(f *dto.MetricFamily, label string) map[string]bool {
	out := map[string]bool{}
	for _, m := range f.GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == label {
				out[l.GetValue()] = true
			}
		}
	}
	return out
}

func newServer(tb testing.TB, cfg metrics.Config) (*metrics.Metrics, string) {
	tb.Helper()
	m, err := metrics.New(cfg)
	if err != nil {
		tb.Fatalf("New: %v", err)
	}
	srv := httptest.NewServer(m.Handler())
	tb.Cleanup(srv.Close)
	return m, srv.URL + "/metrics"
}

func TestCountersMoveWithTraffic(t *testing.T) {
	m, url := newServer(t, metrics.Config{Build: buildinfo.Info{Version: "v1.2.3", Revision: "0123456789ab", GoVersion: "go1.26.8"}, MaxTags: 10})
	ok := map[string]string{"transport": "nats", "kind": "segment", "code": "200"}
	before := lbtest.Scrape(t, url)
	if got := value(t, before, "leafbus_requests_total", ok); got != 0 {
		t.Fatalf("requests before traffic = %v, want 0 (the known series start at 0)", got)
	}
	for range 3 {
		m.Observe(metrics.NATS, "segment", 200, 0.0002, 10)
	}
	m.Observe(metrics.HTTP, "snowflake", 503, 0.001, 0)
	m.Observe(metrics.HTTP, "snowflake", 200, 0.0004, 1)
	m.Observe(metrics.HTTP, metrics.KindDecode, 400, 0.00001, 0)
	m.Rejected(metrics.HTTP)

	after := lbtest.Scrape(t, url)
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"leafbus_requests_total", ok, 3},
		{"leafbus_requests_total", map[string]string{"transport": "http", "kind": "snowflake", "code": "503"}, 1},
		{"leafbus_requests_total", map[string]string{"transport": "http", "kind": "snowflake", "code": "200"}, 1},
		{"leafbus_requests_total", map[string]string{"transport": "http", "kind": "decode", "code": "400"}, 1},
		{"leafbus_ids_issued_total", map[string]string{"transport": "nats", "kind": "segment"}, 30},
		{"leafbus_ids_issued_total", map[string]string{"transport": "http", "kind": "snowflake"}, 1},
		{"leafbus_request_duration_seconds", map[string]string{"transport": "nats", "kind": "segment"}, 3},
		{"leafbus_requests_rejected_total", map[string]string{"transport": "http"}, 1},
		{"leafbus_build_info", map[string]string{"version": "v1.2.3", "revision": "0123456789ab", "goversion": "go1.26.8"}, 1},
	} {
		if got := value(t, after, c.name, c.labels); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	want := map[string]metrics.Total{
		"nats/segment":   {Transport: "nats", Kind: "segment", Requests: 3, IDs: 30},
		"http/snowflake": {Transport: "http", Kind: "snowflake", Requests: 2, Errors: 1, IDs: 1},
		"http/decode":    {Transport: "http", Kind: "decode", Requests: 1, Errors: 1},
		"nats/decode":    {Transport: "nats", Kind: "decode"},
	}
	totals := m.Totals()
	if len(totals) != 6 {
		t.Errorf("Totals has %d rows, want 6 (2 transports x 3 kinds)", len(totals))
	}
	for _, got := range totals {
		if w, ok := want[got.Transport+"/"+got.Kind]; ok && got != w {
			t.Errorf("Totals: %+v, want %+v", got, w)
		}
	}
	for _, fam := range []string{"go_goroutines", "process_cpu_seconds_total", "process_resident_memory_bytes"} {
		if after[fam] == nil {
			t.Errorf("no %s: the Go runtime and process collectors must be registered", fam)
		}
	}
}

func TestUnknownLabelsAreBounded(t *testing.T) {
	m, url := newServer(t, metrics.Config{MaxTags: 1})
	for i := range 50 {
		m.Observe(fmt.Sprintf("carrier-pigeon-%d", i), fmt.Sprintf("kind-%d", i), 200, 0.001, 1)
	}
	fams := lbtest.Scrape(t, url)
	if got := labelValues(fams["leafbus_requests_total"], "transport"); len(got) != 3 || !got["other"] {
		t.Errorf("transport values = %v, want nats, http and other", got)
	}
	if got := value(t, fams, "leafbus_requests_total", map[string]string{"transport": "other", "kind": "other"}); got != 50 {
		t.Errorf("requests of unknown transport and kind = %v, want 50", got)
	}
}

// tagsFixture returns n tags, tag-i having issued i*10 IDs.
func tagsFixture(n int) []metrics.SegmentTag {
	tags := make([]metrics.SegmentTag, n)
	for i := range tags {
		tags[i] = metrics.SegmentTag{
			Tag:       fmt.Sprintf("tag-%03d", i),
			Current:   metrics.Segment{Value: 100, Max: 110, Step: 10},
			NextReady: i%2 == 0,
			Step:      10,
			Issued:    uint64(i * 10),
			Loads:     2,
			LastLoad:  time.Unix(1_700_000_000+int64(i), 0),
		}
	}
	return tags
}

func TestTagLabelNeverExceedsItsBound(t *testing.T) {
	const maxTags = 5
	var mu sync.Mutex
	tags := tagsFixture(3)
	_, url := newServer(t, metrics.Config{MaxTags: maxTags, Sources: metrics.Sources{
		SegmentTags: func() []metrics.SegmentTag { mu.Lock(); defer mu.Unlock(); return tags },
	}})
	perTag := []string{
		"leafbus_segment_remaining_ids", "leafbus_segment_next_ready", "leafbus_segment_step_ids",
		"leafbus_segment_store_loads_total", "leafbus_segment_store_load_errors_total",
		"leafbus_segment_store_load_duration_seconds", "leafbus_segment_last_load_timestamp_seconds",
	}
	for _, n := range []int{3, maxTags, maxTags + 1, 40} {
		mu.Lock()
		tags = tagsFixture(n)
		tags = append(tags, metrics.SegmentTag{Tag: metrics.OtherTag, Issued: 1 << 40, LastLoad: time.Now()}) // a real tag of that name
		mu.Unlock()
		fams := lbtest.Scrape(t, url)
		if got := value(t, fams, "leafbus_segment_tags", nil); got != float64(n+1) {
			t.Errorf("%d tags: leafbus_segment_tags = %v, want %d", n, got, n+1)
		}
		for _, name := range perTag {
			seen := labelValues(fams[name], "tag")
			if len(seen) > maxTags+1 {
				t.Errorf("%d tags: %s has %d tag values, want at most %d", n, name, len(seen), maxTags+1)
			}
			if !seen[metrics.OtherTag] {
				t.Errorf("%d tags: %s has no tag=%q", n, name, metrics.OtherTag)
			}
		}
		// The busiest are shown by name: tag-(n-1) issued the most.
		if got := labelValues(fams["leafbus_segment_step_ids"], "tag"); !got[fmt.Sprintf("tag-%03d", n-1)] {
			t.Errorf("%d tags: the busiest tag is not shown: %v", n, got)
		}
		// _other sums the rest, the real "_other" tag among them.
		shown := min(n, maxTags)
		if got := value(t, fams, "leafbus_segment_store_loads_total", map[string]string{"tag": metrics.OtherTag}); got != float64(2*(n-shown)) {
			t.Errorf("%d tags: loads of _other = %v, want %d", n, got, 2*(n-shown))
		}
	}
}

func TestBusiestAndSum(t *testing.T) {
	tags := tagsFixture(6)
	top, rest := metrics.Busiest(tags, 2)
	if len(top) != 2 || top[0].Tag != "tag-005" || top[1].Tag != "tag-004" {
		t.Fatalf("Busiest top = %v, want tag-005, tag-004", names(top))
	}
	sum, ready := metrics.Sum(metrics.OtherTag, rest)
	if ready != 2 || sum.Loads != 8 || sum.Current.Remaining() != 40 || sum.Issued != 60 {
		t.Errorf("Sum of %v = %+v ready %d, want loads 8, remaining 40, issued 60, ready 2", names(rest), sum, ready)
	}
	if !sum.LastLoad.Equal(time.Unix(1_700_000_003, 0)) {
		t.Errorf("Sum LastLoad = %v, want the latest of the rest", sum.LastLoad)
	}
	if top, rest := metrics.Busiest(tags, 0); len(top) != 0 || len(rest) != 6 {
		t.Errorf("Busiest(0) = %d top, %d rest, want 0 and 6", len(top), len(rest))
	}
}

func names(tags []metrics.SegmentTag) []string {
	var out []string
	for _, t := range tags {
		out = append(out, t.Tag)
	}
	return out
}

func TestStateMetrics(t *testing.T) {
	_, url := newServer(t, metrics.Config{MaxTags: 100, Sources: metrics.Sources{
		Snowflake: func() (metrics.Snowflake, bool) {
			return metrics.Snowflake{
				WorkerID: 7, Registry: "zk", Lease: metrics.LeaseSuspended, Record: 1_763_790_000_123,
				Offset: 3 * time.Millisecond, Borrowed: 250 * time.Millisecond, Refused: 9,
			}, true
		},
		Pools: func() []metrics.Pool {
			return []metrics.Pool{{Kind: "segment", Tag: "orders", Where: "replies", Size: 100, Depth: 8, Ready: 5}}
		},
		NATS: func() metrics.NATSServer {
			return metrics.NATSServer{Connections: 4, JetStreamStore: 4096, JetStreamMaxStore: 1 << 30}
		},
		Recovery: func() metrics.Recovery {
			return metrics.Recovery{Faults: 3, InFault: true, Last: 120 * time.Millisecond, Max: 1500 * time.Millisecond}
		},
	}})
	fams := lbtest.Scrape(t, url)
	pool := map[string]string{"kind": "segment", "tag": "orders", "pool": "replies"}
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"leafbus_snowflake_worker_id", map[string]string{"registry": "zk"}, 7},
		{"leafbus_snowflake_lease_state", map[string]string{"state": "suspended"}, 1},
		{"leafbus_snowflake_lease_state", map[string]string{"state": "held"}, 0},
		{"leafbus_snowflake_clock_record_timestamp_seconds", nil, 1_763_790_000.123},
		{"leafbus_snowflake_clock_offset_seconds", nil, 0.003},
		{"leafbus_snowflake_borrowed_seconds", nil, 0.25},
		{"leafbus_snowflake_refusals_total", nil, 9},
		{"leafbus_pool_ready_batches", pool, 5},
		{"leafbus_pool_depth_batches", pool, 8},
		{"leafbus_pool_prepared_ids", pool, 500},
		{"leafbus_nats_connections", nil, 4},
		{"leafbus_nats_jetstream_used_bytes", map[string]string{"storage": "file"}, 4096},
		{"leafbus_nats_jetstream_limit_bytes", map[string]string{"storage": "file"}, 1 << 30},
		{"leafbus_faults_total", nil, 3},
		{"leafbus_fault_active", nil, 1},
		{"leafbus_recovery_last_seconds", nil, 0.12},
		{"leafbus_recovery_max_seconds", nil, 1.5},
	} {
		if got := value(t, fams, c.name, c.labels); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
}

// TestMonotonicMetrics: each monotonic tag shows its role (one of the four at 1) and its
// counts, the first MaxTags by name; the rest, a real tag named "_other" among them, are
// summed under tag="_other", whose role series count the tags in each role.
func TestMonotonicMetrics(t *testing.T) {
	mono := metrics.Monotonic{RefusedReplies: 2, Tags: []metrics.MonotonicTag{
		{Tag: "orders", Role: metrics.RoleLeader, Terms: 3, Forwarded: 0},
		{Tag: "bills", Role: metrics.RoleFollower, Terms: 1, Forwarded: 40, ForwardErrors: 2, ForwardMessages: 10},
		{Tag: "zeta", Role: metrics.RoleNone, Terms: 1, Forwarded: 5, ForwardErrors: 1, ForwardMessages: 5},
		{Tag: metrics.OtherTag, Role: metrics.RoleNone, Terms: 2, Forwarded: 7, ForwardErrors: 3, ForwardMessages: 7},
	}}
	_, url := newServer(t, metrics.Config{MaxTags: 2, Sources: metrics.Sources{
		Monotonic: func() metrics.Monotonic { return mono },
	}})
	fams := lbtest.Scrape(t, url)
	role := func(tag, role string) map[string]string { return map[string]string{"tag": tag, "role": role} }
	tag := func(tag string) map[string]string { return map[string]string{"tag": tag} }
	for _, c := range []struct {
		name   string
		labels map[string]string
		want   float64
	}{
		{"leafbus_monotonic_tags", nil, 4},
		{"leafbus_monotonic_refused_replies_total", nil, 2},
		{"leafbus_monotonic_role", role("bills", "follower"), 1},
		{"leafbus_monotonic_role", role("bills", "leader"), 0},
		{"leafbus_monotonic_role", role("orders", "leader"), 1},
		{"leafbus_monotonic_role", role("orders", "none"), 0},
		{"leafbus_monotonic_leases_total", tag("orders"), 3},
		{"leafbus_monotonic_forwarded_requests_total", tag("bills"), 40},
		{"leafbus_monotonic_forward_errors_total", tag("bills"), 2},
		{"leafbus_monotonic_forward_messages_total", tag("bills"), 10},
		// zeta and the real "_other" tag: both without a leader.
		{"leafbus_monotonic_role", role(metrics.OtherTag, "none"), 2},
		{"leafbus_monotonic_role", role(metrics.OtherTag, "leader"), 0},
		{"leafbus_monotonic_leases_total", tag(metrics.OtherTag), 3},
		{"leafbus_monotonic_forwarded_requests_total", tag(metrics.OtherTag), 12},
		{"leafbus_monotonic_forward_errors_total", tag(metrics.OtherTag), 4},
		{"leafbus_monotonic_forward_messages_total", tag(metrics.OtherTag), 12},
	} {
		if got := value(t, fams, c.name, c.labels); got != c.want {
			t.Errorf("%s%v = %v, want %v", c.name, c.labels, got, c.want)
		}
	}
	if got := labelValues(fams["leafbus_monotonic_role"], "tag"); len(got) != 3 || got["zeta"] {
		t.Errorf("leafbus_monotonic_role tags = %v, want bills, orders and %s", got, metrics.OtherTag)
	}
	if got := len(fams["leafbus_monotonic_role"].GetMetric()); got != 3*len(metrics.MonotonicRoles) {
		t.Errorf("leafbus_monotonic_role has %d series, want one per role for each of 3 tag values", got)
	}

	mono = metrics.Monotonic{Tags: []metrics.MonotonicTag{{Tag: "orders", Role: metrics.RoleStarting}}}
	fams = lbtest.Scrape(t, url)
	if got := labelValues(fams["leafbus_monotonic_role"], "tag"); got[metrics.OtherTag] {
		t.Errorf("one tag under MaxTags: %s shown (%v)", metrics.OtherTag, got)
	}
	if got := value(t, fams, "leafbus_monotonic_role", role("orders", "starting")); got != 1 {
		t.Errorf("orders starting = %v, want 1", got)
	}
}

// TestNamingConventions runs Prometheus' own linter over every leafbus_ metric.
func TestNamingConventions(t *testing.T) {
	m, err := metrics.New(metrics.Config{MaxTags: 3, Sources: metrics.Sources{
		SegmentTags: func() []metrics.SegmentTag { return tagsFixture(5) },
		Snowflake:   func() (metrics.Snowflake, bool) { return metrics.Snowflake{Lease: metrics.LeaseHeld}, true },
		Pools:       func() []metrics.Pool { return []metrics.Pool{{Kind: "snowflake", Tag: "a", Where: "stream"}} },
		NATS:        func() metrics.NATSServer { return metrics.NATSServer{} },
		Recovery:    func() metrics.Recovery { return metrics.Recovery{} },
		Monotonic: func() metrics.Monotonic {
			return metrics.Monotonic{Tags: []metrics.MonotonicTag{{Tag: "a", Role: metrics.RoleLeader}, {Tag: "b"}, {Tag: "c"}, {Tag: "d"}}}
		},
	}})
	if err != nil {
		t.Fatal(err)
	}
	m.Observe(metrics.NATS, "segment", 200, 0.001, 1)
	problems, err := testutil.GatherAndLint(m.Gatherer())
	if err != nil {
		t.Fatalf("GatherAndLint: %v", err)
	}
	for _, p := range problems {
		if strings.HasPrefix(p.Metric, "leafbus_") {
			t.Errorf("lint %s: %s", p.Metric, p.Text)
		}
	}
	fams, err := m.Gatherer().Gather()
	if err != nil {
		t.Fatalf("Gather: %v", err)
	}
	for _, f := range fams {
		name := f.GetName()
		if !strings.HasPrefix(name, "leafbus_") && !strings.HasPrefix(name, "go_") && !strings.HasPrefix(name, "process_") && !strings.HasPrefix(name, "promhttp_") {
			t.Errorf("metric %s: want the leafbus_ prefix", name)
		}
		if f.GetType() == dto.MetricType_COUNTER && !strings.HasSuffix(name, "_total") {
			t.Errorf("counter %s does not end in _total", name)
		}
	}
}

func TestObserveAllocatesNothing(t *testing.T) {
	m, err := metrics.New(metrics.Config{})
	if err != nil {
		t.Fatal(err)
	}
	if n := testing.AllocsPerRun(1000, func() { m.Observe(metrics.NATS, "snowflake", 200, 0.0001, 1) }); n != 0 {
		t.Errorf("Observe allocates %v times per call, want 0", n)
	}
}

// TestObserveWhileScraping runs requests and scrapes together, for the race detector.
func TestObserveWhileScraping(t *testing.T) {
	m, url := newServer(t, metrics.Config{MaxTags: 2, Sources: metrics.Sources{
		SegmentTags: func() []metrics.SegmentTag { return tagsFixture(4) },
	}})
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for range 500 {
				m.Observe(transportsFor(g), "segment", 200, 0.0001, 2)
			}
		})
	}
	for range 5 {
		lbtest.Scrape(t, url)
	}
	wg.Wait()
	fams := lbtest.Scrape(t, url)
	got := value(t, fams, "leafbus_ids_issued_total", map[string]string{"transport": "nats", "kind": "segment"}) +
		value(t, fams, "leafbus_ids_issued_total", map[string]string{"transport": "http", "kind": "segment"})
	if got != 4*500*2 {
		t.Errorf("IDs issued = %v, want %d", got, 4*500*2)
	}
}

func transportsFor(g int) string {
	if g%2 == 0 {
		return metrics.NATS
	}
	return metrics.HTTP
}

func TestConfigValidate(t *testing.T) {
	if _, err := metrics.New(metrics.Config{MaxTags: -1}); err == nil || !strings.Contains(err.Error(), "--metrics-max-tags -1") {
		t.Errorf("New(MaxTags -1) = %v, want an error naming the flag and value", err)
	}
}

func BenchmarkObserve(b *testing.B) {
	m, err := metrics.New(metrics.Config{})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			m.Observe(metrics.NATS, "segment", 200, 0.0001, 1)
		}
	})
}
