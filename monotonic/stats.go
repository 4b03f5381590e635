package monotonic

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/leafbus/leafbus/wire"
)

// TagStats is one monotonic tag as this dispenser sees it.
type TagStats struct {
	Tag string `json:"tag"`
	// Role is "leader" (serving), "starting" (took the lease, waiting out the previous
	// one), "follower" (another dispenser leads, verified) or "none" (no verified leader
	// known: requests wait for one, within their own bound, then get 503).
	Role          string `json:"role"`
	Leader        string `json:"leader,omitempty"` // the node of the lease record
	Terms         uint64 `json:"terms"`            // leases this dispenser took
	Served        uint64 `json:"served"`           // requests served by the current term, forwarded ones included
	Forwarded     uint64 `json:"forwarded"`        // requests forwarded to a leader and answered
	ForwardErrors uint64 `json:"forward_errors"`   // requests forwarded and refused, or unanswered
	// ForwardMessages counts the forwarded messages that carried them: Forwarded over
	// ForwardMessages is how many requests one round trip to the leader carried.
	ForwardMessages uint64 `json:"forward_messages"`
	// RefusedAnswers counts answers from the leader's inbox that were refused (not as
	// many IDs as asked, not increasing, or not above what this dispenser had passed
	// on); Unverified counts leader records whose instance did not answer $SRV.
	RefusedAnswers uint64 `json:"refused_answers,omitempty"`
	Unverified     uint64 `json:"unverified,omitempty"`
}

// Stats is a snapshot for the service's $SRV.STATS.
type Stats struct {
	Ready          bool       `json:"ready"`
	Tags           []TagStats `json:"tags"`
	RefusedReplies uint64     `json:"refused_replies,omitempty"` // forwarded requests whose reply subject was not an inbox
}

// Stats returns a snapshot, tags sorted by name.
func (m *Manager) Stats() Stats {
	s := Stats{Ready: m.isReady.Load(), Tags: []TagStats{}, RefusedReplies: m.refused.Load()}
	now := m.now()
	for _, ts := range *m.states.Load() {
		st := TagStats{Tag: ts.name, Role: "none", Terms: ts.terms.Load(), Forwarded: ts.forwarded.Load(), ForwardErrors: ts.forwardErrors.Load(), ForwardMessages: ts.forwardMessages.Load(),
			RefusedAnswers: ts.refusedAnswers.Load(), Unverified: ts.unverified.Load()}
		h := ts.holder.Load()
		if h.live() {
			st.Leader = h.rec.Node
		}
		switch t := ts.term.Load(); {
		case t != nil && t.serving(now):
			st.Role, st.Served = "leader", t.served.Load()
		case t != nil && now < t.startsAt():
			st.Role = "starting"
		case m.verifiedLeader(ts, h):
			st.Role = "follower"
		}
		s.Tags = append(s.Tags, st)
	}
	slices.SortFunc(s.Tags, func(a, b TagStats) int { return strings.Compare(a.Tag, b.Tag) })
	return s
}

// SegmentFiller is what the pools take segment IDs from (segment.Generator.Fill).
type SegmentFiller interface {
	Fill(ctx context.Context, tag string, dst []int64) error
}

// OrdinaryOnly wraps src so that it refuses monotonic tags: pre-filled batches are cut
// ahead of time, so a pool must never hold IDs of a tag that promises order.
func (m *Manager) OrdinaryOnly(src SegmentFiller) SegmentFiller {
	return ordinaryOnly{m: m, src: src}
}

type ordinaryOnly struct {
	m   *Manager
	src SegmentFiller
}

func (o ordinaryOnly) Fill(ctx context.Context, tag string, dst []int64) error {
	mono, err := o.m.IsMonotonic(tag)
	if err != nil {
		return err
	}
	if mono {
		return fmt.Errorf("%w: monotonic: tag %q is monotonic: no pre-filled batches", wire.ErrUnavailable, tag)
	}
	return o.src.Fill(ctx, tag, dst)
}
