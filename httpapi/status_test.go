package httpapi_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"github.com/leafbus/leafbus/core"
	"github.com/leafbus/leafbus/httpapi"
	"github.com/leafbus/leafbus/internal/buildinfo"
	"github.com/leafbus/leafbus/metrics"
	"github.com/leafbus/leafbus/segment"
	"github.com/leafbus/leafbus/snowflake"
)

// screenshotTo, when set (go test ./httpapi -run StatusPage -screenshot ../docs/status-page.png),
// is where the status page test also saves its desktop screenshot, for the README.
var screenshotTo = flag.String("screenshot", "", "also save the status page screenshot to this PNG file")

// chromiumPath is Debian's chromium, which make deps installs.
const chromiumPath = "/usr/bin/chromium"

// chromium returns the browser's path, or fails the test saying how to get it: a
// missing browser never passes silently.
func chromium(tb testing.TB) string {
	tb.Helper()
	path := chromiumPath
	if p := os.Getenv("LEAFBUS_CHROMIUM"); p != "" {
		path = p
	}
	if _, err := exec.LookPath(path); err != nil {
		tb.Fatalf("headless Chromium not found at %s (%v): run `make deps`, which installs Debian's chromium package", path, err)
	}
	return path
}

// browser starts headless Chromium as the machine allows it (root: no sandbox; no
// network: none of its background connections) with a fresh profile, and returns a
// tab bounded by d.
func browser(tb testing.TB, d time.Duration) context.Context {
	tb.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromium(tb)),
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-quic", true),
		chromedp.UserDataDir(tb.TempDir()),
		chromedp.WindowSize(1280, 900),
	)
	ctx, cancel := context.WithTimeout(context.Background(), d)
	tb.Cleanup(cancel)
	actx, acancel := chromedp.NewExecAllocator(ctx, opts...)
	tb.Cleanup(acancel)
	tctx, tcancel := chromedp.NewContext(actx, chromedp.WithLogf(tb.Logf))
	tb.Cleanup(tcancel)
	return tctx
}

// countingSegments stands in for the per-tag stats the dispenser takes from
// segment.Generator: it wraps the real generator, counts what the HTTP face took from
// it, and reads max_id and step from the store's rows.
type countingSegments struct {
	*segment.Generator
	store *segment.InmemStore

	mu     sync.Mutex
	last   map[string]int64
	issued map[string]uint64
}

func (c *countingSegments) TryFill(tag string, dst []int64) (bool, error) {
	ok, err := c.Generator.TryFill(tag, dst)
	if ok && err == nil {
		c.record(tag, dst)
	}
	return ok, err
}

func (c *countingSegments) Fill(ctx context.Context, tag string, dst []int64) error {
	err := c.Generator.Fill(ctx, tag, dst)
	if err == nil {
		c.record(tag, dst)
	}
	return err
}

func (c *countingSegments) record(tag string, ids []int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.last[tag] = ids[len(ids)-1]
	c.issued[tag] += uint64(len(ids))
}

func (c *countingSegments) Tags() []metrics.SegmentTag {
	rows, _ := c.store.Tags(context.Background())
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []metrics.SegmentTag
	for _, r := range rows {
		t := metrics.SegmentTag{Tag: r.Name, Step: r.Step, Issued: c.issued[r.Name], LastLoad: r.UpdateTime}
		if last, ok := c.last[r.Name]; ok {
			t.Current = metrics.Segment{Value: last + 1, Max: r.MaxID, Step: r.Step}
			t.Loads = 1
		}
		out = append(out, t)
	}
	return out
}

