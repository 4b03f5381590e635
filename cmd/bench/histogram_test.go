package main

import (
	"math"
	"math/rand/v2"
	"slices"
	"testing"
	"time"
)

// oraclePercentile is the nearest-rank percentile of sorted samples: the definition
// hist.Percentile approximates.
func oraclePercentile(sorted []time.Duration, q float64) time.Duration {
	rank := int(math.Ceil(q / 100 * float64(len(sorted))))
	return sorted[max(rank, 1)-1]
}

func TestHistPercentilesMatchOracle(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	tests := []struct {
		name string
		gen  func() time.Duration
		n    int
	}{
		{"OneSample", func() time.Duration { return 1234567 * time.Nanosecond }, 1},
		{"Constant", func() time.Duration { return 250 * time.Microsecond }, 1000},
		{"SubMicrosecond", func() time.Duration { return time.Duration(rng.IntN(1000)) }, 5000},
		{"Uniform1usTo10ms", func() time.Duration {
			return time.Microsecond + time.Duration(rng.Int64N(int64(10*time.Millisecond)))
		}, 20000},
		{"LogUniform1usTo60s", func() time.Duration {
			// Every decade from 1 µs to 60 s equally likely: all bucket rows are exercised.
			exp := rng.Float64() * math.Log10(60e6)
			return time.Duration(math.Pow(10, exp) * float64(time.Microsecond))
		}, 50000},
		{"HeavyTail", func() time.Duration {
			if rng.IntN(1000) == 0 {
				return time.Duration(rng.Int64N(int64(2*time.Second))) + time.Second
			}
			return time.Duration(rng.NormFloat64()*20e3 + 200e3)
		}, 30000},
	}
	quantiles := []float64{0, 1, 10, 50, 90, 99, 99.9, 99.99, 100}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			h := newHist()
			samples := make([]time.Duration, tt.n)
			for i := range samples {
				samples[i] = max(tt.gen(), 0)
				h.Record(samples[i])
			}
			slices.Sort(samples)
			for _, q := range quantiles {
				got, want := h.Percentile(q), oraclePercentile(samples, q)
				if relErr(got, want) > 0.01 {
					t.Errorf("Percentile(%v) = %v, want %v within 1%% (error %.3f%%)", q, got, want, 100*relErr(got, want))
				}
			}
			if h.Max() != samples[len(samples)-1] || h.Min() != samples[0] {
				t.Errorf("Min/Max = %v/%v, want exact %v/%v", h.Min(), h.Max(), samples[0], samples[len(samples)-1])
			}
			if h.Count() != uint64(tt.n) {
				t.Errorf("Count() = %d, want %d", h.Count(), tt.n)
			}
		})
	}
}

func relErr(got, want time.Duration) float64 {
	if want == 0 {
		return math.Abs(float64(got))
	}
	return math.Abs(float64(got-want)) / float64(want)
}

func TestHistMergeEqualsOneHistogram(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	all, parts := newHist(), []*hist{newHist(), newHist(), newHist()}
	for i := range 9000 {
		d := time.Duration(rng.Int64N(int64(time.Second)))
		all.Record(d)
		parts[i%3].Record(d)
	}
	merged := newHist()
	merged.Merge(newHist()) // an empty worker must not disturb min/max
	for _, p := range parts {
		merged.Merge(p)
	}
	if merged.counts != all.counts || merged.Count() != all.Count() || merged.Min() != all.Min() || merged.Max() != all.Max() {
		t.Fatalf("merged histogram differs from the one fed every sample: n %d/%d min %v/%v max %v/%v",
			merged.Count(), all.Count(), merged.Min(), all.Min(), merged.Max(), all.Max())
	}
}

func TestHistEdges(t *testing.T) {
	h := newHist()
	if h.Percentile(50) != 0 || h.Max() != 0 || h.Min() != 0 || h.Mean() != 0 {
		t.Fatalf("empty histogram: p50 %v max %v min %v mean %v, want all 0", h.Percentile(50), h.Max(), h.Min(), h.Mean())
	}
	h.Record(-time.Second) // a clock oddity is counted as zero, not as a negative bucket
	h.Record(10 * time.Minute)
	if h.Min() != 0 || h.Max() != 10*time.Minute {
		t.Fatalf("Min/Max = %v/%v, want 0/10m", h.Min(), h.Max())
	}
	if got := h.Percentile(99); got != 10*time.Minute {
		t.Fatalf("Percentile(99) above the range = %v, want the exact max 10m", got)
	}
	if i := histIndex(histMax); i >= histBuckets {
		t.Fatalf("histIndex(60s) = %d, beyond %d buckets", i, histBuckets)
	}
	// Buckets tile the range: each starts where the previous ended.
	for i := 1; i < histBuckets; i++ {
		pl, pw := histBounds(i - 1)
		if l, _ := histBounds(i); l != pl+pw {
			t.Fatalf("bucket %d starts at %d, previous ends at %d", i, l, pl+pw)
		}
		if l, _ := histBounds(i); histIndex(l) != i && l <= histMax {
			t.Fatalf("histIndex(%d) = %d, want %d", l, histIndex(l), i)
		}
	}
}

func BenchmarkHistRecord(b *testing.B) {
	b.ReportAllocs()
	h := newHist()
	for i := 0; b.Loop(); i++ {
		h.Record(time.Duration(i&0xfffff) * 100)
	}
}
