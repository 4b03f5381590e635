package monotonic

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/leafbus/leafbus/internal/backoff"
	"github.com/leafbus/leafbus/internal/kvbucket"
	"github.com/leafbus/leafbus/segment"
	"github.com/leafbus/leafbus/wire"
)

// tagOptions is the value of a key of <prefix>_tagopts: the options of one segment
// tag that Leaf's leaf_alloc has no column for: its monotonic mark and its range
// (ranges.go), {"monotonic":false,"bits":53,"opaque":true,"key":"f412..."}; the
// default range is left out.
type tagOptions = wire.TagOptions

// markSet is the tags marked monotonic as this dispenser last saw them, by their exact
// bytes: a tag is one tag however its store compares it, because the segment store
// refuses every spelling of a row but its own (segment.ErrTagSpelling), so no other
// spelling of a monotonic tag is ever served. Never changed once published.
type markSet struct {
	exact map[string]bool
}

// lookup says whether tag is marked.
func (s *markSet) lookup(tag string) (bool, error) { return s.exact[tag], nil }

// newMarkSet is the set of tags marked on.
func newMarkSet(tags map[string]bool) *markSet {
	s := &markSet{exact: make(map[string]bool, len(tags))}
	for t, on := range tags {
		if on {
			s.exact[t] = true
		}
	}
	return s
}

// decodeOptions reads a <prefix>_tagopts value; readable is false for a value it
// cannot read, or whose range is not valid. Such a value counts as monotonic: the
// stronger promise is the safe side of a doubt; and it says no range, so the tag is
// served only with the range this dispenser remembers or the deployment record names
// (resolveRange), and refused without one.
func decodeOptions(logger *slog.Logger, key string, value []byte) (o tagOptions, readable bool) {
	err := json.Unmarshal(value, &o)
	if err == nil {
		err = o.TagRange.Validate()
	}
	if err != nil {
		logger.Error("monotonic: unreadable tag options; the tag is served as monotonic, and with a range only if this dispenser or the deployment record knows it, until they are rewritten", "tag", key, "value", string(value), "err", err)
		return tagOptions{Monotonic: true}, false
	}
	o.TagRange = o.TagRange.Normal()
	return o, true
}

// optionsWriteAttempts bounds the read-change-write loop of putOptions against
// writers that keep getting in first.
const optionsWriteAttempts = 16

// putOptions changes tag's value in <prefix>_tagopts with a compare-and-set on the
// revision read (a create when it has none), so that what change keeps of the value
// (the mark, the range) is what was there: change gets the value read, whether there
// was one and whether it was readable, and returns the value to write, or false to
// write nothing (then putOptions returns 0). It returns the revision written.
func (m *Manager) putOptions(ctx context.Context, tag string, change func(old tagOptions, present, readable bool) (tagOptions, bool)) (uint64, error) {
	for attempt := 1; ; attempt++ {
		var old tagOptions
		var rev uint64
		present, readable := false, false
		e, err := m.opts.Get(ctx, wire.TagKey(tag))
		switch {
		case err == nil:
			old, readable = decodeOptions(m.log, tag, e.Value())
			rev, present = e.Revision(), true
		case errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted):
		default:
			return 0, fmt.Errorf("%w: monotonic: read the options of tag %q from %s: %w", wire.ErrUnavailable, tag, m.opts.Bucket(), err)
		}
		next, write := change(old, present, readable)
		if !write {
			return 0, nil
		}
		next.TagRange = next.TagRange.Normal()
		b, err := json.Marshal(next)
		if err != nil {
			return 0, fmt.Errorf("monotonic: encode options of tag %q: %w", tag, err)
		}
		if present {
			rev, err = m.opts.Update(ctx, wire.TagKey(tag), b, rev)
		} else {
			rev, err = m.opts.Create(ctx, wire.TagKey(tag), b)
		}
		switch {
		case err == nil:
			return rev, nil
		case (errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch)) && attempt < optionsWriteAttempts && ctx.Err() == nil:
			continue // written meanwhile: read it again
		}
		return 0, fmt.Errorf("%w: monotonic: write the options of tag %q to %s: %w", wire.ErrUnavailable, tag, m.opts.Bucket(), err)
	}
}

// SetMonotonic marks tag monotonic or ordinary in <prefix>_tagopts; every dispenser
// sees it through its watch. tag must be the name as the store keeps it.
//
// Marking a tag monotonic returns once every dispenser has taken the mark in (their
// presence records say so; LeaseTTL/2 at most, presence.go): from then on none serves
// it as an ordinary tag, and the promise holds for every request sent after this
// returned. A tag that was not monotonic anywhere, and whose lease key holds nothing,
// gets a released lease record first, so that its first leader serves at once: nobody
// led it within the last two lease TTLs, so nobody can be serving it.
//
// Marking it ordinary ({"monotonic":false}) is the operator's word that every
// dispenser forgets it (memory.go); its leader gives its lease back, and this returns
// once this dispenser serves the tag as an ordinary tag (LeaseTTL/2 at most).
func (m *Manager) SetMonotonic(ctx context.Context, tag string, on bool) error {
	if err := segment.CheckTagName(tag); err != nil {
		return err
	}
	if on {
		m.offerFirstLease(ctx, tag)
	}
	rev, err := m.putOptions(ctx, tag, func(old tagOptions, present, readable bool) (tagOptions, bool) {
		if !present || !readable {
			old.TagRange = m.knownRange(tag) // the range stays what it is known to be
		}
		old.Monotonic = on
		return old, true
	})
	if err != nil {
		return err
	}
	m.log.Info("monotonic: tag mark written", "tag", tag, "monotonic", on)
	if on {
		m.waitApplied(ctx, tag, rev)
	} else {
		m.waitOrdinary(ctx, tag)
	}
	return nil
}

