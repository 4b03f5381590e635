package testutil

import (
	"cmp"
	"slices"
	"time"
)

// Reply is one answer with IDs of a monotonic tag as a checker sees it: its first and
// last ID, and when its request was sent and its answer received, on one clock.
type Reply struct {
	First, Last int64
	Sent, Recv  time.Duration
}

// Broken is a reply (its index) that broke the monotonic promise (PROTOCOL.md
// "Monotonic tags"): its first ID is not above Above, the highest ID of the replies
// received before it was sent.
type Broken struct {
	Reply int
	Above int64
}

// BrokenPromises checks every reply against every reply received before it was sent:
// the replies sorted by receive time with a running maximum of their last IDs, and a
// binary search per reply, so a million replies take a second, not hours.
func BrokenPromises(replies []Reply) []Broken {
	byRecv := slices.Clone(replies)
	slices.SortFunc(byRecv, func(a, b Reply) int { return cmp.Compare(a.Recv, b.Recv) })
	runMax := make([]int64, len(byRecv))
	for i, rep := range byRecv {
		runMax[i] = rep.Last
		if i > 0 {
			runMax[i] = max(runMax[i], runMax[i-1])
		}
	}
	var out []Broken
	for j, rep := range replies {
		i, _ := slices.BinarySearchFunc(byRecv, rep.Sent, func(a Reply, sent time.Duration) int { return cmp.Compare(a.Recv, sent) })
		// byRecv[:i] were received before rep was sent.
		if i > 0 && rep.First <= runMax[i-1] {
			out = append(out, Broken{Reply: j, Above: runMax[i-1]})
		}
	}
	return out
}

// Duplicates returns every ID that occurs more than once in ids (once per extra
// occurrence), in increasing order.
func Duplicates(ids []int64) []int64 {
	sorted := slices.Clone(ids)
	slices.Sort(sorted)
	var dups []int64
	for i := 1; i < len(sorted); i++ {
		if sorted[i] == sorted[i-1] {
			dups = append(dups, sorted[i])
		}
	}
	return dups
}
