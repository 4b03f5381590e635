package dispenser

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/leafbus/leafbus/client"
	"github.com/leafbus/leafbus/internal/datadir"
	"github.com/leafbus/leafbus/internal/testutil"
	"github.com/leafbus/leafbus/segment"
	"github.com/leafbus/leafbus/testenv"
	"github.com/leafbus/leafbus/wire"
)

// TestDataDirOneDispenser: a second dispenser on a data dir in use is refused at once,
// with the holder's node ID and PID, in the embedded mode and with --nats (the
// worker-ID cache file and the marks live in the dir there too); the first one is not
// disturbed, and once it is closed the dir can be taken again.
func TestDataDirOneDispenser(t *testing.T) {
	srv := testenv.StartNATS(t)
	for _, mode := range []struct {
		name string
		nats string
	}{{"Embedded", ""}, {"NATS", srv.URL()}} {
		t.Run(mode.name, func(t *testing.T) {
			cfg := testConfig(t)
			cfg.NATS = mode.nats
			first, err := newTest(t, cfg)
			if err != nil {
				t.Fatalf("New: %v", err)
			}
			second := cfg
			second.NodeID = "second-node"
			start := time.Now()
			_, err = newTest(t, second)
			took := time.Since(start)
			if !errors.Is(err, datadir.ErrInUse) {
				t.Fatalf("New on a data dir in use = %v, want datadir.ErrInUse", err)
			}
			for _, want := range []string{`"test-node"`, fmt.Sprintf("PID %d", os.Getpid()), "--data-dir"} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("refusal %q does not contain %q", err, want)
				}
			}
			if took > time.Second {
				t.Errorf("refusal took %v, want under 1s", took)
			}
			c, err := client.NewClient(hwConnect(t, first.ClientURL()))
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if _, err := c.Snowflake(ctx, "x"); err != nil {
				t.Fatalf("the first dispenser after the refused second: %v", err)
			}
			if err := first.Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}
			if _, err := newTest(t, second); err != nil {
				t.Fatalf("New on the dir after the holder closed: %v", err)
			}
		})
	}
}

