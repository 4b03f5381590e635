package monotonic

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/leafbus/leafbus/internal/backoff"
	"github.com/leafbus/leafbus/internal/kvbucket"
	"github.com/leafbus/leafbus/segment"
	"github.com/leafbus/leafbus/wire"
)

// Tag ranges (wire.TagRange, PROTOCOL.md "Opaque tags and widths") are kept beside the
// monotonic mark, in the same value of <prefix>_tagopts, and outlive it the same way:
//
//   - the data dir's memory (memory.go) holds every range other than the default that
//     this dispenser took in, written before it serves an ID of the tag (until then the
//     tag answers 503);
//   - the deployment record lists them (SetRecordedRanges gives this Manager the
//     record's list; the dispenser keeps the record in step with the admin calls);
//   - a tag whose value is missing (a lost bucket, a deleted key), or was written
//     without its opaque range (by a dispenser of a version before ranges), gets its
//     range written back from what this dispenser knows.
//
// For an opaque tag every source that speaks of it must name the same range: an
// opaque tag served as an ordinary one, as an ordinary tag, or with another width or
// key, could hand out an ID twice (the raw number x can equal the image of another
// number y), so a tag whose sources differ is refused (503) until an operator mends
// them. A narrower width without the permutation (a cap) changes no number: its value
// in the bucket is taken when there is one, so that `tag update --bits` moves it.
//
// A range is written (SetRange) only while every dispenser says in its presence
// record that it knows ranges (a dispenser of an earlier version would serve an opaque
// tag as an ordinary one), and returns once every one has taken it in; the admin call
// that adds an opaque tag writes the range before the tag exists in the store, so no
// dispenser ever serves one of its IDs without the range.

// featureRanges is what a dispenser that knows tag ranges lists in its presence
// record's features.
const featureRanges = "tag-ranges"

// optValue is the range a key's value of <prefix>_tagopts gives.
type optValue struct {
	r        wire.TagRange // normal
	readable bool
}

// rangeEntry is one tag's range as this dispenser serves it: r, or err (a 503) while it
// must not serve the tag at all.
type rangeEntry struct {
	r   wire.TagRange
	err error
}

// rangeSet is the tags whose range is not the default, or that are refused, as
// published for the request path, by their exact bytes (like markSet: the store refuses
// every other spelling of a row). Never changed once published.
type rangeSet struct {
	exact map[string]rangeEntry
}

// lookup returns tag's entry: the default range for a tag with none.
func (s *rangeSet) lookup(tag string) (wire.TagRange, error) {
	if e, ok := s.exact[tag]; ok {
		return e.r, e.err
	}
	return wire.TagRange{}, nil
}

// ErrRangeConflict is the refusal (a 503) of a tag whose range the sources disagree
// on, where one of them says opaque: serving it could hand out an ID twice.
var ErrRangeConflict = fmt.Errorf("%w: the tag's range is in doubt", wire.ErrUnavailable)

// Names of the sources, for messages.
const (
	fromValue  = "its value in the tag options bucket"
	fromMemory = "this dispenser's data dir"
	fromRecord = "the deployment record"
)