// statusServer serves the status page of a node with real generators (worker 42), the
// in-memory store's rows, a pool and a two-node cluster.
func statusServer(tb testing.TB) (addr string) {
	tb.Helper()
	gen, store := newSegments(tb,
		segment.Tag{Name: "orders", MaxID: 1, Step: 1000, Description: "order IDs"},
		segment.Tag{Name: "payments", MaxID: 5001, Step: 500},
		segment.Tag{Name: "leaf-segment-test", MaxID: 1, Step: 2000},
	)
	segs := &countingSegments{Generator: gen, store: store, last: map[string]int64{}, issued: map[string]uint64{}}
	sf, err := snowflake.New(snowflake.Config{WorkerID: 42})
	if err != nil {
		tb.Fatal(err)
	}
	sources := metrics.Sources{
		SegmentTags: segs.Tags,
		Snowflake: func() (metrics.Snowflake, bool) {
			st := sf.Stats()
			return metrics.Snowflake{
				WorkerID: sf.WorkerID(), Registry: "kv", Lease: metrics.LeaseHeld, LeaseTTL: 30 * time.Second,
				Record: time.Now().UnixMilli(), LastRecord: time.Now().Add(-time.Second),
				Offset: st.Offset, Borrowed: st.Borrowed, Issued: st.Issued, Refused: st.Refused,
			}, true
		},
		Pools: func() []metrics.Pool {
			return []metrics.Pool{{Kind: "snowflake", Tag: "bulk", Where: "replies", Size: 1000, Depth: 4, Ready: 3}}
		},
	}
	m, err := metrics.New(metrics.Config{Build: buildinfo.Info{Version: "v1.4.0"}, MaxTags: 100, Sources: sources})
	if err != nil {
		tb.Fatal(err)
	}
	cfg := httpapi.DefaultConfig()
	cfg.Core = coreOf(tb, func(c *core.Config) { c.Segments, c.Snowflakes = segs, sf })
	cfg.Version, cfg.Metrics = "1.4.0", m
	cfg.Readiness = core.ReadinessFunc(func() core.Health {
		return core.Health{TagsLoaded: true, WorkerIDHeld: true, LastBeat: time.Now()}
	})
	cfg.Status = httpapi.Status{
		NodeID: "dispenser-1", Prefix: "leaf", NATS: "nats://127.0.0.1:4222", SegmentStore: "kv",
		Sources: sources, Rows: store, Refresh: 5 * time.Second, MaxTags: 200, FetchTimeout: time.Second,
		TagRange: func(tag string) string {
			if tag == "payments" {
				return "opaque, 53 bits"
			}
			return ""
		},
		Cluster: func(context.Context) ([]httpapi.Peer, error) {
			return []httpapi.Peer{
				{NodeID: "dispenser-1", Version: "1.4.0", WorkerID: 42, Clock: time.Now()},
				{NodeID: "dispenser-2", Version: "1.4.0", WorkerID: 7, Clock: time.Now().Add(3 * time.Millisecond)},
			}, nil
		},
	}
	_, addr = startServer(tb, cfg)
	return addr
}

// TestStatusPageInBrowser loads the status page in headless Chromium, reads what a
// person sees, takes IDs over HTTP and checks the page shows them after its reload,
// and looks at it as a phone would.
func TestStatusPageInBrowser(t *testing.T) {
	addr := statusServer(t)
	url := "http://" + addr + "/"
	get(t, "http://"+addr+"/api/segment/get/orders?count=5")
	get(t, "http://"+addr+"/api/snowflake/get/orders?count=3")
	ctx := browser(t, 90*time.Second)

	must(t, "load the page", chromedp.Do(ctx, chromedp.Navigate(url), chromedp.WaitVisible(chromedp.CSS("#segments"))))
	body := text(t, ctx, "body")
	for _, want := range []string{
		"dispenser-1", "dispenser-2", "orders", "payments", "leaf-segment-test", "order IDs", "bulk",
		"worker id", "kv", "held", "1.4.0", "ready",
	} {
		// Headings show in capitals (CSS), so compare without case.
		if !strings.Contains(strings.ToLower(body), strings.ToLower(want)) {
			t.Errorf("the page does not show %q; it shows:\n%s", want, body)
		}
	}
	if got := text(t, ctx, "#worker-id"); got != "42" {
		t.Errorf("worker ID shown: %q, want 42", got)
	}
	before := number(t, text(t, ctx, "#issued-segment"))

	get(t, "http://"+addr+"/api/segment/get/orders?count=7")
	get(t, "http://"+addr+"/api/segment/get/payments")
	must(t, "reload", chromedp.Do(ctx, chromedp.Reload(), chromedp.WaitVisible(chromedp.CSS("#segments"))))
	if after := number(t, text(t, ctx, "#issued-segment")); after != before+8 {
		t.Errorf("segment IDs issued after 8 more: %d, want %d", after, before+8)
	}
	if row := text(t, ctx, "#segments tbody"); !strings.Contains(row, "13") || !strings.Contains(row, "5002") {
		t.Errorf("segment rows after the requests do not show orders at 13 and payments at 5002:\n%s", row)
	}

	refresh, err := chromedp.Run(ctx, chromedp.Evaluate[string](`document.querySelector('meta[http-equiv="refresh"]').content`))
	must(t, "read the refresh", err)
	if refresh != "5" {
		t.Errorf("meta refresh %q, want 5 (seconds)", refresh)
	}
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	must(t, "screenshot", err)
	save(t, "status-page.png", png)
	if *screenshotTo != "" {
		must(t, "save the README screenshot", os.WriteFile(*screenshotTo, png, 0o644))
	}

	// A phone: 390 CSS pixels wide; the page must fit without sideways scrolling
	// (wide tables scroll inside their own box).
	must(t, "phone viewport", chromedp.Do(ctx,
		chromedp.EmulateViewport(390, 844, chromedp.EmulateMobile, chromedp.EmulatePortrait, chromedp.EmulateScale(3)),
		chromedp.Reload(), chromedp.WaitVisible(chromedp.CSS("#segments"))))
	overflow, err := chromedp.Run(ctx, chromedp.Evaluate[int](`document.documentElement.scrollWidth - window.innerWidth`))
	must(t, "measure the page", err)
	if overflow > 0 {
		t.Errorf("on a 390px phone the page is %dpx wider than the screen", overflow)
	}
	if got := text(t, ctx, "#worker-id"); got != "42" {
		t.Errorf("worker ID on a phone: %q, want 42", got)
	}
	phone, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	must(t, "phone screenshot", err)
	save(t, "status-page-phone.png", phone)
}

