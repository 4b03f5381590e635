package main

import (
	"math"
	"time"
)

// schedule is the open-loop timetable. Slot i (counted over all clients) is due at
// start + i/rate whatever happened to earlier slots, and client c sends slots c, c+C,
// c+2C... Latency is measured from the slot's due time, not from when the sender got
// round to it, so a stalled server shows up as latency instead of as fewer requests
// (the coordinated-omission trap of closed-loop testers).
type schedule struct {
	rate    float64 // requests per second over all clients
	clients int64
	warmup  int64 // slots below this are warm-up: sent, checked, not measured
	limit   int64 // slots from here on are not sent; math.MaxInt64 runs until stopped
}

func newSchedule(rate float64, clients int, warmup, duration time.Duration, requests int64) schedule {
	s := schedule{rate: rate, clients: int64(clients), limit: math.MaxInt64}
	s.warmup = slotsIn(warmup, rate)
	if duration > 0 {
		s.limit = s.warmup + slotsIn(duration, rate)
	}
	if requests > 0 {
		s.limit = min(s.limit, s.warmup+requests)
	}
	return s
}

// slotsIn is how many slots fall due in a span starting at a slot: ceil(d * rate),
// without the rounding error of a float product turning 100.0000001 into 101.
func slotsIn(d time.Duration, rate float64) int64 {
	return int64(math.Ceil(d.Seconds()*rate - 1e-9))
}

// slot is the global slot of client's seq-th request.
func (s schedule) slot(client int, seq int64) int64 {
	return int64(client) + seq*s.clients
}

// at is when slot i is due, as an offset from the start of the run.
func (s schedule) at(i int64) time.Duration {
	return time.Duration(float64(i) * float64(time.Second) / s.rate)
}
