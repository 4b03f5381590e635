package dispenser

import (
	"context"
	"database/sql"
	"errors"
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

// failingUpdates is a segment store whose UpdateTag fails from the nth call on: a fence
// interrupted half-way (a crash, a lost connection).
type failingUpdates struct {
	segment.Store
	n     int
	calls int
}

func (s *failingUpdates) UpdateTag(ctx context.Context, u segment.TagUpdate) (segment.Tag, error) {
	s.calls++
	if s.calls >= s.n {
		return segment.Tag{}, errors.New("connection lost (test)")
	}
	return s.Store.UpdateTag(ctx, u)
}

// TestFenceMySQLRowsAndResume: against Leaf's leaf_alloc on MariaDB, `fence` checks
// every row before writing: rows Leaf accepts but no dispenser can serve (an empty
// biz_tag, a control character) are skipped and named, the rows around them raised; a
// margin that would use a tag up, or one above the bound, is refused without --confirm
// and writes nothing. A fence interrupted after raising one tag leaves a journal that
// refuses the start; the next run finishes it at the first run's targets (the raised tag
// not raised again), and the dispenser then serves above the fence.
func TestFenceMySQLRowsAndResume(t *testing.T) {
	t.Parallel()
	dsn := testenv.MariaDB(t).NewDatabase(t)
	cfg := testConfig(t)
	cfg.SegmentStore, cfg.MySQLDSN, cfg.MySQLCreateTable, cfg.SampleTag = "mysql", dsn, true, false
	ids := serveSome(t, cfg, 3, WithTags(segment.Tag{Name: SampleTagName, Step: 10, MaxID: 1}))
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx := testutil.Context(t, 2*time.Minute)
	for _, row := range []struct {
		tag   string
		maxID int64
	}{{"", 500}, {"bad\x01tag", 700}, {"zeta", 5000}, {"alpha", 3000}} {
		if _, err := db.ExecContext(ctx, "INSERT INTO leaf_alloc (biz_tag, max_id, step) VALUES (?, ?, 100)", row.tag, row.maxID); err != nil {
			t.Fatal(err)
		}
	}
	maxID := func(tag string) int64 {
		t.Helper()
		var n int64
		if err := db.QueryRowContext(ctx, "SELECT max_id FROM leaf_alloc WHERE biz_tag = ?", tag).Scan(&n); err != nil {
			t.Fatal(err)
		}
		return n
	}
	journal := filepath.Join(cfg.DataDir, FencePendingFileName)
	unchanged := func(when string, want map[string]int64) {
		t.Helper()
		for tag, n := range want {
			if got := maxID(tag); got != n {
				t.Errorf("%s: %q has max_id %d, want %d (untouched)", when, tag, got, n)
			}
		}
		if _, err := os.Stat(journal); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s: the journal is there (%v)", when, err)
		}
	}
	before := map[string]int64{"": 500, "bad\x01tag": 700, "zeta": 5000, "alpha": 3000, SampleTagName: maxID(SampleTagName)}

	// Refused before anything is written: a margin above the bound, and one that would
	// take a tag to the largest int64.
	if _, err := Fence(ctx, cfg, MaxUnconfirmedFenceMargin+1, false, WithLogger(testutil.Logger(t))); !errors.Is(err, ErrFenceNeedsConfirm) {
		t.Errorf("Fence above the bound = %v, want ErrFenceNeedsConfirm", err)
	}
	if _, err := db.ExecContext(ctx, "INSERT INTO leaf_alloc (biz_tag, max_id, step) VALUES ('near-end', ?, 100)", int64(math.MaxInt64-10)); err != nil {
		t.Fatal(err)
	}
	if _, err := Fence(ctx, cfg, 1000, false, WithLogger(testutil.Logger(t))); !errors.Is(err, ErrFenceNeedsConfirm) || !strings.Contains(err.Error(), `"near-end"`) {
		t.Errorf("Fence that would use near-end up = %v, want ErrFenceNeedsConfirm naming it", err)
	}
	unchanged("after the refusals", before)
	if _, err := db.ExecContext(ctx, "DELETE FROM leaf_alloc WHERE biz_tag = 'near-end'"); err != nil {
		t.Fatal(err)
	}

	// Interrupted after the first row (alpha, in name order) was raised.
	const margin = 1000
	_, err = Fence(ctx, cfg, margin, false, WithLogger(testutil.Logger(t)),
		WrapSegmentStore(func(s segment.Store) segment.Store { return &failingUpdates{Store: s, n: 2} }))
	if err == nil || !strings.Contains(err.Error(), "run the fence again") {
		t.Fatalf("the interrupted fence = %v, want an error saying to run it again", err)
	}
	if _, err := os.Stat(journal); err != nil {
		t.Fatalf("no journal after an interrupted fence: %v", err)
	}
	if got := maxID("alpha"); got != 3000+margin {
		t.Fatalf("alpha at %d after the interrupted fence, want %d", got, 3000+margin)
	}
	if _, err := newTest(t, cfg); !errors.Is(err, ErrFencePending) {
		t.Fatalf("New with a fence interrupted = %v, want ErrFencePending", err)
	}

	// The second run finishes the first one's: alpha not raised again.
	report, err := Fence(ctx, cfg, margin, false, WithLogger(testutil.Logger(t)))
	if err != nil {
		t.Fatalf("the resumed fence: %v", err)
	}
	if !report.Resumed || len(report.Skipped) != 2 {
		t.Errorf("report: resumed %v, skipped %+v; want resumed and the two bad rows", report.Resumed, report.Skipped)
	}
	mark := ids[len(ids)-1]
	for tag, want := range map[string]int64{"alpha": 3000 + margin, "zeta": 5000 + margin, "": 500, "bad\x01tag": 700} {
		if got := maxID(tag); got != want {
			t.Errorf("after the resumed fence %q has max_id %d, want %d", tag, got, want)
		}
	}
	sample := maxID(SampleTagName)
	if sample != before[SampleTagName]+margin || sample <= mark {
		t.Errorf("%s at %d after the fence, was %d", SampleTagName, sample, before[SampleTagName])
	}
	if _, err := os.Stat(journal); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the journal is left after the fence finished: %v", err)
	}
	for _, id := range serveSome(t, cfg, 2) {
		if id < sample {
			t.Errorf("after the fence, ID %d is below the fence %d", id, sample)
		}
	}
}
