package dispenser

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/leafbus/leafbus/internal/durable"
	"github.com/leafbus/leafbus/segment"
	"github.com/leafbus/leafbus/wire"
)

// DefaultFenceMargin is how far `dispenser fence` raises every tag above the highest
// max_id it knows of (--margin): ten billion IDs per tag, more than a tag serving
// 100,000 IDs a second hands out in a day.
const DefaultFenceMargin int64 = 10_000_000_000

// MaxUnconfirmedFenceMargin is the largest --margin a fence takes without --confirm:
// about 110 times the default. Above it, and for a tag that the margin would push past
// the largest int64 (using it up for good), the operator must say so.
const MaxUnconfirmedFenceMargin int64 = 1 << 40

// FencePendingFileName is the journal of a fence in progress in the data dir: the
// max_id every tag is being raised to, written before the first row is. A fence that
// finds it finishes that fence (raising each tag to its recorded max_id, never a
// second margin); a dispenser that finds it refuses to start.
const FencePendingFileName = "fence.pending"

// FencedTag is one tag a fence raised: the store's max_id and this data dir's mark
// before, and the max_id after (Capped: at the largest int64, the tag is used up).
type FencedTag struct {
	Tag    string
	MaxID  int64
	Mark   int64
	To     int64
	Capped bool
}

// SkippedTag is a row of the store a fence cannot raise, and why: a name the protocol
// cannot carry (empty, a control character, not UTF-8, too long), which Leaf's
// leaf_alloc accepts. No dispenser serves such a tag.
type SkippedTag struct {
	Tag    string
	Reason string
}

// FenceReport is what Fence did.
type FenceReport struct {
	Margin     int64
	At         time.Time
	LastRecord time.Time // the data dir's last record before the fence; zero when it has none
	Tags       []FencedTag
	Missing    []FencedTag  // tags of the marks the store does not have: To is where to add them
	Skipped    []SkippedTag // rows no dispenser serves, left as they are
	Resumed    bool         // this run finished a fence an earlier one began
}

// ErrFenceIncomplete is returned by Fence when tags this data dir served are missing
// from the store: they are fenced in the marks, and must be added again to the store
// at or above the max_id named before they serve.
var ErrFenceIncomplete = errors.New("fence incomplete: tags are missing from the segment store")

// ErrFenceNeedsConfirm is returned by Fence, before it writes anything, for a margin
// above MaxUnconfirmedFenceMargin or one that would use a tag up, without confirm.
var ErrFenceNeedsConfirm = errors.New("fence not confirmed")

// ErrFencePending is returned by New when a fence was interrupted: the data dir may
// not serve until `dispenser fence` has finished it.
var ErrFencePending = errors.New("a fence of this data dir was interrupted")

// fenceJournal is what FencePendingFileName holds (JSON).
type fenceJournal struct {
	At      int64            `json:"at"` // Unix ms
	Margin  int64            `json:"margin"`
	Targets map[string]int64 `json:"targets"` // tag: the max_id it is raised to
	Capped  []string         `json:"capped,omitempty"`
}