// resolveRange decides a tag's range from its value in <prefix>_tagopts (nil: none),
// this dispenser's memory and the deployment record (nil: they name none). It is pure.
//
//   - When any of them says opaque, every one that names a range must name that one;
//     a readable value without a range is a value written by something that did not
//     know it (writeBack: it is written again), and an unreadable value is passed over.
//     Any other difference is ErrRangeConflict.
//   - Otherwise a readable value decides (the default when it names none); without
//     one, the record, then the memory (writeBack when the value is missing); an
//     unreadable value that nothing else speaks for refuses the tag, since it may have
//     said opaque.
func resolveRange(tag string, value *optValue, mem, rec *wire.TagRange) (r wire.TagRange, writeBack bool, err error) {
	type word struct {
		from string
		r    wire.TagRange
	}
	var words []word
	if value != nil && value.readable {
		words = append(words, word{fromValue, value.r})
	}
	if mem != nil {
		words = append(words, word{fromMemory, mem.Normal()})
	}
	if rec != nil {
		words = append(words, word{fromRecord, rec.Normal()})
	}
	opaque := slices.ContainsFunc(words, func(w word) bool { return w.r.Opaque })
	if opaque {
		var want *word
		for i, w := range words {
			if w.from == fromValue && w.r.IsDefault() {
				continue // written without the range: written back below
			}
			if want == nil {
				want = &words[i]
				continue
			}
			if w.r != want.r {
				return wire.TagRange{}, false, fmt.Errorf("%w: tag %q: %s names %s, %s names %s: refused until they agree (docs/errors.md#range-conflict)",
					ErrRangeConflict, tag, want.from, want.r, w.from, w.r)
			}
		}
		return want.r, value == nil || value.readable && value.r.IsDefault(), nil
	}
	switch {
	case value != nil && value.readable:
		return value.r, false, nil
	case rec != nil:
		return rec.Normal(), value == nil, nil
	case mem != nil:
		return mem.Normal(), value == nil, nil
	case value != nil:
		return wire.TagRange{}, false, fmt.Errorf("%w: tag %q: %s cannot be read, and neither %s nor %s names its range: it is refused until the value is written again (dispenser tag update)",
			ErrRangeConflict, tag, fromValue, fromMemory, fromRecord)
	}
	return wire.TagRange{}, false, nil
}

// TagRange returns tag's range as this dispenser serves it, costing a map lookup: the
// default for most tags. It fails with a 503 until the marks are loaded, while a new
// range is being written to the data dir, and for a tag whose range is in doubt
// (ErrRangeConflict).
func (m *Manager) TagRange(tag string) (wire.TagRange, error) {
	if !m.isReady.Load() {
		return wire.TagRange{}, errNotReady
	}
	return m.ranges.Load().lookup(tag)
}

