package wire

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
)

// The deployment record: one per deployment (one prefix on one NATS), saying what the
// deployment is, so that every dispenser can check that it fits before it serves
// (ARCHITECTURE.md invariant 6). It is the value of key DeploymentKey in the KV bucket
// Subjects.Bucket(DeploymentBucket), "leaf_deployment", as JSON:
//
//	{"version":1,
//	 "segment_store":{"kind":"mysql","identity":"mysql db1:3306/leaf"},
//	 "worker_registries":[{"kind":"zk","identity":"zk /snowflake/leaf-prod","worker_id_min":0,"worker_id_max":1023}],
//	 "snowflake":{"epoch":1288834974657,"time_bits":41,"worker_bits":10,"sequence_bits":12},
//	 "monotonic_tags":["orders"],
//	 "tag_ranges":[{"tag":"invoices","bits":53,"opaque":true,"key":"f412d2d97e6120bb37a45c97"}],
//	 "written_by":"disp-1","written_at":"2026-11-24T10:00:00.000Z","reason":"first start"}
//
// A deployment has one segment store and one snowflake layout. It may have several
// worker registries, each for a range of worker IDs no other registry of the record
// uses (several datacenters, each with its own ZooKeeper and range): a worker ID is
// handed out by one registry only. monotonic_tags are the tags marked monotonic,
// sorted; tag_ranges the tags whose range is not the default (opaque, or narrower than
// 63 bits), sorted by tag and left out when there are none, so that a dispenser of a
// version before them, which refuses a record with a field it does not know, starts in
// a deployment only while it has no such tag. The last three fields say who wrote the
// record last, when, and why.
const (
	DeploymentBucket  = "deployment" // the bucket is Subjects.Bucket(DeploymentBucket)
	DeploymentKey     = "deployment"
	DeploymentVersion = 1
)

// Segment store and worker registry kinds, as the record holds them (the values of
// --segment-store and --worker-registry).
var (
	SegmentStoreKinds   = []string{"kv", "mysql"}
	WorkerRegistryKinds = []string{"kv", "zk", "mysql", "static"}
)

// Deployment is the deployment record.
type Deployment struct {
	Version          int                `json:"version"`
	SegmentStore     DeployedStore      `json:"segment_store"`
	WorkerRegistries []DeployedRegistry `json:"worker_registries"`
	Snowflake        DeployedLayout     `json:"snowflake"`
	MonotonicTags    []string           `json:"monotonic_tags"`
	TagRanges        []DeployedRange    `json:"tag_ranges,omitempty"`
	WrittenBy        string             `json:"written_by"`
	WrittenAt        string             `json:"written_at"` // RFC 3339 with milliseconds, UTC
	Reason           string             `json:"reason"`
}

// DeployedStore is the segment store: its kind and which one (segment.Identifier).
type DeployedStore struct {
	Kind     string `json:"kind"`
	Identity string `json:"identity"`
}

// DeployedRegistry is a worker registry (workerid.Identifier) and the worker IDs it
// hands out in this deployment (--worker-id-min, --worker-id-max).
type DeployedRegistry struct {
	Kind        string `json:"kind"`
	Identity    string `json:"identity"`
	WorkerIDMin int64  `json:"worker_id_min"`
	WorkerIDMax int64  `json:"worker_id_max"`
}

// Overlaps reports whether r and o share a worker ID.
func (r DeployedRegistry) Overlaps(o DeployedRegistry) bool {
	return r.WorkerIDMin <= o.WorkerIDMax && o.WorkerIDMin <= r.WorkerIDMax
}

// Within reports whether every worker ID of r is one of o's.
func (r DeployedRegistry) Within(o DeployedRegistry) bool {
	return o.WorkerIDMin <= r.WorkerIDMin && r.WorkerIDMax <= o.WorkerIDMax
}

// SameRegistry reports whether r and o are one registry (kind and identity).
func (r DeployedRegistry) SameRegistry(o DeployedRegistry) bool {
	return r.Kind == o.Kind && r.Identity == o.Identity
}

// DeployedRange is a tag whose range is not the default (TagRange, normal).
type DeployedRange struct {
	Tag string `json:"tag"`
	TagRange
}

// String is the tag and its range: "invoices: opaque, 53 bits, key f412...".
func (r DeployedRange) String() string { return r.Tag + ": " + r.TagRange.String() }

// DeployedLayout is the snowflake layout and epoch.
type DeployedLayout struct {
	Epoch        int64 `json:"epoch"`
	TimeBits     int   `json:"time_bits"`
	WorkerBits   int   `json:"worker_bits"`
	SequenceBits int   `json:"sequence_bits"`
}

