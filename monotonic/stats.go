package monotonic

import (
	"slices"
	"strings"
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