// Fence makes a deployment whose data dir (and, embedded, its segment store) was put
// back from a copy safe before it serves again: every tag of the store gets a max_id
// margin above the highest it knows of (the store's max_id, this dir's mark), and the
// dir's marks are raised to it and record the fence (segment.Fence), which the start-up
// restore check reads. IDs a dispenser served after the copy was taken, up to margin
// per tag, are then never served again; the rest of the margin is a gap. It holds the
// data dir's lock while it runs, so no dispenser can serve from the dir meanwhile.
//
// Every row is checked before any is written: a row no dispenser can serve (SkippedTag)
// is left alone and reported; a margin above MaxUnconfirmedFenceMargin, or one that would
// push a tag past the largest int64, is refused without confirm. The targets are
// written to FencePendingFileName before the first row is raised, so an interrupted
// fence is finished by the next run at the same targets (raising no tag twice), and
// the journal is removed once the marks record the fence. A fence that completed is not
// undone or skipped by a second run: that run raises every tag by the margin again, as
// it cannot tell a repeat from a data dir put back from a copy taken after the fence.
func Fence(ctx context.Context, cfg Config, margin int64, confirm bool, opts ...Option) (FenceReport, error) {
	if err := CheckFenceMargin(margin, confirm); err != nil {
		return FenceReport{}, err
	}
	d, err := openAdmin(ctx, cfg, adminSteps(cfg, true, stepSegmentMarks, stepSegmentStore), opts...)
	if err != nil {
		return FenceReport{}, err
	}
	defer d.Close()
	if d.opts.wrapStore != nil { // WrapSegmentStore: the step that applies it is not run here
		d.store = d.opts.wrapStore(d.store)
	}
	r := FenceReport{Margin: margin, At: d.clock.Now()}
	if e, err := cfg.cacheFile().Load(); err == nil {
		r.LastRecord = time.UnixMilli(e.Timestamp)
	}
	journalPath := filepath.Join(cfg.DataDir, FencePendingFileName)
	journal, err := readFenceJournal(journalPath)
	if err != nil {
		return r, err
	}
	if journal != nil {
		r.Resumed, r.Margin, r.At = true, journal.Margin, time.UnixMilli(journal.At)
		d.log.Warn("finishing the fence an earlier run began: each tag is raised to the max_id it recorded, not by --margin again",
			"file", journalPath, "began", r.At.UTC().Format(time.RFC3339), "margin", journal.Margin)
	}
	plan, err := planFence(ctx, d, r.Margin, journal)
	if err != nil {
		return r, err
	}
	r.Skipped, r.Missing = plan.skipped, plan.missing
	for _, sk := range r.Skipped {
		d.log.Warn("fence: row skipped: no dispenser serves it", "tag", wire.Quote(sk.Tag), "reason", sk.Reason)
	}
	if journal == nil {
		if len(plan.capped) > 0 && !confirm {
			return r, fmt.Errorf("%w: --margin %d would raise %s to the largest int64, using them up for good: give a smaller --margin, or --confirm", ErrFenceNeedsConfirm, margin, quoteTags(plan.capped))
		}
		journal = &fenceJournal{At: r.At.UnixMilli(), Margin: margin, Targets: plan.targets, Capped: plan.capped}
		data, err := json.Marshal(journal)
		if err != nil {
			return r, err
		}
		if err := durable.WriteFile(journalPath, data); err != nil {
			return r, fmt.Errorf("fence: write %s before raising any tag: %w", journalPath, err)
		}
	}
	raised := map[string]int64{}
	for _, name := range slices.Sorted(maps.Keys(plan.rows)) {
		to := journal.Targets[name]
		f, err := fenceTag(ctx, d.store, plan.rows[name], plan.marks[name], to)
		f.Capped = slices.Contains(journal.Capped, name)
		if err != nil {
			return r, fmt.Errorf("%w (run the fence again: it finishes this one)", err)
		}
		r.Tags = append(r.Tags, f)
		raised[name] = f.To
	}
	for _, m := range r.Missing {
		raised[m.Tag] = m.To
	}
	marks, ok := d.marks.(interface {
		RecordFence(segment.Fence, map[string]int64) error
	})
	if !ok {
		return r, errors.New("fence: these high-water marks cannot record a fence")
	}
	if err := marks.RecordFence(segment.Fence{At: r.At.UnixMilli(), Margin: r.Margin}, raised); err != nil {
		return r, fmt.Errorf("fence: the store is fenced, but the marks file is not (run the fence again): %w", err)
	}
	if err := os.Remove(journalPath); err != nil {
		return r, fmt.Errorf("fence: done, but %s is left (remove it): %w", journalPath, err)
	}
	if err := durable.SyncDir(cfg.DataDir); err != nil {
		return r, fmt.Errorf("fence: done, but the removal of %s is not synced: %w", journalPath, err)
	}
	d.log.Warn("segment store fenced", "tags", len(r.Tags), "missing", len(r.Missing), "skipped", len(r.Skipped), "margin", r.Margin)
	if len(r.Missing) > 0 {
		var adds []string
		for _, m := range r.Missing {
			adds = append(adds, fmt.Sprintf("dispenser tag add --tag %s --step S --max-id %d", m.Tag, m.To))
		}
		return r, fmt.Errorf("%w: add each again before it serves: %s", ErrFenceIncomplete, strings.Join(adds, "; "))
	}
	return r, nil
}

// CheckFenceMargin refuses a margin below 1, and one above MaxUnconfirmedFenceMargin
// without confirm.
func CheckFenceMargin(margin int64, confirm bool) error {
	switch {
	case margin < 1:
		return fmt.Errorf("--margin %d: want at least 1", margin)
	case margin > MaxUnconfirmedFenceMargin && !confirm:
		return fmt.Errorf("%w: --margin %d is above %d (every tag gives up that many IDs): give --confirm if it is meant", ErrFenceNeedsConfirm, margin, MaxUnconfirmedFenceMargin)
	}
	return nil
}

// fencePlan is what a fence will do, decided before it writes anything.
type fencePlan struct {
	rows    map[string]segment.Tag // the store's rows to raise
	marks   map[string]int64       // this data dir's marks
	targets map[string]int64       // the max_id of each row and missing tag
	capped  []string               // the tags the margin takes to the largest int64
	missing []FencedTag
	skipped []SkippedTag
}

