package main

import (
	"testing"
	"time"

	"github.com/leafbus/leafbus/testenv"
)

// TestRunRounds: with --rounds the phases take turns; the totals hold every round's
// requests and each round has its ratio.
func TestRunRounds(t *testing.T) {
	n := testenv.StartNATS(t)
	startFake(t, n, faults{})
	cfg := testConfig(n.URL())
	cfg.Baseline, cfg.Rounds, cfg.Requests = "echo", 3, 301
	rep := runBounded(t, cfg)
	if rep.Dispenser.OK != 301 || len(rep.Dispenser.Errors) != 0 {
		t.Fatalf("dispenser ok %d errors %v over 3 rounds, want 301 good replies", rep.Dispenser.OK, rep.Dispenser.Errors)
	}
	b := rep.Baseline
	if b == nil || b.Echo == nil || b.Echo.OK != 301 {
		t.Fatalf("baseline %+v, want 301 good replies over 3 rounds", b)
	}
	if len(b.RoundRatios) != 3 || b.MedianRoundRatio <= 0 {
		t.Fatalf("round ratios %v median %v, want 3 and a positive median", b.RoundRatios, b.MedianRoundRatio)
	}
}

func TestLoadSpecRound(t *testing.T) {
	s := &loadSpec{warmup: time.Second, duration: 9 * time.Second, requests: 10}
	tests := []struct {
		r, rounds    int
		wantWarmup   time.Duration
		wantDuration time.Duration
		wantRequests int64
	}{
		{0, 1, time.Second, 9 * time.Second, 10},
		{0, 3, time.Second, 3 * time.Second, 3},
		{1, 3, time.Second / 3, 3 * time.Second, 3},
		{2, 3, time.Second / 3, 3 * time.Second, 4}, // the remainder goes last
	}
	for _, tt := range tests {
		got := s.round(tt.r, tt.rounds)
		if got.warmup != tt.wantWarmup || got.duration != tt.wantDuration || got.requests != tt.wantRequests {
			t.Errorf("round(%d, %d) = warm-up %v, duration %v, requests %d; want %v, %v, %d",
				tt.r, tt.rounds, got.warmup, got.duration, got.requests, tt.wantWarmup, tt.wantDuration, tt.wantRequests)
		}
	}
}

func TestMergeResults(t *testing.T) {
	a := newPhaseResult(false)
	a.elapsed, a.ok, a.sent, a.cpu = time.Second, 100, 100, map[string]float64{cpuBench: 2}
	a.errors["503"] = 1
	a.hist.Record(time.Millisecond)
	b := newPhaseResult(false)
	b.elapsed, b.ok, b.sent, b.cpu = 3*time.Second, 300, 301, map[string]float64{cpuBench: 6}
	b.errors["503"] = 2
	b.hist.Record(2 * time.Millisecond)
	var total *phaseResult
	total = total.merge(a).merge(b)
	if total.ok != 400 || total.sent != 401 || total.elapsed != 4*time.Second || total.errors["503"] != 3 || total.hist.Count() != 2 {
		t.Fatalf("merged ok %d sent %d elapsed %v errors %v count %d", total.ok, total.sent, total.elapsed, total.errors, total.hist.Count())
	}
	if got := total.cpu[cpuBench]; got != 5 { // (100*2 + 300*6) / 400
		t.Fatalf("merged CPU per request %v, want 5 (weighted by replies)", got)
	}
	if got := total.requestsPerS(); got != 100 {
		t.Fatalf("requestsPerS = %v, want 100", got)
	}
}

func TestMedian(t *testing.T) {
	for _, tt := range []struct {
		in   []float64
		want float64
	}{{nil, 0}, {[]float64{3}, 3}, {[]float64{3, 1, 2}, 2}, {[]float64{4, 1, 3, 2}, 2.5}} {
		if got := median(tt.in); got != tt.want {
			t.Errorf("median(%v) = %v, want %v", tt.in, got, tt.want)
		}
	}
}

// TestBaselineSamplesAfterTheDispenser: the echo's canned reply is sampled once the
// dispenser's first phase has run, so it has the size of the replies under load: here
// IDs count from 1, so a sample taken before the load would be 1 byte, not 3.
func TestBaselineSamplesAfterTheDispenser(t *testing.T) {
	n := testenv.StartNATS(t)
	f := startFake(t, n, faults{})
	f.mu.Lock()
	f.next = 1
	f.mu.Unlock()
	cfg := testConfig(n.URL())
	cfg.Baseline = "echo"
	rep := runBounded(t, cfg)
	if b := rep.Baseline; b == nil || len(b.PayloadBytes) != 1 || b.PayloadBytes[0] != 3 {
		t.Fatalf("baseline %+v: want a canned reply of 3 bytes (an ID above 200)", b)
	}
}
