package dispenser

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"
	"time"

	"github.com/leafbus/leafbus/segment"
)

// DefaultFenceMargin is how far `dispenser fence` raises every tag above the highest
// max_id it knows of (--margin): ten billion IDs per tag, more than a tag serving
// 100,000 IDs a second hands out in a day.
const DefaultFenceMargin int64 = 10_000_000_000

// FencedTag is one tag a fence raised: the store's max_id and this data dir's mark
// before, and the max_id after (Capped: at the largest int64, the tag is used up).
type FencedTag struct {
	Tag    string
	MaxID  int64
	Mark   int64
	To     int64
	Capped bool
}

// FenceReport is what Fence did.
type FenceReport struct {
	Margin     int64
	At         time.Time
	LastRecord time.Time // the data dir's last record before the fence; zero when it has none
	Tags       []FencedTag
	Missing    []FencedTag // tags of the marks the store does not have: To is where to add them
}

// ErrFenceIncomplete is returned by Fence when tags this data dir served are missing
// from the store: they are fenced in the marks, and must be added again to the store
// at or above the max_id named before they serve.
var ErrFenceIncomplete = errors.New("fence incomplete: tags are missing from the segment store")

// Fence makes a deployment whose data dir (and, embedded, its segment store) was put
// back from a copy safe before it serves again: every tag of the store gets a max_id
// margin above the highest it knows of (the store's max_id, this dir's mark), never
// past the largest int64, and the dir's marks are raised to it and record the fence
// (segment.Fence), which the start-up restore check reads. IDs a dispenser served
// after the copy was taken, up to margin per tag, are then never served again; the
// rest of the margin is a gap. It holds the data dir's lock while it runs, so no
// dispenser can serve from the dir meanwhile.
func Fence(ctx context.Context, cfg Config, margin int64, opts ...Option) (FenceReport, error) {
	if margin < 1 {
		return FenceReport{}, fmt.Errorf("--margin %d: want at least 1", margin)
	}
	d, err := openAdmin(ctx, cfg, adminSteps(cfg, true, stepSegmentMarks, stepSegmentStore), opts...)
	if err != nil {
		return FenceReport{}, err
	}
	defer d.Close()
	r := FenceReport{Margin: margin, At: d.clock.Now()}
	if e, err := cfg.cacheFile().Load(); err == nil {
		r.LastRecord = time.UnixMilli(e.Timestamp)
	}
	tags, err := d.store.Tags(ctx)
	if err != nil {
		return r, fmt.Errorf("fence: list the tags: %w", err)
	}
	// Every tag of the store's list, and every tag of the marks read one by one: a
	// listing can miss keys (a busy KV server), the marks name every tag this dir
	// served.
	byName := map[string]segment.Tag{}
	for _, t := range tags {
		byName[t.Name] = t
	}
	marked := d.marks.All()
	for tag := range marked {
		if _, ok := byName[tag]; ok {
			continue
		}
		t, err := d.store.Tag(ctx, tag)
		switch {
		case errors.Is(err, segment.ErrTagNotFound):
			to, capped := addCapped(marked[tag], margin)
			r.Missing = append(r.Missing, FencedTag{Tag: tag, Mark: marked[tag], To: to, Capped: capped})
		case err != nil:
			return r, fmt.Errorf("fence: read tag %q: %w", tag, err)
		default:
			byName[tag] = t
		}
	}
	slices.SortFunc(r.Missing, func(a, b FencedTag) int { return strings.Compare(a.Tag, b.Tag) })
	raised := map[string]int64{}
	for _, name := range slices.Sorted(maps.Keys(byName)) {
		f, err := fenceTag(ctx, d.store, byName[name], marked[name], margin)
		if err != nil {
			return r, err
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
	if err := marks.RecordFence(segment.Fence{At: r.At.UnixMilli(), Margin: margin}, raised); err != nil {
		return r, fmt.Errorf("fence: the store is fenced, but the marks file is not (run the fence again): %w", err)
	}
	d.log.Warn("segment store fenced", "tags", len(r.Tags), "missing", len(r.Missing), "margin", margin)
	if len(r.Missing) > 0 {
		var adds []string
		for _, m := range r.Missing {
			adds = append(adds, fmt.Sprintf("dispenser tag add --tag %s --step S --max-id %d", m.Tag, m.To))
		}
		return r, fmt.Errorf("%w: add each again before it serves: %s", ErrFenceIncomplete, strings.Join(adds, "; "))
	}
	return r, nil
}

// fenceTag raises t to margin above the higher of its max_id and mark, reading it again
// when a dispenser sharing the store took a segment in between.
func fenceTag(ctx context.Context, store segment.Store, t segment.Tag, mark, margin int64) (FencedTag, error) {
	for attempt := 1; ; attempt++ {
		to, capped := addCapped(max(t.MaxID, mark), margin)
		f := FencedTag{Tag: t.Name, MaxID: t.MaxID, Mark: mark, To: to, Capped: capped}
		if to == t.MaxID {
			return f, nil // already at the largest int64
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
