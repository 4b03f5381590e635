package dispenser

import (
	"errors"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/leafbus/leafbus/internal/testutil"
	"github.com/leafbus/leafbus/segment"
	"github.com/leafbus/leafbus/testenv"
)

// copyDir copies the tree at src to dst (which must not exist), as a backup would.
func copyDir(tb testing.TB, src, dst string) {
	tb.Helper()
	err := filepath.WalkDir(src, func(path string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		if e.IsDir() {
			return os.MkdirAll(target, 0o750)
		}
		in, err := os.Open(path)
		if err != nil {
			return err
		}
		defer in.Close()
		out, err := os.OpenFile(target, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o640)
		if err != nil {
			return err
		}
		if _, err := io.Copy(out, in); err != nil {
			out.Close()
			return err
		}
		return out.Close()
	})
	if err != nil {
		tb.Fatalf("copy %s to %s: %v", src, dst, err)
	}
}

// putBack replaces dir with a copy of backup, as an operator restoring it would.
func putBack(tb testing.TB, backup, dir string) {
	tb.Helper()
	if err := os.RemoveAll(dir); err != nil {
		tb.Fatal(err)
	}
	copyDir(tb, backup, dir)
}

// serveSome starts a dispenser on cfg, takes n IDs of the sample tag one by one (each
// from a segment this dispenser took), and stops it.
func serveSome(t *testing.T, cfg Config, n int, opts ...Option) []int64 {
	t.Helper()
	d, err := newTest(t, cfg, opts...)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	runNode(t, d)
	_, c := exactClient(t, d)
	ctx := testutil.Context(t, 30*time.Second)
	ids := make([]int64, 0, n)
	for range n {
		id, err := c.Segment(ctx, SampleTagName)
		if err != nil {
			t.Fatalf("segment ID: %v", err)
		}
		ids = append(ids, id)
	}
	if err := d.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	return ids
}

// TestRestoredDataDirFenced is issue 21's "an old copy of the data dir put back": in
// the embedded mode the data dir holds the segment store and the marks, and a copy put
// back holds both as they were, agreeing with each other, so the start-up marks check
// passes and the IDs served after the copy was taken are served again. `dispenser
// fence` (Fence) before the start makes every ID new; the same start without it
// repeats them, which is what the fence is for.
func TestRestoredDataDirFenced(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	before := serveSome(t, cfg, 3)
	backup := filepath.Join(t.TempDir(), "backup")
	copyDir(t, cfg.DataDir, backup)
	after := serveSome(t, cfg, 3) // served after the backup: what a restore loses
	seen := map[int64]bool{}
	for _, id := range append(before, after...) {
		if seen[id] {
			t.Fatalf("ID %d served twice before any restore: %v then %v", id, before, after)
		}
		seen[id] = true
	}

	// Without the fence (a second copy, so the fenced one below is untouched): the IDs
	// served after the backup come again.
	unfenced := cfg
	unfenced.DataDir = filepath.Join(t.TempDir(), "unfenced")
	copyDir(t, backup, unfenced.DataDir)
	repeated := 0
	for _, id := range serveSome(t, unfenced, 3) {
		if seen[id] {
			repeated++
		}
	}
	if repeated == 0 {
		t.Fatalf("a restored copy without the fence served no ID twice: the scenario does not show the hazard")
	}

	putBack(t, backup, cfg.DataDir)
	ctx := testutil.Context(t, time.Minute)
	report, err := Fence(ctx, cfg, DefaultFenceMargin, false, WithLogger(testutil.Logger(t)))
	if err != nil {
		t.Fatalf("Fence: %v", err)
	}
	if len(report.Tags) != 1 || report.Tags[0].Tag != SampleTagName || report.Tags[0].To != max(report.Tags[0].MaxID, report.Tags[0].Mark)+DefaultFenceMargin {
		t.Fatalf("Fence report: %+v", report)
	}
	if report.LastRecord.IsZero() || report.LastRecord.After(report.At) {
		t.Errorf("Fence report: last record %v, fenced at %v", report.LastRecord, report.At)
	}
	marks, err := segment.OpenFileMarks(filepath.Join(cfg.DataDir, MarksFileName))
	if err != nil {
		t.Fatal(err)
	}
	if f := marks.Fence(); f.Margin != DefaultFenceMargin || f.At != report.At.UnixMilli() || marks.Mark(SampleTagName) != report.Tags[0].To {
		t.Fatalf("marks after the fence: fence %+v, mark %d; want the fence and mark %d", f, marks.Mark(SampleTagName), report.Tags[0].To)
	}
	for _, id := range serveSome(t, cfg, 3) {
		if seen[id] {
			t.Errorf("after the fence, ID %d was served again", id)
		}
		if id < report.Tags[0].To {
			t.Errorf("after the fence, ID %d is below the fence %d", id, report.Tags[0].To)
		}
	}
}

