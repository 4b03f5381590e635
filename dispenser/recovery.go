package dispenser

import (
	"context"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/leafbus/leafbus/metrics"
)

// recoveryTick is how often the recovery watch looks at the dependencies and the
// service: the resolution of the times it reports.
const recoveryTick = 50 * time.Millisecond

// recoveryWatch measures how long this node takes to serve fully again after a fault:
// from the moment what failed is back (its NATS connection, its ZooKeeper session) to
// the moment the node serves snowflake IDs again with everything connected. A fault
// that no dependency shows (the worker ID lost while paused, a lease renewal late) is
// measured from when the node noticed it. Each recovery is logged, and the last and the
// longest are in $SRV.STATS ("recovery") and /metrics (leafbus_recovery_*).
type recoveryWatch struct {
	d *Dispenser

	mu     sync.Mutex
	stats  RecoveryStats
	down   time.Time            // start of the fault in progress; zero when none
	downOf []string             // what was down at its start
	reason string               // why snowflake IDs were not served at its start
	back   time.Time            // when the last dependency that failed came back
	was    map[string]time.Time // when each dependency now down went down
}

// RecoveryStats is the recovery watch's report ($SRV.STATS "recovery").
type RecoveryStats struct {
	// Faults counts faults since start; InFault is true while one lasts, Down names what
	// is down or not serving then.
	Faults  int    `json:"faults"`
	InFault bool   `json:"in_fault"`
	Down    string `json:"down,omitempty"`
	// Last is the last recovery; MaxRecoveryMs the longest time to recover seen.
	Last          *Recovery `json:"last,omitempty"`
	MaxRecoveryMs int64     `json:"max_recovery_ms"`
}

// Recovery is one fault, from its start to full service.
type Recovery struct {
	// What was down or not serving at the fault's start: "nats", "zookeeper",
	// "snowflake" (the generator suspended: lease not renewed or lost, records late).
	What string `json:"what"`
	// Start is when the fault was seen, Back when the last dependency that failed came
	// back (Start when none did), Served when the node served fully again.
	Start  time.Time `json:"start"`
	Back   time.Time `json:"back"`
	Served time.Time `json:"served"`
	// RecoveryMs is Served - Back: the time from the fault's end to full service.
	// OutageMs is Served - Start.
	RecoveryMs int64  `json:"recovery_ms"`
	OutageMs   int64  `json:"outage_ms"`
	Reason     string `json:"reason,omitempty"`
}

func newRecoveryWatch(d *Dispenser) *recoveryWatch {
	return &recoveryWatch{d: d, was: map[string]time.Time{}}
}

// Run looks every recoveryTick until ctx ends; it always returns nil.
func (w *recoveryWatch) Run(ctx context.Context) error {
	tick := time.NewTicker(recoveryTick)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case now := <-tick.C:
			w.observe(now)
		}
	}
}

// probe reports the dependencies that are down now, and why the node does not serve
// snowflake IDs ("" when it does).
func (w *recoveryWatch) probe() (down []string, notServing string) {
	d := w.d
	if d.nc != nil && d.nc.Status() != nats.CONNECTED {
		down = append(down, "nats")
	}
	if zk, ok := d.registry.(interface{ Connected() bool }); ok && !zk.Connected() {
		down = append(down, "zookeeper")
	}
	if d.heartbeat != nil {
		if st := d.heartbeat.Stats(); st.Suspended {
			notServing = st.SuspendReason
			if notServing == "" {
				notServing = "suspended"
			}
		}
	}
	return down, notServing
}

func (w *recoveryWatch) observe(now time.Time) {
	down, notServing := w.probe()
	w.mu.Lock()
	defer w.mu.Unlock()
	healthy := len(down) == 0 && notServing == ""
	if w.down.IsZero() {
		if healthy {
			return
		}
		w.down, w.back, w.downOf, w.reason = now, time.Time{}, down, notServing
		if notServing != "" {
			w.downOf = append(w.downOf, "snowflake")
		}
		w.stats.Faults++
		w.d.log.Warn("fault: not serving fully", "down", strings.Join(w.downOf, ","), "snowflake", notServing)
	}
	for dep := range w.was {
		if !slices.Contains(down, dep) {
			delete(w.was, dep)
			w.back = now // a dependency came back
		}
	}
	for _, dep := range down {
		if _, ok := w.was[dep]; !ok {
			w.was[dep] = now
		}
	}
	w.stats.InFault, w.stats.Down = !healthy, strings.Join(append(down, nonEmpty(notServing)...), "; ")
	if healthy {
		w.recovered(now)
	}
}

// recovered closes the fault in progress at now. w.mu is held.
func (w *recoveryWatch) recovered(now time.Time) {
	back := w.back
	if back.IsZero() {
		back = w.down
	}
	r := &Recovery{
		What: strings.Join(w.downOf, ","), Start: w.down, Back: back, Served: now,
		RecoveryMs: now.Sub(back).Milliseconds(), OutageMs: now.Sub(w.down).Milliseconds(), Reason: w.reason,
	}
	w.stats.Last = r
	w.stats.MaxRecoveryMs = max(w.stats.MaxRecoveryMs, r.RecoveryMs)
	w.down, w.downOf, w.back = time.Time{}, nil, time.Time{}
	w.d.log.Info("full service again", "fault", r.What, "recovery", msOf(r.RecoveryMs), "outage", msOf(r.OutageMs))
}

// Stats is a snapshot for $SRV.STATS.
func (w *recoveryWatch) Stats() RecoveryStats {
	w.mu.Lock()
	defer w.mu.Unlock()
	s := w.stats
	if s.Last != nil {
		last := *s.Last
		s.Last = &last
	}
	return s
}

// Metrics is the snapshot /metrics reads (metrics.Sources.Recovery).
func (w *recoveryWatch) Metrics() metrics.Recovery {
	s := w.Stats()
	m := metrics.Recovery{Faults: uint64(s.Faults), InFault: s.InFault, Max: msOf(s.MaxRecoveryMs)}
	if s.Last != nil {
		m.Last = msOf(s.Last.RecoveryMs)
	}
	return m
}

func msOf(ms int64) time.Duration { return time.Duration(ms) * time.Millisecond }

func nonEmpty(s string) []string {
	if s == "" {
		return nil
	}
	return []string{s}
}