// SetRecordedRanges gives the Manager the deployment record's tag ranges, read at the
// start and again whenever the dispenser reads the record.
func (m *Manager) SetRecordedRanges(ranges []wire.DeployedRange) {
	rec := make(map[string]wire.TagRange, len(ranges))
	for _, r := range ranges {
		rec[r.Tag] = r.TagRange.Normal()
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if maps.Equal(rec, m.recorded) {
		return
	}
	m.recorded = rec
	if m.isReady.Load() {
		m.recomputeRanges()
	}
}

// knownRange is the range tag is known to have apart from its value: the record's,
// else the memory's (the default when neither names one).
func (m *Manager) knownRange(tag string) wire.TagRange {
	m.mu.Lock()
	rec, ok := m.recorded[tag]
	m.mu.Unlock()
	if ok {
		return rec
	}
	r, _ := m.memory.rangeOf(tag)
	return r
}

// recomputeRanges publishes every tag's range, resolved from the value, the memory and
// the record, and starts what a range needs: its memory written before it is served
// (the tag answers 503 meanwhile), a cap no longer in force forgotten, a value written
// back. Called with mu held.
func (m *Manager) recomputeRanges() {
	names := map[string]bool{}
	for name, v := range m.optRange {
		if !v.readable || !v.r.IsDefault() {
			names[name] = true
		}
	}
	remembered := m.memory.allRanges()
	for name := range remembered {
		names[name] = true
	}
	for name := range m.recorded {
		names[name] = true
	}
	next := &rangeSet{exact: make(map[string]rangeEntry, len(names))}
	for name := range names {
		var value *optValue
		if v, ok := m.optRange[name]; ok {
			value = &v
		}
		var mem, rec *wire.TagRange
		if r, ok := remembered[name]; ok {
			mem = &r
		}
		if r, ok := m.recorded[name]; ok {
			rec = &r
		}
		r, writeBack, err := resolveRange(name, value, mem, rec)
		switch {
		case err != nil:
			next.exact[name] = rangeEntry{err: err}
			if m.refusedRanges[name] != err.Error() {
				m.refusedRanges[name] = err.Error()
				m.log.Error("monotonic: a tag's range is in doubt: the tag is refused", "tag", name, "err", err)
			}
		case r.IsDefault():
			if mem != nil {
				m.rememberRange(name, r) // a cap lifted by an operator
			}
		case mem == nil || *mem != r:
			next.exact[name] = rangeEntry{r: r, err: fmt.Errorf("%w: tag %q: its range (%s) is being written to this dispenser's data dir", wire.ErrUnavailable, name, r)}
			m.rememberRange(name, r)
		default:
			next.exact[name] = rangeEntry{r: r}
		}
		if err == nil {
			delete(m.refusedRanges, name)
		}
		if writeBack && err == nil && !r.IsDefault() {
			m.writeBackRange(name)
		}
	}
	m.ranges.Store(next)
}

// rememberValueRange writes the range a value of <prefix>_tagopts gives to the memory
// before the value is applied, when it is the range the tag resolves to and the memory
// does not hold it yet: the watch goes on (and this dispenser's presence record
// confirms the value) only once the file holds it, so that a SetRange that returned
// finds every dispenser serving the tag, none still writing its data dir. A write that
// fails is left to rememberRange, which retries while the tag answers 503.
func (m *Manager) rememberValueRange(key string, value []byte) {
	o, readable := decodeOptions(m.log, key, value)
	if !readable || o.TagRange.IsDefault() {
		return
	}
	var mem, rec *wire.TagRange
	if r, ok := m.memory.rangeOf(key); ok {
		mem = &r
	}
	m.mu.Lock()
	if r, ok := m.recorded[key]; ok {
		rec = &r
	}
	m.mu.Unlock()
	r, _, err := resolveRange(key, &optValue{r: o.TagRange, readable: true}, mem, rec)
	if err != nil || r != o.TagRange || mem != nil && *mem == r {
		return
	}
	if err := m.memory.setRange(key, r); err != nil {
		m.log.Warn("monotonic: cannot write a tag's range to the data dir; retrying while the tag is refused", "tag", key, "err", err)
	}
}

// rememberRange writes r as name's range to the memory on a goroutine of its own
// (one per tag at a time), retrying until it is written, then publishes the ranges
// again. Called with mu held.
func (m *Manager) rememberRange(name string, r wire.TagRange) {
	if want, ok := m.remembering[name]; ok && want == r {
		return
	}
	m.remembering[name] = r
	started := m.spawnLocked(func(ctx context.Context) {
		bo := backoff.New(rememberPolicy)
		for {
			m.mu.Lock()
			want := m.remembering[name]
			m.mu.Unlock()
			err := m.memory.setRange(name, want)
			m.mu.Lock()
			if err == nil && m.remembering[name] == want {
				delete(m.remembering, name)
				m.recomputeRanges()
				m.mu.Unlock()
				return
			}
			m.mu.Unlock()
			if err != nil && bo.Failures() == 0 {
				m.log.Error("monotonic: cannot write a tag's range to the data dir; the tag is refused until it is, retrying", "tag", name, "range", want, "err", err)
			}
			if err == nil {
				continue // changed meanwhile: write the newer one
			}
			if !bo.Wait(ctx) {
				return
			}
		}
	})
	if !started {
		delete(m.remembering, name)
	}
}

// writeBackRange writes name's range into its value, on a goroutine of its own: where
// it has no value (create-only, with the monotonic mark this dispenser remembers), or
// a readable value without a range (a compare-and-set on it). A value that holds a
// range meanwhile, or cannot be read, is left alone. Called with mu held.
func (m *Manager) writeBackRange(name string) {
	if m.writingBack[name] {
		return
	}
	m.writingBack[name] = true
	started := m.spawnLocked(func(ctx context.Context) {
		defer func() {
			m.mu.Lock()
			delete(m.writingBack, name)
			m.mu.Unlock()
		}()
		ctx, cancel := context.WithTimeout(ctx, 5*m.cfg.RenewInterval)
		defer cancel()
		var r wire.TagRange
		rev, err := m.putOptions(ctx, name, func(old tagOptions, present, readable bool) (tagOptions, bool) {
			r = m.ranges.Load().exact[name].r
			if present && (!readable || !old.TagRange.IsDefault()) || r.IsDefault() {
				return old, false
			}
			if !present {
				old.Monotonic = m.memory.has(name)
			}
			old.TagRange = r
			return old, true
		})
		switch {
		case err != nil && ctx.Err() == nil:
			m.log.Warn("monotonic: a tag's range not written back; the next change of its value tries again", "tag", name, "err", err)
		case err == nil && rev != 0:
			m.log.Warn("monotonic: a tag's range missing from its value written back from what this dispenser knows", "tag", name, "range", r, "bucket", m.opts.Bucket())
		}
	})
	if !started {
		delete(m.writingBack, name)
	}
}

// ErrRangesUnknown is returned by SetRange while a dispenser of the deployment runs a
// version that knows no tag ranges (it would serve an opaque tag as an ordinary one,
// or a narrow one past its width), naming it.
var ErrRangesUnknown = fmt.Errorf("%w: a dispenser of this deployment knows no tag ranges", wire.ErrUnavailable)

// ErrKeyMissing is returned by SetRange for an opaque range while a dispenser of the
// deployment lacks its ID key: it runs on in the queue group (it started before the
// first opaque tag, when none was needed) and would answer 503 for the tag's share of
// requests. The operator gives it the key, or stops it, first.
var ErrKeyMissing = fmt.Errorf("%w: a dispenser of this deployment lacks the tag's ID key", wire.ErrConflict)

// CanServeRange returns nil when every dispenser with a presence record knows tag
// ranges and, for an opaque r, holds its key; else an error wrapping ErrRangesUnknown
// or ErrKeyMissing naming those that do not.
func (m *Manager) CanServeRange(ctx context.Context, r wire.TagRange) error {
	recs, err := m.presenceRecords(ctx)
	if err != nil {
		return fmt.Errorf("%w: monotonic: %w", wire.ErrUnavailable, err)
	}
	var old, keyless []string
	for _, rec := range recs {
		switch {
		case !slices.Contains(rec.Features, featureRanges):
			old = append(old, cmpName(rec.Node))
		case r.Opaque && rec.IDKey != r.Key:
			has := "no ID key, or a version from before this check"
			if rec.IDKey != "" {
				has = "key fingerprint " + wire.Quote(rec.IDKey[:min(len(rec.IDKey), 64)])
			}
			keyless = append(keyless, fmt.Sprintf("%s (%s)", cmpName(rec.Node), has))
		}
	}
	if len(old) > 0 {
		slices.Sort(old)
		return fmt.Errorf("%w: %s %s a version of leafbus that knows no opaque tags or tag widths, and would serve the tag without its range: upgrade every dispenser first", ErrRangesUnknown, plural(len(old), "dispenser", "dispensers"), strings.Join(old, ", ")+" "+plural(len(old), "runs", "run"))
	}
	if len(keyless) > 0 {
		slices.Sort(keyless)
		return fmt.Errorf("%w: fingerprint %s: %s would answer 503 for it; give the key (--id-key-file) and restart, or stop them first (docs/design.md#opaque-tags-and-ids-in-a-browser)", ErrKeyMissing, r.Key, strings.Join(keyless[:min(len(keyless), 16)], ", "))
	}
	return nil
}

func cmpName(node string) string {
	if node == "" {
		return "(unreadable presence record)"
	}
	return node
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// SetRange writes r as tag's range into its value in <prefix>_tagopts (keeping its
// monotonic mark), with a compare-and-set, and returns once every dispenser with a
// presence record has taken it in (LeaseTTL/2 at most). It refuses (ErrRangesUnknown)
// while a dispenser knows no ranges, and fails with a 503 when not every dispenser
// took the range in in time: the caller must not let the tag be served then (the
// admin call that adds an opaque tag adds it to the store only after this returned).
// Which changes of a range are allowed is the caller's rule (package core); this
// refuses only an opaque range other than the one this dispenser remembers.
func (m *Manager) SetRange(ctx context.Context, tag string, r wire.TagRange) error {
	if err := segment.CheckTagName(tag); err != nil {
		return err
	}
	r = r.Normal()
	if err := r.Validate(); err != nil {
		return wire.BadRequest("tag %q: range %s: %v", tag, r, err)
	}
	if !m.isReady.Load() {
		return errNotReady
	}
	if mem, ok := m.memory.rangeOf(tag); ok && (mem.Opaque || r.Opaque) && mem != r {
		return fmt.Errorf("%w: tag %q: this dispenser remembers serving it as %s, not %s", ErrRangeConflict, tag, mem, r)
	}
	if err := m.CanServeRange(ctx, r); err != nil {
		return err
	}
	rev, err := m.putOptions(ctx, tag, func(old tagOptions, _, _ bool) (tagOptions, bool) {
		old.TagRange = r
		return old, true
	})
	if err != nil {
		return err
	}
	m.log.Info("monotonic: tag range written", "tag", tag, "range", r)
	return m.waitAllApplied(ctx, tag, r, rev)
}

// waitAllApplied waits until every dispenser with a presence record has taken in the
// write of <prefix>_tagopts at revision rev and knows ranges, LeaseTTL/2 at most,
// and fails (503) when one has not by then.
func (m *Manager) waitAllApplied(ctx context.Context, tag string, r wire.TagRange, rev uint64) error {
	deadline := m.now() + m.cfg.LeaseTTL/2
	for {
		behind, _, err := m.presenceBehind(ctx, rev, "")
		if err == nil && len(behind) == 0 {
			if err = m.CanServeRange(ctx, r); err == nil {
				return nil
			}
			return err
		}
		if m.now() >= deadline || !backoff.Sleep(ctx, ackPoll) {
			return fmt.Errorf("%w: tag %q: not every dispenser took its range in within %v (behind: %v, %v): retry the call; until one answers, the tag is not served with the range everywhere",
				wire.ErrUnavailable, tag, m.cfg.LeaseTTL/2, behind, err)
		}
	}
}

// Options are one tag's options as the admin calls show them.
type Options struct {
	Monotonic bool
	Range     wire.TagRange
	// Err says why the tag is refused, when its range is in doubt (ErrRangeConflict);
	// Range is then its value's.
	Err error
}

// TagOptions reads every tag's options from <prefix>_tagopts (not this dispenser's
// view, which may lag a write another dispenser just made), completed as the request
// path resolves them: a tag with no value there has the mark this dispenser remembers
// and the range it or the deployment record knows. Tags with default options are left
// out. The listing is complete (kvbucket.List).
func (m *Manager) TagOptions(ctx context.Context) (map[string]Options, error) {
	entries, err := kvbucket.List(ctx, m.cfg.JetStream, m.opts)
	if err != nil {
		return nil, fmt.Errorf("%w: monotonic: read %s: %w", wire.ErrUnavailable, m.opts.Bucket(), err)
	}
	remembered, ranges := m.memory.all(), m.memory.allRanges()
	m.mu.Lock()
	recorded := maps.Clone(m.recorded)
	m.mu.Unlock()
	entries = byTag(entries)
	names := map[string]bool{}
	values := map[string]optValue{}
	out := map[string]Options{}
	for key, e := range entries {
		o, readable := decodeOptions(m.log, key, e.Value())
		values[key] = optValue{r: o.TagRange, readable: readable}
		names[key] = true
		if o.Monotonic {
			out[key] = Options{Monotonic: true}
		}
	}
	for tag := range remembered {
		if _, ok := entries[tag]; !ok {
			out[tag] = Options{Monotonic: true}
		}
	}
	for tag := range ranges {
		names[tag] = true
	}
	for tag := range recorded {
		names[tag] = true
	}
	for tag := range names {
		var value *optValue
		if v, ok := values[tag]; ok {
			value = &v
		}
		var mem, rec *wire.TagRange
		if r, ok := ranges[tag]; ok {
			mem = &r
		}
		if r, ok := recorded[tag]; ok {
			rec = &r
		}
		o := out[tag]
		o.Range, _, o.Err = resolveRange(tag, value, mem, rec)
		if o.Err != nil && value != nil {
			o.Range = value.r
		}
		if o.Monotonic || !o.Range.IsDefault() || o.Err != nil {
			out[tag] = o
		}
	}
	return out, nil
}