// TestStatusPageWithoutJavaScript: the page is complete as served; there is no script.
func TestStatusPageWithoutJavaScript(t *testing.T) {
	addr := statusServer(t)
	get(t, "http://"+addr+"/api/segment/get/orders")
	status, body := get(t, "http://"+addr+"/")
	if status != 200 {
		t.Fatalf("GET /: %d", status)
	}
	for _, want := range []string{`<meta name="viewport"`, `<meta http-equiv="refresh" content="5">`, "orders", "payments", `id="worker-id">42<`, "dispenser-2",
		"<th>range</th>", "<td>opaque, 53 bits</td>", `payments<br><span class="muted">opaque, 53 bits</span>`} {
		if !strings.Contains(body, want) {
			t.Errorf("GET / lacks %q", want)
		}
	}
	if strings.Contains(strings.ToLower(body), "<script") {
		t.Error("the status page holds a script; it must read complete without JavaScript")
	}
}

// TestStatusPageShowsSourceErrors: a store or discovery that fails is said on the page,
// and the rest still renders.
func TestStatusPageShowsSourceErrors(t *testing.T) {
	cfg := httpapi.DefaultConfig()
	cfg.Status.NodeID = "lonely"
	cfg.Status.Rows = failingRows{}
	cfg.Status.Cluster = func(context.Context) ([]httpapi.Peer, error) { return nil, errors.New("no $SRV answer\nwithin 1s") }
	_, addr := startServer(t, cfg)
	status, body := get(t, "http://"+addr+"/")
	if status != 200 || !strings.Contains(body, "Cannot read the store: store down") || !strings.Contains(body, "Discovery: no $SRV answer; within 1s") {
		t.Errorf("GET /: %d, want the two errors on the page:\n%s", status, body)
	}
	if !strings.Contains(body, "not ready") {
		t.Error("a node without a readiness source must show as not ready")
	}
}

type failingRows struct{}

func (failingRows) Tags(context.Context) ([]segment.Tag, error) { return nil, errors.New("store down") }

func text(t *testing.T, ctx context.Context, css string) string {
	t.Helper()
	s, err := chromedp.Run(ctx, chromedp.Text(chromedp.CSS(css)))
	must(t, "read "+css, err)
	return strings.TrimSpace(s)
}

func number(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatalf("%q is not a number", s)
	}
	return n
}

func must(t *testing.T, what string, err error) {
	t.Helper()
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// save keeps a screenshot among the test's artifacts (go test -artifacts keeps them).
func save(t *testing.T, name string, png []byte) {
	t.Helper()
	path := filepath.Join(t.ArtifactDir(), name)
	must(t, "save "+name, os.WriteFile(path, png, 0o644))
	t.Logf("screenshot: %s (%d bytes)", path, len(png))
}

// TestStatusPageBoundsTheCluster: a discovery that finds 20,000 dispensers (a rogue's
// fakes) lists this node and the first others up to Status.MaxPeers, and says how many
// it found: the page's size does not grow with the fakes.
func TestStatusPageBoundsTheCluster(t *testing.T) {
	cfg := httpapi.DefaultConfig()
	cfg.Status.NodeID = "zz-self"
	cfg.Status.Cluster = func(context.Context) ([]httpapi.Peer, error) {
		peers := []httpapi.Peer{{NodeID: "zz-self", WorkerID: 1}}
		for i := range 20_000 {
			peers = append(peers, httpapi.Peer{NodeID: fmt.Sprintf("fake-%05d", i), WorkerID: -1, Clock: time.Now()})
		}
		return peers, nil
	}
	_, addr := startServer(t, cfg)
	status, body := get(t, "http://"+addr+"/")
	if status != 200 {
		t.Fatalf("GET /: %d", status)
	}
	if n := strings.Count(body, "fake-"); n != 99 {
		t.Errorf("the page lists %d fakes, want 99 (Status.MaxPeers 100 with this node)", n)
	}
	for _, want := range []string{"20001 dispensers found", "20001 found, 100 listed", "zz-self"} {
		if !strings.Contains(body, want) {
			t.Errorf("the page lacks %q", want)
		}
	}
	t.Logf("status page with 20,001 dispensers found: %d bytes", len(body))
}