// TestSampleTagOnlyInNewDataDir: the sample tag is created in a data dir never used for
// segments (missing; or left by a start that failed before serving), and not in one
// that held a segment store, nor in one whose node served the tag and lost its store
// (TestStoreLostRefused: that start is refused, naming the tag as missing, not as
// created again at 1).
func TestSampleTagOnlyInNewDataDir(t *testing.T) {
	// A first start fails once the embedded server has made its dir: the dir stays new.
	cfg := testConfig(t)
	cfg.DataDir = filepath.Join(t.TempDir(), "missing")
	failed := errors.New("failed on purpose")
	_, err := newTest(t, cfg, withAfterStep(func(step stepName, _ *Dispenser) error {
		if step == stepSegmentMarks {
			return failed
		}
		return nil
	}))
	if !errors.Is(err, failed) {
		t.Fatalf("New failing after the marks = %v", err)
	}
	d, err := newTest(t, cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	if names := hwStoreTags(t, d); len(names) != 1 || names[0] != SampleTagName {
		t.Fatalf("tags in a new data dir = %v, want the sample tag", names)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}

	// A dir with a segment store but no sample tag (started with --sample-tag=false).
	cfg = testConfig(t)
	cfg.SampleTag = false
	d, err = newTest(t, cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	cfg.SampleTag = true
	d, err = newTest(t, cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	if names := hwStoreTags(t, d); len(names) != 0 {
		t.Fatalf("tags in a dir that held a store = %v, want none: the sample tag is only created in a new data dir", names)
	}
}

// TestStoreLostRefused: a dispenser serves the sample tag, its KV store is lost, and the
// restart refuses, naming the tag; with AllowStoreBehind it starts, a tag added again
// below the mark answers 503, and once max_id is raised to the mark it serves again,
// repeating nothing.
func TestStoreLostRefused(t *testing.T) {
	cfg := testConfig(t)
	seen := map[int64]bool{}
	d := hwRun(t, cfg)
	hwTake(t, d, SampleTagName, 3000, seen)
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	mark := hwMark(t, cfg.DataDir, SampleTagName)
	if mark <= 3000 {
		t.Fatalf("mark of %s after 3000 IDs = %d, want above 3000", SampleTagName, mark)
	}
	if err := os.RemoveAll(filepath.Join(cfg.DataDir, "jetstream", "$G", "streams", "KV_leaf_segments")); err != nil {
		t.Fatal(err)
	}

	_, err := newTest(t, cfg)
	if !errors.Is(err, segment.ErrStoreWentBack) {
		t.Fatalf("New over a lost store = %v, want ErrStoreWentBack", err)
	}
	if !strings.Contains(err.Error(), "missing from the store: "+SampleTagName) {
		t.Errorf("refusal %q does not name the sample tag as missing (created again at 1?)", err)
	}
	for _, want := range []string{fmt.Sprintf("%s (mark %d)", SampleTagName, mark), "--allow-store-behind", "refusing to start"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("refusal %q does not contain %q", err, want)
		}
	}

	cfg.AllowStoreBehind = true
	d = hwRun(t, cfg)
	c := hwClient(t, d)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := c.Segment(ctx, SampleTagName); !errors.Is(err, wire.ErrNotFound) {
		t.Fatalf("Segment of the lost tag = %v, want not found", err)
	}
	step := int64(SampleTagStep)
	if _, err := c.AddTag(ctx, wire.AddTagRequest{Tag: SampleTagName, Step: &step}); err != nil {
		t.Fatalf("add the tag again at 1: %v", err)
	}
	_, err = c.Segment(ctx, SampleTagName)
	if !errors.Is(err, wire.ErrUnavailable) || !strings.Contains(err.Error(), "went backwards") {
		t.Fatalf("Segment of a tag added again below the mark = %v, want 503 saying the store went backwards", err)
	}
	if _, err := c.UpdateTag(ctx, wire.UpdateTagRequest{Tag: SampleTagName, MaxID: &mark}); err != nil {
		t.Fatalf("raise max_id to the mark: %v", err)
	}
	hwWaitServed(t, c, SampleTagName, 15*time.Second)
	hwTake(t, d, SampleTagName, 3000, seen)
}

// hwRun starts a dispenser with cfg and runs it until its tags are loaded; it is
// stopped and closed at cleanup.
func hwRun(tb testing.TB, cfg Config) *Dispenser {
	tb.Helper()
	d, err := newTest(tb, cfg)
	if err != nil {
		tb.Fatalf("New: %v", err)
	}
	testutil.Run(tb, "Dispenser.Run", d.Run) // stopped at cleanup, before Close
	select {
	case <-d.Ready():
	case <-time.After(30 * time.Second):
		tb.Fatal("not ready within 30s")
	}
	return d
}

func hwConnect(tb testing.TB, url string) *nats.Conn {
	tb.Helper()
	nc, err := nats.Connect(url, nats.Timeout(5*time.Second))
	if err != nil {
		tb.Fatalf("connect to %s: %v", url, err)
	}
	tb.Cleanup(nc.Close)
	return nc
}

func hwClient(tb testing.TB, d *Dispenser) *client.Client {
	tb.Helper()
	c, err := client.NewClient(hwConnect(tb, d.ClientURL()))
	if err != nil {
		tb.Fatal(err)
	}
	return c
}

// hwTake takes n IDs of tag from d in batches of 100 and fails on any seen before.
func hwTake(tb testing.TB, d *Dispenser, tag string, n int, seen map[int64]bool) {
	tb.Helper()
	c := hwClient(tb, d)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for got := 0; got < n; got += 100 {
		ids, err := c.SegmentN(ctx, tag, 100)
		if err != nil {
			tb.Fatalf("SegmentN(%s, 100): %v", tag, err)
		}
		for _, id := range ids {
			if seen[id] {
				tb.Fatalf("%s: ID %d handed out twice", tag, id)
			}
			seen[id] = true
		}
	}
}

// hwWaitServed waits until tag serves an ID again (after a repair).
func hwWaitServed(tb testing.TB, c *client.Client, tag string, within time.Duration) {
	tb.Helper()
	deadline := time.Now().Add(within)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_, err := c.SegmentN(ctx, tag, 1)
		cancel()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("%s not served within %v of the repair: %v", tag, within, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// hwStoreTags lists the names of the tags in d's segment store.
func hwStoreTags(tb testing.TB, d *Dispenser) []string {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	tags, err := d.store.Tags(ctx)
	if err != nil {
		tb.Fatalf("Tags: %v", err)
	}
	var names []string
	for _, t := range tags {
		names = append(names, t.Name)
	}
	return names
}

// hwMark reads tag's mark from the marks file of a data dir no dispenser holds.
func hwMark(tb testing.TB, dir, tag string) int64 {
	tb.Helper()
	m, err := segment.OpenFileMarks(filepath.Join(dir, MarksFileName))
	if err != nil {
		tb.Fatal(err)
	}
	return m.Mark(tag)
}
