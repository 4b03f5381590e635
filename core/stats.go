package core

import (
	"sync/atomic"

	"github.com/leafbus/leafbus/wire"
)

// KindStats are the core's figures for one kind of ID, over every face: what $SRV.STATS
// shows as the data of the segment and snowflake endpoints.
type KindStats struct {
	IDsIssued  uint64 `json:"ids_issued"`
	Pooled     uint64 `json:"pooled_replies"` // answered with a ready-made batch
	Waited     uint64 `json:"waited"`         // answered off the caller's goroutine
	WaitErrors uint64 `json:"wait_errors"`    // of those, answered with an error
	Overloaded uint64 `json:"overloaded"`     // refused: MaxWaiting requests already waited
	// LastUnavailable is the text of the last 503 (or other 5xx) answered, "" if none.
	LastUnavailable string `json:"last_unavailable,omitempty"`
}

// kindCounters are one kind's figures as they are counted.
type kindCounters struct {
	idsIssued, pooled, waited, waitErrors, overloaded atomic.Uint64
	lastUnavailable                                   atomic.Pointer[string]
}

// unavailable remembers err's text when it is a 5xx answer.
func (k *kindCounters) unavailable(err error) {
	if code, desc := CodeOf(err); code >= 500 {
		k.lastUnavailable.Store(&desc)
	}
}

func (c *Core) kind(k wire.Kind) *kindCounters {
	if k == wire.Snowflake {
		return &c.stats[1]
	}
	return &c.stats[0]
}

// Stats returns the figures of kind k.
func (c *Core) Stats(k wire.Kind) KindStats {
	st := c.kind(k)
	out := KindStats{
		IDsIssued:  st.idsIssued.Load(),
		Pooled:     st.pooled.Load(),
		Waited:     st.waited.Load(),
		WaitErrors: st.waitErrors.Load(),
		Overloaded: st.overloaded.Load(),
	}
	if s := st.lastUnavailable.Load(); s != nil {
		out.LastUnavailable = *s
	}
	return out
}
