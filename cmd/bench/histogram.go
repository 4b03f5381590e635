package main

import (
	"math"
	"math/bits"
	"time"
)

// The histogram is log-linear, in the spirit of HdrHistogram: every power of two of
// nanoseconds is cut into histSub equal buckets, so a bucket is never wider than 1/128 of
// its lower bound. Reporting the bucket's midpoint keeps every percentile within 0.4% of
// the true sample, well inside the 1% we promise from 1 µs to 60 s. Below histSub ns the
// buckets are 1 ns wide, so sub-microsecond values are exact too.
const (
	histSubBits = 7
	histSub     = 1 << histSubBits

	// histMax is the largest value kept apart from its neighbours; anything longer
	// (only a timeout can be) shares the top bucket, while max stays exact.
	histMax = int64(60 * time.Second)

	// histBuckets covers histMax: 60 s < 2^36 ns, and the powers of two from 2^7 to 2^35
	// take one row of histSub buckets each, after the exact row below 2^7.
	histBuckets = (36 - histSubBits + 1) * histSub
)

// hist counts latencies. It is not safe for concurrent use: each worker owns one and the
// run merges them once the workers are done, so recording takes no lock.
type hist struct {
	counts [histBuckets]uint64
	n      uint64
	min    int64
	max    int64
	sum    float64 // nanoseconds; a float because 10^8 samples of a minute overflow int64
}

func newHist() *hist { return &hist{min: math.MaxInt64} }

// histIndex is the bucket of v nanoseconds.
func histIndex(v int64) int {
	if v < histSub {
		return int(max(v, 0))
	}
	v = min(v, histMax)
	shift := bits.Len64(uint64(v)) - 1 - histSubBits
	return (shift+1)*histSub + int(v>>shift) - histSub
}

// histBounds is the lowest value in bucket i and the bucket's width.
func histBounds(i int) (low, width int64) {
	if i < 2*histSub {
		return int64(i), 1
	}
	shift := i/histSub - 1
	return int64(i%histSub+histSub) << shift, 1 << shift
}

// Record adds one latency.
func (h *hist) Record(d time.Duration) {
	v := int64(max(d, 0))
	h.counts[histIndex(v)]++
	h.n++
	h.sum += float64(v)
	h.min = min(h.min, v)
	h.max = max(h.max, v)
}

// Merge adds every sample of o to h.
func (h *hist) Merge(o *hist) {
	for i, c := range o.counts {
		h.counts[i] += c
	}
	h.n += o.n
	h.sum += o.sum
	h.min = min(h.min, o.min)
	h.max = max(h.max, o.max)
}

// Count is the number of samples.
func (h *hist) Count() uint64 { return h.n }

// Max is the largest sample, exactly (0 when empty).
func (h *hist) Max() time.Duration {
	if h.n == 0 {
		return 0
	}
	return time.Duration(h.max)
}

// Min is the smallest sample, exactly (0 when empty).
func (h *hist) Min() time.Duration {
	if h.n == 0 {
		return 0
	}
	return time.Duration(h.min)
}

// Mean is the average sample (0 when empty).
func (h *hist) Mean() time.Duration {
	if h.n == 0 {
		return 0
	}
	return time.Duration(h.sum / float64(h.n))
}

// Percentile is the sample at rank ceil(q/100 * n) of the sorted samples (the nearest-rank
// definition), to within the bucket's resolution; q is 0 to 100. 100 gives the exact max.
func (h *hist) Percentile(q float64) time.Duration {
	if h.n == 0 {
		return 0
	}
	if q >= 100 {
		return time.Duration(h.max)
	}
	rank := uint64(math.Ceil(q / 100 * float64(h.n)))
	rank = max(rank, 1)
	var seen uint64
	for i, c := range h.counts {
		seen += c
		if seen >= rank {
			if i == histIndex(histMax) {
				// The top bucket also holds everything beyond the range; its midpoint
				// would understate those, and the exact max is the honest answer.
				return time.Duration(h.max)
			}
			low, width := histBounds(i)
			mid := low + (width-1)/2
			// The true sample lies in this bucket and within [min, max].
			return time.Duration(min(max(mid, h.min), h.max))
		}
	}
	return time.Duration(h.max)
}