// waitOrdinary waits, LeaseTTL/2 at most, until this dispenser serves tag as an ordinary
// tag: it took the mark in and the tag's leader gave its lease back (a live lease keeps
// a tag monotonic). The other dispensers follow within moments; a request one of them
// took meanwhile is answered 503, to be asked again.
func (m *Manager) waitOrdinary(ctx context.Context, tag string) {
	if !m.isReady.Load() {
		return
	}
	deadline := m.now() + m.cfg.LeaseTTL/2
	for m.marks.Load().exact[tag] {
		if m.now() >= deadline || !backoff.Sleep(ctx, ackPoll) {
			m.log.Warn("monotonic: tag marked ordinary, but still monotonic here: its leader has not given its lease back yet", "tag", tag, "waited", m.cfg.LeaseTTL/2)
			return
		}
	}
}

// offerFirstLease writes a released lease record for tag when it is not monotonic, by
// its mark or in this dispenser's view (memory, a live lease), and its lease key holds
// no message at all (a write with expected revision 0): whoever led the tag last wrote
// its record more than two lease TTLs ago (the bucket keeps every record, release and
// delete marker that long), so stopped serving long ago. Best effort: without it the
// first leader's create is fenced, as for a lease record that vanished.
func (m *Manager) offerFirstLease(ctx context.Context, tag string) {
	if e, err := m.opts.Get(ctx, wire.TagKey(tag)); err == nil {
		if o, _ := decodeOptions(m.log, tag, e.Value()); o.Monotonic {
			return
		}
	} else if err != nil && !errors.Is(err, jetstream.ErrKeyNotFound) {
		return
	}
	if mono, _ := m.marks.Load().lookup(tag); mono {
		return
	}
	m.mu.Lock()
	instance := m.instance // set when Run starts, which may be now
	m.mu.Unlock()
	rec, err := json.Marshal(leaseRecord{Node: m.cfg.NodeID, Instance: instance, TTLMs: m.cfg.LeaseTTL.Milliseconds(), Released: true})
	if err != nil {
		return
	}
	if _, err := m.leaders.Update(ctx, wire.TagKey(tag), rec, 0); err != nil {
		m.log.Debug("monotonic: no first lease record written; the first leader's lease is fenced", "tag", tag, "err", err)
	}
}

// writeBack writes the mark of each remembered tag of tags into <prefix>_tagopts, where
// it has no value (the bucket was lost, or the key deleted or purged), with the range
// the tag is known to have: create-only, so that a value written meanwhile (an
// operator's, another dispenser's) wins.
func (m *Manager) writeBack(ctx context.Context, tags []string) {
	var written []string
	for _, tag := range tags {
		b, err := json.Marshal(tagOptions{Monotonic: true, TagRange: m.knownRange(tag)})
		if err != nil {
			continue
		}
		callCtx, cancel := context.WithTimeout(ctx, 5*m.cfg.RenewInterval)
		_, err = m.opts.Create(callCtx, wire.TagKey(tag), b)
		cancel()
		switch {
		case err == nil:
			written = append(written, tag)
		case errors.Is(err, jetstream.ErrKeyExists):
		case ctx.Err() == nil:
			// The next listing (a watch that starts again) writes it back again.
			m.log.Warn("monotonic: a remembered monotonic tag's mark not written back", "tag", tag, "err", err)
		}
	}
	if len(written) > 0 {
		m.log.Warn("monotonic: marks missing from the bucket written back from this dispenser's memory (to make a tag ordinary: dispenser tag update --tag T --monotonic=false)",
			"bucket", m.opts.Bucket(), "tags", len(written), "first", written[:min(len(written), 20)])
	}
}

// MonotonicTags reads every mark from <prefix>_tagopts (not this dispenser's view,
// which may lag a write another dispenser just made): the tags marked monotonic, and
// the tags this dispenser remembers as monotonic that have no value there (a lost
// bucket, before the marks are written back). The listing is complete
// (kvbucket.List): a marked tag is never left out.
func (m *Manager) MonotonicTags(ctx context.Context) (map[string]bool, error) {
	entries, err := kvbucket.List(ctx, m.cfg.JetStream, m.opts)
	if err != nil {
		return nil, fmt.Errorf("%w: monotonic: read %s: %w", wire.ErrUnavailable, m.opts.Bucket(), err)
	}
	entries = byTag(entries)
	out := map[string]bool{}
	for tag, e := range entries {
		if o, _ := decodeOptions(m.log, tag, e.Value()); o.Monotonic {
			out[tag] = true
		}
	}
	for tag := range m.memory.all() {
		if _, ok := entries[tag]; !ok {
			out[tag] = true
		}
	}
	return out, nil
}
