package main

import (
	"slices"
	"time"
)

// Rounds (--rounds): the measured part is cut into rounds that take turns, the
// dispenser's phase and then each baseline's, so that a minute in which the host steals
// time or another job takes the cores falls on every phase alike. Each round's
// requests/s ratio is reported, and their median beside the ratio of the totals.

// round is the spec of round r of rounds: a share of the duration and of the request
// budget, and the whole warm-up in the first round only (the connections and the
// responders are warm by the next one; a short warm-up lets the window fill again).
func (s *loadSpec) round(r, rounds int) *loadSpec {
	if rounds <= 1 {
		return s
	}
	c := *s
	c.duration = s.duration / time.Duration(rounds)
	if s.requests > 0 {
		c.requests = s.requests / int64(rounds)
		if r == rounds-1 {
			c.requests += s.requests % int64(rounds)
		}
	}
	if r > 0 {
		c.warmup = s.warmup / time.Duration(rounds)
	}
	return &c
}

// merge returns r with o's results added (o itself when r is nil): the totals of two
// phases run one after the other on the same target. CPU per request is weighted by
// each phase's good replies.
func (r *phaseResult) merge(o *phaseResult) *phaseResult {
	if r == nil {
		return o
	}
	for label, v := range o.cpu {
		if _, ok := r.cpu[label]; ok {
			r.cpu[label] = (r.cpu[label]*float64(r.ok) + v*float64(o.ok)) / float64(max(r.ok+o.ok, 1))
		}
	}
	r.elapsed += o.elapsed
	r.sent += o.sent
	r.ok += o.ok
	r.ids += o.ids
	for k, n := range o.errors {
		r.errors[k] += n
	}
	for k, samples := range o.errorSamples {
		for _, msg := range samples {
			r.sample(k, msg)
		}
	}
	r.hist.Merge(o.hist)
	if r.sendLag != nil && o.sendLag != nil {
		r.sendLag.Merge(o.sendLag)
	}
	r.late += o.late
	r.orderViolations += o.orderViolations
	r.regressions += o.regressions
	r.slowConsumers += o.slowConsumers
	if r.collectors == nil {
		r.collectors = make([][]*collector, len(o.collectors))
	}
	for i := range min(len(r.collectors), len(o.collectors)) {
		r.collectors[i] = append(r.collectors[i], o.collectors[i]...)
	}
	return r
}

// requestsPerS is good replies per second of the measured time.
func (r *phaseResult) requestsPerS() float64 {
	if s := r.elapsed.Seconds(); s > 0 {
		return float64(r.ok) / s
	}
	return 0
}

// median of xs; 0 for none.
func median(xs []float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(xs))
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}
