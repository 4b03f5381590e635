package monotonic

import (
	"encoding/json"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/leafbus/leafbus/wire"
)

// leaseRecord is the value of a key of <prefix>_leaders (key: the tag's KV key):
// wire.LeaderLease.
type leaseRecord = wire.LeaderLease

// holder is one revision of a lease key as this dispenser saw it.
type holder struct {
	rec  leaseRecord
	rev  uint64
	gone bool          // deleted or purged (by an operator): free, but maybe just taken from a live leader
	seen time.Duration // on this dispenser's clock, when this revision was first seen
	// stale says the record was seen unchanged for a whole lease TTL: its leader stopped
	// serving. Set (on a copy) only by a follow-only campaign (a tag without a mark,
	// monotonic by its lease alone), to end that.
	stale bool
}

// live reports whether the record says someone leads the tag now: it is held, and not
// seen unchanged for a lease TTL. A tag with a live record is monotonic to every
// dispenser, mark or not.
func (h *holder) live() bool { return !h.free() && !h.stale }

// tagOfKey is the tag a key of <prefix>_tagopts or <prefix>_leaders names (its KV key,
// wire.TagKey); false for a key no tag has, such as a presence record's (a '.' no KV key
// of a tag holds).
func tagOfKey(key string) (string, bool) {
	tag, err := wire.ParseTagKey(key)
	return tag, err == nil
}

// byTag is a listing of <prefix>_tagopts or <prefix>_leaders keyed by the tags its keys
// name; other keys are left out.
func byTag(entries map[string]jetstream.KeyValueEntry) map[string]jetstream.KeyValueEntry {
	out := make(map[string]jetstream.KeyValueEntry, len(entries))
	for key, e := range entries {
		if tag, ok := tagOfKey(key); ok {
			out[tag] = e
		}
	}
	return out
}

// tagKeys is a watch's revisions by key, keyed by the tags the keys name.
func tagKeys(applied map[string]uint64) map[string]uint64 {
	out := make(map[string]uint64, len(applied))
	for key, rev := range applied {
		if tag, ok := tagOfKey(key); ok {
			out[tag] = rev
		}
	}
	return out
}

// free reports whether nobody holds the lease by this record: released or deleted. An
// unreadable record is held by someone unknown until it expires.
func (h *holder) free() bool { return h == nil || h.gone || h.rec.Released }

// holderOf reads a watched entry of <prefix>_leaders; seen is now, unless prev is the
// same revision (a watch that restarted delivers it again), whose first sighting stays.
func holderOf(e jetstream.KeyValueEntry, prev *holder, now time.Duration) *holder {
	if prev != nil && prev.rev == e.Revision() {
		return prev
	}
	h := &holder{rev: e.Revision(), seen: now}
	if e.Operation() != jetstream.KeyValuePut {
		h.gone = true
	} else if err := json.Unmarshal(e.Value(), &h.rec); err != nil {
		h.rec = leaseRecord{}
	}
	return h
}