// planFence reads every row and mark and decides each tag's target: from journal when
// an earlier run recorded them, margin above max(max_id, mark) otherwise.
func planFence(ctx context.Context, d *Dispenser, margin int64, journal *fenceJournal) (fencePlan, error) {
	p := fencePlan{rows: map[string]segment.Tag{}, targets: map[string]int64{}}
	tags, err := d.store.Tags(ctx)
	if err != nil {
		return p, fmt.Errorf("fence: list the tags: %w", err)
	}
	for _, t := range tags {
		if err := wire.CheckTag(t.Name); err != nil {
			p.skipped = append(p.skipped, SkippedTag{Tag: t.Name, Reason: err.Error()})
			continue
		}
		p.rows[t.Name] = t
	}
	// Every tag of the store's list, and every tag of the marks read one by one: a
	// listing can miss keys (a busy KV server), the marks name every tag this dir
	// served.
	p.marks = d.marks.All()
	for tag := range p.marks {
		if _, ok := p.rows[tag]; ok {
			continue
		}
		t, err := d.store.Tag(ctx, tag)
		switch {
		case errors.Is(err, segment.ErrTagNotFound):
			to, capped := addCapped(p.marks[tag], margin)
			if journal != nil && journal.Targets[tag] > 0 {
				to, capped = journal.Targets[tag], slices.Contains(journal.Capped, tag)
			}
			p.missing = append(p.missing, FencedTag{Tag: tag, Mark: p.marks[tag], To: to, Capped: capped})
		case err != nil:
			return p, fmt.Errorf("fence: read tag %q: %w", tag, err)
		default:
			p.rows[tag] = t
		}
	}
	slices.SortFunc(p.missing, func(a, b FencedTag) int { return strings.Compare(a.Tag, b.Tag) })
	for name, t := range p.rows {
		to, capped := addCapped(max(t.MaxID, p.marks[name]), margin)
		if journal != nil {
			if target, ok := journal.Targets[name]; ok {
				to = target
			} // a tag the first run did not see: fenced now, by the margin
		}
		if capped && to > t.MaxID {
			p.capped = append(p.capped, name)
		}
		p.targets[name] = to
	}
	for _, m := range p.missing {
		p.targets[m.Tag] = m.To
		if m.Capped {
			p.capped = append(p.capped, m.Tag)
		}
	}
	slices.Sort(p.capped)
	return p, nil
}

// readFenceJournal reads the journal of an interrupted fence; nil when there is none.
func readFenceJournal(path string) (*fenceJournal, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("fence: %w", err)
	}
	var j fenceJournal
	if err := json.Unmarshal(data, &j); err != nil || j.Margin < 1 || j.At < 1 {
		return nil, fmt.Errorf("fence: %s is not a fence journal (%v): move it away only if no fence ran on this data dir", path, err)
	}
	return &j, nil
}

// checkFencePending is the start-up step "fence": a data dir whose fence was
// interrupted may not serve (some tags raised, the others not, the marks not yet).
func (d *Dispenser) checkFencePending(context.Context) error {
	path := filepath.Join(d.cfg.DataDir, FencePendingFileName)
	if _, err := os.Stat(path); err == nil {
		return fmt.Errorf("%w (%s is there): run `dispenser fence` with this dispenser's flags again to finish it, then start", ErrFencePending, path)
	}
	return nil
}

// fenceTag raises t to max_id to, unless its max_id is there already (a fence finished
// for it, or a dispenser sharing the store took segments past it), reading it again
// when a dispenser sharing the store took a segment in between.
func fenceTag(ctx context.Context, store segment.Store, t segment.Tag, mark, to int64) (FencedTag, error) {
	for attempt := 1; ; attempt++ {
		f := FencedTag{Tag: t.Name, MaxID: t.MaxID, Mark: mark, To: to}
		if t.MaxID >= to {
			f.To = t.MaxID
			return f, nil
		}
		_, err := store.UpdateTag(ctx, segment.TagUpdate{Name: t.Name, MaxID: &to})
		if err == nil {
			return f, nil
		}
		if !errors.Is(err, segment.ErrInvalidTag) || attempt == 3 {
			return f, fmt.Errorf("fence: raise tag %q to %d: %w", t.Name, to, err)
		}
		if t, err = store.Tag(ctx, t.Name); err != nil {
			return f, fmt.Errorf("fence: read tag %q again: %w", t.Name, err)
		}
	}
}

// addCapped is a+b for b >= 0, or the largest int64 when that would not fit.
func addCapped(a, b int64) (int64, bool) {
	if a > math.MaxInt64-b {
		return math.MaxInt64, true
	}
	return a + b, false
}

// quoteTags names tags for a message: the first five, and how many more.
func quoteTags(tags []string) string {
	var q []string
	for _, t := range tags[:min(len(tags), 5)] {
		q = append(q, wire.Quote(t))
	}
	if len(tags) > 5 {
		q = append(q, fmt.Sprintf("and %d more", len(tags)-5))
	}
	return strings.Join(q, ", ")
}
