package bus

import (
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/leafbus/leafbus/wire"
)

// replyGuard keeps a dispenser's answers out of places a caller could aim them at: a
// reply is a publish with the dispenser's own rights, so a request whose reply subject
// is, say, $KV.leaf_segments.orders would otherwise be a write to the segment store on
// the caller's behalf (the confused deputy). Such requests are dropped unanswered,
// counted per endpoint, and logged at most once per logEvery with how many were dropped
// since the last line.
type replyGuard struct {
	allowed  func(reply string) bool
	logEvery time.Duration
	log      func(endpoint, subject, reply string, dropped uint64)

	lastLog  atomic.Int64  // unix nanoseconds of the last log line
	unlogged atomic.Uint64 // dropped since that line
	nowNanos func() int64
}

func newReplyGuard(subjects wire.Subjects, logger *slog.Logger) *replyGuard {
	return &replyGuard{
		allowed:  subjects.ReplyAllowed,
		logEvery: time.Minute,
		nowNanos: func() int64 { return time.Now().UnixNano() },
		log: func(endpoint, subject, reply string, dropped uint64) {
			logger.Warn("request dropped: its reply subject is not an inbox (a reply there would write with this dispenser's rights)",
				"endpoint", endpoint, "subject", wire.Quote(subject), "reply", wire.Quote(reply), "dropped_since_last_line", dropped)
		},
	}
}

// allow reports whether a request of endpoint with this subject and reply subject may
// be answered; when not, it counts it in refused and logs, at a bounded rate. It costs
// a few comparisons per request and allocates nothing.
func (g *replyGuard) allow(endpoint string, refused *atomic.Uint64, subject, reply string) bool {
	if g.allowed(reply) {
		return true
	}
	refused.Add(1)
	n := g.unlogged.Add(1)
	now := g.nowNanos()
	last := g.lastLog.Load()
	if now-last >= int64(g.logEvery) && g.lastLog.CompareAndSwap(last, now) {
		g.unlogged.Add(-n)
		g.log(endpoint, subject, reply, n)
	}
	return false
}
