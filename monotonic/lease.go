package monotonic

import (
	"encoding/json"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// leaseRecord is the value of a key of <prefix>_leaders (key: the tag): who leads the
// tag and where to forward its requests. Released is written by a leader that stopped
// serving the tag on purpose, so the next one need not wait out the lease.
type leaseRecord struct {
	Node     string `json:"node"`
	Instance string `json:"instance"` // one per Manager: tells a restarted node's leases apart
	Subject  string `json:"subject"`  // the leader's inbox for forwarded requests
	TTLMs    int64  `json:"ttl_ms"`
	Released bool   `json:"released,omitempty"`
}

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

// leaseKey reports whether key of <prefix>_leaders is a tag's lease (a tag name has no
// dot), rather than a dispenser's presence record (presence.go).
func leaseKey(key string) bool { return !strings.Contains(key, ".") }

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