// ErrBadDeployment is returned by ParseDeployment for a value that is not a deployment
// record this version can read.
var ErrBadDeployment = errors.New("not a valid deployment record")

// ParseDeployment reads a record, refusing anything Validate refuses, a version other
// than DeploymentVersion, unknown fields and trailing data: a record this dispenser
// cannot fully read is never taken as one it can.
func ParseDeployment(b []byte) (Deployment, error) {
	var d Deployment
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&d); err != nil {
		return Deployment{}, fmt.Errorf("%w: %s: %v", ErrBadDeployment, Quote(string(b)), err)
	}
	if dec.More() {
		return Deployment{}, fmt.Errorf("%w: more than one JSON value", ErrBadDeployment)
	}
	if err := d.Validate(); err != nil {
		return Deployment{}, err
	}
	return d, nil
}

// Validate checks a record: the version, known kinds with identities, registries whose
// ranges are valid and shared only by entries of one registry, a layout of at most 63
// bits (53 with js53), valid monotonic tags, sorted and each once, and valid tag ranges,
// sorted by tag and each once. Errors wrap ErrBadDeployment.
func (d Deployment) Validate() error {
	var errs []error
	add := func(format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: "+format, append([]any{ErrBadDeployment}, args...)...))
	}
	if d.Version != DeploymentVersion {
		add("version %d, this dispenser reads version %d (a newer leafbus wrote it?)", d.Version, DeploymentVersion)
	}
	if !slices.Contains(SegmentStoreKinds, d.SegmentStore.Kind) || d.SegmentStore.Identity == "" {
		add("segment store %q %q: want a kind of %v and an identity", d.SegmentStore.Kind, d.SegmentStore.Identity, SegmentStoreKinds)
	}
	if len(d.WorkerRegistries) == 0 {
		add("no worker registry")
	}
	for i, r := range d.WorkerRegistries {
		if !slices.Contains(WorkerRegistryKinds, r.Kind) || r.Identity == "" {
			add("worker registry %d: %q %q: want a kind of %v and an identity", i, r.Kind, r.Identity, WorkerRegistryKinds)
		}
		if r.WorkerIDMin < 0 || r.WorkerIDMin > r.WorkerIDMax {
			add("worker registry %d: worker IDs %d..%d: want 0 <= min <= max", i, r.WorkerIDMin, r.WorkerIDMax)
		}
		for _, o := range d.WorkerRegistries[:i] {
			if r.Overlaps(o) && !r.SameRegistry(o) {
				add("worker registries %q (%d..%d) and %q (%d..%d) share worker IDs", o.Identity, o.WorkerIDMin, o.WorkerIDMax, r.Identity, r.WorkerIDMin, r.WorkerIDMax)
			}
		}
	}
	l := d.Snowflake
	if l.TimeBits < 1 || l.WorkerBits < 1 || l.SequenceBits < 1 || l.TimeBits+l.WorkerBits+l.SequenceBits > 63 || l.Epoch < 0 {
		add("snowflake layout %d/%d/%d bits, epoch %d: want positive bits that sum to at most 63 and an epoch >= 0", l.TimeBits, l.WorkerBits, l.SequenceBits, l.Epoch)
	}
	for i, tag := range d.MonotonicTags {
		if err := CheckTag(tag); err != nil {
			add("monotonic tag %d: %v", i, err)
		}
		if i > 0 && tag <= d.MonotonicTags[i-1] {
			add("monotonic tags not sorted or repeated at %s", Quote(tag))
		}
	}
	for i, r := range d.TagRanges {
		if err := CheckTag(r.Tag); err != nil {
			add("tag range %d: %v", i, err)
		}
		if err := r.TagRange.Validate(); err != nil {
			add("tag range of %s: %v", Quote(r.Tag), err)
		}
		if r.TagRange != r.Normal() || r.IsDefault() {
			add("tag range of %s: %s is not written as a range of its own (bits given, not the default)", Quote(r.Tag), r.TagRange)
		}
		if i > 0 && r.Tag <= d.TagRanges[i-1].Tag {
			add("tag ranges not sorted or repeated at %s", Quote(r.Tag))
		}
	}
	return errors.Join(errs...)
}

// Marshal encodes the record, validated.
func (d Deployment) Marshal() ([]byte, error) {
	if d.MonotonicTags == nil {
		d.MonotonicTags = []string{}
	}
	if err := d.Validate(); err != nil {
		return nil, err
	}
	return json.Marshal(d)
}

// RangeOf is tag's range in the record: the default when it lists none.
func (d Deployment) RangeOf(tag string) TagRange {
	for _, r := range d.TagRanges {
		if r.Tag == tag {
			return r.TagRange
		}
	}
	return TagRange{}
}
