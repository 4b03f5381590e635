package main

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/leafbus/leafbus/client"
	"github.com/leafbus/leafbus/dispenser"
	"github.com/leafbus/leafbus/segment"
	"github.com/leafbus/leafbus/testenv"
	"github.com/leafbus/leafbus/wire"
)

// TestBinaryKVStoreLost: the real binary serves the sample tag, stops, and its KV
// bucket of segments is lost (the stream's files deleted). The restart refuses, exit 1,
// naming the tag and its mark, and does not create the sample tag again at 1. Started
// with --allow-store-behind, the tag is unknown; added again below the mark it answers
// 503 saying the store went backwards; `dispenser tag update --max-id` repairs it and
// serving resumes. No ID is handed out twice.
func TestBinaryKVStoreLost(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	dir := t.TempDir()
	seen := map[int64]bool{}
	tag := dispenser.SampleTagName
	p := startBinary(t, dir)
	takeIDs(t, binClient(t, p.url), tag, 3000, seen)
	stopBinary(t, p)
	mark := markOf(t, dir, tag)
	if err := os.RemoveAll(filepath.Join(dir, "jetstream", "$G", "streams", "KV_leaf_segments")); err != nil {
		t.Fatal(err)
	}

	code, stderr, took := runToExit(t, 30*time.Second, nil, "--listen", fmt.Sprintf("127.0.0.1:%d", freePort(t)), "--data-dir", dir, "--node-id", "bin-test")
	if code != 1 {
		t.Fatalf("restart over the lost store: exit %d, want 1\nstderr:\n%s", code, stderr)
	}
	for _, want := range []string{fmt.Sprintf("missing from the store: %s (mark %d)", tag, mark), "--allow-store-behind"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("the refusal does not contain %q:\n%s", want, stderr)
		}
	}
	if strings.Contains(stderr, "sample tag created") {
		t.Errorf("the sample tag was created again in a used data dir:\n%s", stderr)
	}
	t.Logf("refused in %v: %s", took.Round(time.Millisecond), lastLine(stderr))

	p = startBinary(t, dir, "--allow-store-behind")
	c := binClient(t, p.url)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if _, err := c.Segment(ctx, tag); !errors.Is(err, wire.ErrNotFound) {
		t.Fatalf("Segment of the lost tag = %v, want not found (never a fresh start at 1)", err)
	}
	runTagCmd(t, "add", "--nats", p.url, "--tag", tag, "--step", "2000")
	wantWentBack(t, c, tag)
	runTagCmd(t, "update", "--nats", p.url, "--tag", tag, "--max-id", strconv.FormatInt(mark, 10))
	waitSegment(t, c, tag, 15*time.Second, seen)
	takeIDs(t, c, tag, 3000, seen)
}

// TestBinaryKVStoreRewoundWhileRunning: while the real binary serves two tags, one
// tag's max_id in the KV bucket is put back to 1. Once the segments it holds are spent
// that tag answers 503 saying the store went backwards, and the stats count it, while
// the other tag keeps serving; `dispenser tag update --max-id` repairs it without a
// restart. No ID is handed out twice.
func TestBinaryKVStoreRewoundWhileRunning(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	p := startBinary(t, t.TempDir())
	seen := map[string]map[int64]bool{"rewound": {}, "steady": {}}
	for tag := range seen {
		runTagCmd(t, "add", "--nats", p.url, "--tag", tag, "--step", "100")
	}
	c := binClient(t, p.url)
	for tag, ids := range seen {
		takeIDs(t, c, tag, 1000, ids)
	}

	nc := connectURL(t, p.url)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	kv, err := js.KeyValue(ctx, "leaf_segments")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "rewound", []byte(`{"max_id":1,"step":100,"description":"","update_time":"2026-01-01T00:00:00Z"}`)); err != nil {
		t.Fatalf("rewind the tag: %v", err)
	}
	err = drain(t, c, "rewound", 200_000, seen["rewound"])
	if !errors.Is(err, wire.ErrUnavailable) || !strings.Contains(err.Error(), "went backwards") {
		t.Fatalf("rewound tag = %v, want 503 saying the store went backwards", err)
	}
	t.Logf("rewound tag: %v", err)
	takeIDs(t, c, "steady", 1000, seen["steady"])
	if n := storeWentBack(t, nc); n == 0 {
		t.Errorf("stats: store_went_back = 0 after a refused segment")
	}

	// The refused take moved the row on by a step, possibly past the mark: N must be
	// above both (README "When the store goes backwards").
	repair := mentionedMark(t, err) + 1_000_000
	runTagCmd(t, "update", "--nats", p.url, "--tag", "rewound", "--max-id", strconv.FormatInt(repair, 10))
	if first := waitSegment(t, c, "rewound", 15*time.Second, seen["rewound"]); first < repair {
		t.Errorf("first ID after the repair = %d, want at least the new max_id %d", first, repair)
	}
	takeIDs(t, c, "rewound", 1000, seen["rewound"])
}

