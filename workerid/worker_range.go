package workerid

import (
	"errors"
	"fmt"
)

// ErrWorkerIDOutOfRange is returned by Acquire when the worker ID recorded for this node
// (its ZooKeeper node, its cache file, its MySQL row) or the one its backend hands out
// lies outside the registry's range (MinWorkerID..MaxWorkerID). Such an ID may belong to
// another datacenter's range, so it is refused, never used or folded into range.
var ErrWorkerIDOutOfRange = errors.New("worker ID outside this deployment's range")

// Range is the worker IDs a registry may hand out, Min to Max inclusive
// (--worker-id-min, --worker-id-max). Deployments in several datacenters, each with a
// registry of its own that cannot see the others' (two ZooKeepers, two NATS clusters,
// two databases), are given disjoint ranges, so that no worker ID is used in two of them.
// Dispensers of one deployment share one range; their registry keeps their IDs apart.
type Range struct {
	Min, Max int64
}

// fullRange is every worker ID a layout with highest ID maxWorkerID holds: 0..maxWorkerID.
func fullRange(maxWorkerID int64) Range { return Range{Min: 0, Max: maxWorkerID} }

// Contains reports whether id is in the range.
func (r Range) Contains(id int64) bool { return id >= r.Min && id <= r.Max }

// Len is how many worker IDs the range holds.
func (r Range) Len() int64 { return r.Max - r.Min + 1 }

// Overlaps reports whether the two ranges share a worker ID.
func (r Range) Overlaps(o Range) bool { return r.Min <= o.Max && o.Min <= r.Max }

// Conflicts reports whether o is a misconfigured neighbour of r: a different range that
// shares worker IDs with r. An equal range is a peer of the same deployment (one
// registry keeps them apart); a disjoint one is another datacenter's, as it should be.
// Only a range that differs yet overlaps means two deployments whose registries cannot
// see each other may hand out the same worker ID.
func (r Range) Conflicts(o Range) bool { return r != o && r.Overlaps(o) }

// String is "min..max", as messages and logs show a range.
func (r Range) String() string { return fmt.Sprintf("%d..%d", r.Min, r.Max) }

// check refuses a range that is empty or starts below 0, naming the config fields.
func (r Range) check(component string) error {
	if err := checkMaxWorkerID(component, r.Max); err != nil {
		return err
	}
	if r.Min < 0 || r.Min > r.Max {
		return invalid(component, "MinWorkerID is %d, want 0 to MaxWorkerID %d (the range of worker IDs this deployment may use)",
			r.Min, r.Max)
	}
	return nil
}

// describe names the range for messages: "worker IDs 512..1023 (--worker-id-min,
// --worker-id-max)".
func (r Range) describe() string {
	return fmt.Sprintf("worker IDs %s (--worker-id-min, --worker-id-max)", r)
}