// TestFenceNeverOverflows: a tag whose max_id is within the margin of the largest
// int64 is fenced at the largest int64 (used up: it answers an error, never wraps to a
// negative ID), and tags this data dir served that the store lost are fenced in the
// marks and named for the operator to add again.
func TestFenceNeverOverflows(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	serveSome(t, cfg, 1, WithTags(segment.Tag{Name: "near-end", Step: 10, MaxID: math.MaxInt64 - 100}))
	ctx := testutil.Context(t, time.Minute)
	report, err := Fence(ctx, cfg, 1000, true, WithLogger(testutil.Logger(t)))
	if err != nil {
		t.Fatalf("Fence: %v", err)
	}
	for _, f := range report.Tags {
		if f.Tag == "near-end" && (!f.Capped || f.To != math.MaxInt64) {
			t.Errorf("near-end fenced to %d (capped %v), want the largest int64", f.To, f.Capped)
		}
		if f.Tag == SampleTagName && (f.Capped || f.To != max(f.MaxID, f.Mark)+1000) {
			t.Errorf("the sample tag fenced to %d from %d/%d", f.To, f.MaxID, f.Mark)
		}
	}
	if _, err := Fence(ctx, cfg, 0, false, WithLogger(testutil.Logger(t))); err == nil || !strings.Contains(err.Error(), "--margin 0") {
		t.Errorf("Fence with margin 0 = %v, want a refusal naming --margin", err)
	}

	// The store loses the sample tag (its bucket's directory deleted with the server
	// down, as a rebuilt JetStream would): the fence names it and how to add it back.
	if err := os.RemoveAll(filepath.Join(cfg.DataDir, "jetstream")); err != nil {
		t.Fatal(err)
	}
	report, err = Fence(ctx, cfg, 1000, true, WithLogger(testutil.Logger(t)))
	if !errors.Is(err, ErrFenceIncomplete) || len(report.Missing) == 0 {
		t.Fatalf("Fence of a store that lost tags = %+v, %v; want ErrFenceIncomplete", report, err)
	}
	for _, m := range report.Missing {
		if !strings.Contains(err.Error(), "dispenser tag add --tag "+m.Tag) || m.To < m.Mark || (m.To == m.Mark && !m.Capped) {
			t.Errorf("missing tag %+v not named in %v", m, err)
		}
	}
}

// TestRestoreCheckOldDataDir: a data dir whose last record is hours old is logged as
// possibly restored, naming `dispenser fence`; once fenced, it is not.
func TestRestoreCheckOldDataDir(t *testing.T) {
	t.Parallel()
	cfg := testConfig(t)
	serveSome(t, cfg, 1)
	later := WithClock(testutil.OffsetClock{Offset: 3 * time.Hour})
	logs := &testutil.SyncBuffer{}
	d, err := newTest(t, cfg, later, WithLogger(testLogger(t, logs)))
	if err != nil {
		t.Fatalf("New three hours later: %v", err)
	}
	d.Close()
	if line := logs.Line("the data dir's last record is old"); !strings.Contains(line, "dispenser fence --data-dir "+cfg.DataDir) || !strings.Contains(line, "age=3h") {
		t.Fatalf("no warning naming the fence for a 3h old data dir:\n%s", logs.String())
	}

	ctx := testutil.Context(t, time.Minute)
	if _, err := Fence(ctx, cfg, 1000, false, later, WithLogger(testutil.Logger(t))); err != nil {
		t.Fatal(err)
	}
	logs = &testutil.SyncBuffer{}
	d, err = newTest(t, cfg, later, WithLogger(testLogger(t, logs)))
	if err != nil {
		t.Fatal(err)
	}
	d.Close()
	if line := logs.Line("the data dir's last record is old"); line != "" {
		t.Errorf("warned after the fence: %s", line)
	}
}

// TestRestoreCheckNATS: with --nats the clock records live outside the data dir, and a
// dir put back from a copy is older than this node's record in <prefix>_forever: the
// start is refused, naming `dispenser fence`, until the dir is fenced.
func TestRestoreCheckNATS(t *testing.T) {
	t.Parallel()
	srv := testenv.StartNATS(t)
	cfg := testConfig(t)
	cfg.NATS, cfg.SampleTag = srv.URL(), true
	serveSome(t, cfg, 1)
	backup := filepath.Join(t.TempDir(), "backup")
	copyDir(t, cfg.DataDir, backup)
	// A minute later (the clock moved on: the records with it).
	later := WithClock(testutil.OffsetClock{Offset: time.Minute})
	serveSome(t, cfg, 1, later)
	putBack(t, backup, cfg.DataDir)

	began := time.Now()
	_, err := newTest(t, cfg, later)
	if !errors.Is(err, ErrDataDirRestored) || !strings.Contains(err.Error(), "dispenser fence --data-dir "+cfg.DataDir) {
		t.Fatalf("New on a data dir put back = %v, want ErrDataDirRestored naming dispenser fence", err)
	}
	if took := time.Since(began); took > cfg.StartTimeout/2 {
		t.Errorf("the refusal took %v: it was waited out", took)
	}
	ctx := testutil.Context(t, time.Minute)
	if _, err := Fence(ctx, cfg, DefaultFenceMargin, false, later, WithLogger(testutil.Logger(t))); err != nil {
		t.Fatalf("Fence: %v", err)
	}
	d, err := newTest(t, cfg, later)
	if err != nil {
		t.Fatalf("New after the fence: %v", err)
	}
	d.Close()
}