// TestBinaryMySQLStoreRewound: the real binary on Leaf's leaf_alloc serves two tags and
// stops; one row is rewound (UPDATE leaf_alloc SET max_id = 1, as a restored backup
// would). The restart refuses, exit 1, naming the row's max_id and the mark; started
// with --allow-store-behind, the other tag serves, the rewound one answers 503 until
// `dispenser tag update --max-id`. Rewound again while it runs, it answers 503 again
// and is repaired again. No ID is handed out twice.
func TestBinaryMySQLStoreRewound(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	t.Parallel() // its own servers and ports: it waits beside the others (make test's longest package)
	dsn := testenv.MariaDB(t).NewDatabase(t)
	db := leafDB(t, dsn, map[string]int{"orders": 100, "users": 100})
	dir := t.TempDir()
	args := []string{"--segment-store", "mysql", "--mysql-dsn", dsn}
	seen := map[string]map[int64]bool{"orders": {}, "users": {}}
	p := startBinary(t, dir, args...)
	c := binClient(t, p.url)
	for tag, ids := range seen {
		takeIDs(t, c, tag, 1000, ids)
	}
	stopBinary(t, p)
	mark := markOf(t, dir, "orders")
	rewind(t, db, "orders")

	code, stderr, _ := runToExit(t, 30*time.Second, nil, append([]string{"--listen", fmt.Sprintf("127.0.0.1:%d", freePort(t)), "--data-dir", dir}, args...)...)
	if want := fmt.Sprintf("orders (max_id 1, mark %d)", mark); code != 1 || !strings.Contains(stderr, want) {
		t.Fatalf("restart over the rewound row: exit %d, want 1 with %q in\n%s", code, want, stderr)
	}

	p = startBinary(t, dir, append(args, "--allow-store-behind")...)
	c = binClient(t, p.url)
	wantWentBack(t, c, "orders")
	takeIDs(t, c, "users", 1000, seen["users"])
	runTagCmd(t, "update", "--nats", p.url, "--tag", "orders", "--max-id", strconv.FormatInt(mark, 10))
	waitSegment(t, c, "orders", 15*time.Second, seen["orders"])
	takeIDs(t, c, "orders", 1000, seen["orders"])

	rewind(t, db, "orders")
	err := drain(t, c, "orders", 200_000, seen["orders"])
	if !errors.Is(err, wire.ErrUnavailable) || !strings.Contains(err.Error(), "went backwards") {
		t.Fatalf("orders rewound while running = %v, want 503 saying the store went backwards", err)
	}
	takeIDs(t, c, "users", 1000, seen["users"])
	runTagCmd(t, "update", "--nats", p.url, "--tag", "orders", "--max-id", strconv.FormatInt(mentionedMark(t, err)+1_000_000, 10))
	waitSegment(t, c, "orders", 15*time.Second, seen["orders"])
	takeIDs(t, c, "orders", 1000, seen["orders"])
}

func rewind(tb testing.TB, db *sql.DB, tag string) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := db.ExecContext(ctx, "UPDATE leaf_alloc SET max_id = 1 WHERE biz_tag = ?", tag); err != nil {
		tb.Fatalf("rewind %s: %v", tag, err)
	}
}

func connectURL(tb testing.TB, url string) *nats.Conn {
	tb.Helper()
	nc, err := nats.Connect(url, nats.Timeout(5*time.Second))
	if err != nil {
		tb.Fatalf("connect to %s: %v", url, err)
	}
	tb.Cleanup(nc.Close)
	return nc
}

func binClient(tb testing.TB, url string) *client.Client {
	tb.Helper()
	c, err := client.NewClient(connectURL(tb, url))
	if err != nil {
		tb.Fatal(err)
	}
	return c
}

// requestSegment asks the dispenser at url for one ID of the sample tag.
func requestSegment(tb testing.TB, url string) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := binClient(tb, url).Segment(ctx, dispenser.SampleTagName); err != nil {
		tb.Fatalf("Segment from %s: %v", url, err)
	}
}

// stopBinary sends SIGTERM and waits for a clean exit.
func stopBinary(tb testing.TB, p *process) {
	tb.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		tb.Fatal(err)
	}
	select {
	case err := <-p.done:
		p.done <- err
		if err != nil {
			tb.Fatalf("exit after SIGTERM: %v\nstderr:\n%s", err, p.stderr.String())
		}
	case <-time.After(30 * time.Second):
		tb.Fatalf("no exit within 30s of SIGTERM")
	}
}

// takeIDs takes n IDs of tag in batches of 100, failing on any in seen, and adds them.
func takeIDs(tb testing.TB, c *client.Client, tag string, n int, seen map[int64]bool) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for got := 0; got < n; got += 100 {
		ids, err := c.SegmentN(ctx, tag, 100)
		if err != nil {
			tb.Fatalf("SegmentN(%s, 100): %v", tag, err)
		}
		addUnique(tb, tag, ids, seen)
	}
}

func addUnique(tb testing.TB, tag string, ids []int64, seen map[int64]bool) {
	tb.Helper()
	for _, id := range ids {
		if seen[id] {
			tb.Fatalf("%s: ID %d handed out twice", tag, id)
		}
		seen[id] = true
	}
}

// drain takes IDs of tag until a request fails, and returns that error; it fails tb if
// up to max IDs all come back.
func drain(tb testing.TB, c *client.Client, tag string, max int, seen map[int64]bool) error {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for got := 0; got < max; got += 100 {
		ids, err := c.SegmentN(ctx, tag, 100)
		if err != nil {
			return err
		}
		addUnique(tb, tag, ids, seen)
	}
	tb.Fatalf("%s: %d IDs served after the store went back, and no refusal", tag, max)
	return nil
}

// wantWentBack: a request for tag answers 503 saying the store went backwards.
func wantWentBack(tb testing.TB, c *client.Client, tag string) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, err := c.Segment(ctx, tag)
	if !errors.Is(err, wire.ErrUnavailable) || !strings.Contains(err.Error(), "went backwards") {
		tb.Fatalf("Segment(%s) = %v, want 503 saying the store went backwards", tag, err)
	}
}

// waitSegment waits until tag serves again after a repair, and returns the first ID
// served; the IDs go into seen.
func waitSegment(tb testing.TB, c *client.Client, tag string, within time.Duration, seen map[int64]bool) int64 {
	tb.Helper()
	start := time.Now()
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		ids, err := c.SegmentN(ctx, tag, 1)
		cancel()
		if err == nil {
			addUnique(tb, tag, ids, seen)
			tb.Logf("%s served again %v after the repair", tag, time.Since(start).Round(time.Millisecond))
			return ids[0]
		}
		if time.Since(start) > within {
			tb.Fatalf("%s not served within %v of the repair: %v", tag, within, err)
			return 0
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// runTagCmd runs `dispenser tag <args>` with the real binary and fails unless it
// exits 0.
func runTagCmd(tb testing.TB, args ...string) string {
	tb.Helper()
	bin, err := buildDispenser()
	if err != nil {
		tb.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, append([]string{"tag"}, args...)...).CombinedOutput()
	if err != nil {
		tb.Fatalf("dispenser tag %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// markOf reads tag's high-water mark from the marks file in dir.
func markOf(tb testing.TB, dir, tag string) int64 {
	tb.Helper()
	data, err := os.ReadFile(filepath.Join(dir, dispenser.MarksFileName))
	if err != nil {
		tb.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(tag) + ` (\d+)$`).FindSubmatch(data)
	if m == nil {
		tb.Fatalf("no mark for %s in:\n%s", tag, data)
	}
	mark, _ := strconv.ParseInt(string(m[1]), 10, 64)
	return mark
}

// mentionedMark is the mark a store-went-back refusal names ("N at least <mark>").
func mentionedMark(tb testing.TB, err error) int64 {
	tb.Helper()
	m := regexp.MustCompile(`N at least (\d+)`).FindStringSubmatch(err.Error())
	if m == nil {
		tb.Fatalf("the refusal names no mark: %v", err)
	}
	mark, _ := strconv.ParseInt(m[1], 10, 64)
	return mark
}

// storeWentBack is the segment endpoint's store_went_back count in $SRV.STATS.leaf.
func storeWentBack(tb testing.TB, nc *nats.Conn) uint64 {
	tb.Helper()
	msg, err := nc.Request("$SRV.STATS.leaf", nil, 5*time.Second)
	if err != nil {
		tb.Fatalf("$SRV.STATS.leaf: %v", err)
	}
	var stats struct {
		Endpoints []struct {
			Name string `json:"name"`
			Data struct {
				Source struct {
					Tags segment.Stats `json:"tags"`
				} `json:"source"`
			} `json:"data"`
		} `json:"endpoints"`
	}
	if err := json.Unmarshal(msg.Data, &stats); err != nil {
		tb.Fatalf("stats %s: %v", msg.Data, err)
	}
	for _, e := range stats.Endpoints {
		if e.Name == "segment" {
			return e.Data.Source.Tags.StoreWentBack
		}
	}
	tb.Fatalf("no segment endpoint in %s", msg.Data)
	return 0
}
