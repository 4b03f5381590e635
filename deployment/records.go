package deployment

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/leafbus/leafbus/internal/kvbucket"
	"github.com/leafbus/leafbus/wire"
)

// ErrNoRecord is returned by Records.Get when the deployment has no record yet (or it
// was deleted): the first dispenser to start writes one.
var ErrNoRecord = errors.New("no deployment record")

// ErrCorrupt is returned when the record cannot be read as a record of this version:
// written by hand, by a newer leafbus, or damaged. A dispenser refuses to start on it
// rather than guess; `dispenser deployment set` writes a good one over it.
var ErrCorrupt = errors.New("deployment record unreadable")

// ErrChanged is returned by Records.Update when the record is no longer at the revision
// the caller read: someone else wrote it in between.
var ErrChanged = errors.New("deployment record changed since it was read")

// history is how many revisions of the record the bucket keeps, for an operator to see
// what it was (`nats kv history leaf_deployment deployment`).
const history = 16

// casAttempts bounds the read-change-write loops against writers that keep getting in
// first.
const casAttempts = 16

// Records is the deployment's record in JetStream KV: bucket <prefix>_deployment, key
// wire.DeploymentKey. Safe for concurrent use.
type Records struct {
	js  jetstream.JetStream
	cfg jetstream.KeyValueConfig

	mu sync.Mutex
	kv jetstream.KeyValue // replaced by reopen
}

// Entry is the record as read, with its revision (what a compare-and-set writes over).
type Entry struct {
	Record   wire.Deployment
	Revision uint64
}

// Open creates the bucket of prefix's record (history 16, replicas copies), or binds to
// it when it exists.
func Open(ctx context.Context, js jetstream.JetStream, prefix string, replicas int) (*Records, error) {
	subjects, err := wire.NewSubjects(prefix)
	if err != nil {
		return nil, err
	}
	r := &Records{js: js, cfg: jetstream.KeyValueConfig{
		Bucket:      subjects.Bucket(wire.DeploymentBucket),
		Description: "leafbus: what this deployment is (segment store, worker registries, snowflake layout, monotonic tags)",
		History:     history,
		Replicas:    replicas,
	}}
	if err := r.reopen(ctx); err != nil {
		return nil, err
	}
	return r, nil
}

// Look binds to prefix's record bucket for reading only: it never creates the bucket
// nor changes its configuration, so a user that may only read it (deploy/nats-roles.conf:
// operator) can. No bucket is jetstream.ErrBucketNotFound.
func Look(ctx context.Context, js jetstream.JetStream, prefix string) (*Records, error) {
	subjects, err := wire.NewSubjects(prefix)
	if err != nil {
		return nil, err
	}
	r := &Records{js: js, cfg: jetstream.KeyValueConfig{Bucket: subjects.Bucket(wire.DeploymentBucket)}}
	kv, err := js.KeyValue(ctx, r.cfg.Bucket)
	if err != nil {
		return nil, fmt.Errorf("deployment: bind to KV bucket %s: %w", r.cfg.Bucket, err)
	}
	r.kv = kv
	return r, nil
}

// reopen opens the bucket again: after it was deleted, it is created anew.
func (r *Records) reopen(ctx context.Context) error {
	kv, err := kvbucket.Open(ctx, r.js, r.cfg)
	if err != nil {
		return fmt.Errorf("deployment: %w", err)
	}
	r.mu.Lock()
	r.kv = kv
	r.mu.Unlock()
	return nil
}

// bucket is the bucket as last opened.
func (r *Records) bucket() jetstream.KeyValue {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.kv
}

// Bucket is the bucket's name, "leaf_deployment".
func (r *Records) Bucket() string { return r.cfg.Bucket }

// Get reads the record. No record (or a deleted one) is ErrNoRecord; a value that is
// not a valid record is ErrCorrupt, naming the bucket and the value; anything else is
// the error of reading, which may pass (a NATS cluster electing its leaders).
func (r *Records) Get(ctx context.Context) (Entry, error) {
	e, err := r.bucket().Get(ctx, wire.DeploymentKey)
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
		return Entry{}, fmt.Errorf("%w in KV bucket %s", ErrNoRecord, r.Bucket())
	}
	if err != nil {
		return Entry{}, fmt.Errorf("deployment: read the record from KV bucket %s: %w", r.Bucket(), err)
	}
	rec, err := wire.ParseDeployment(e.Value())
	if err != nil {
		return Entry{Revision: e.Revision()}, fmt.Errorf("%w: KV bucket %s, key %s, revision %d: %w", ErrCorrupt, r.Bucket(), wire.DeploymentKey, e.Revision(), err)
	}
	return Entry{Record: rec, Revision: e.Revision()}, nil
}

// Create writes rec as the first record. When there is one already (another dispenser
// wrote first) the error wraps jetstream.ErrKeyExists.
func (r *Records) Create(ctx context.Context, rec wire.Deployment) (Entry, error) {
	b, err := rec.Marshal()
	if err != nil {
		return Entry{}, fmt.Errorf("deployment: %w", err)
	}
	rev, err := r.bucket().Create(ctx, wire.DeploymentKey, b)
	if err != nil {
		return Entry{}, fmt.Errorf("deployment: create the record in KV bucket %s: %w", r.Bucket(), err)
	}
	return Entry{Record: rec, Revision: rev}, nil
}

// Update writes rec over revision rev: ErrChanged when the record is at another one.
func (r *Records) Update(ctx context.Context, rec wire.Deployment, rev uint64) (Entry, error) {
	b, err := rec.Marshal()
	if err != nil {
		return Entry{}, fmt.Errorf("deployment: %w", err)
	}
	next, err := r.bucket().Update(ctx, wire.DeploymentKey, b, rev)
	if errors.Is(err, jetstream.ErrKeyRevisionMismatch) || errors.Is(err, jetstream.ErrKeyExists) {
		return Entry{}, fmt.Errorf("%w: KV bucket %s was at revision %d: %w", ErrChanged, r.Bucket(), rev, err)
	}
	if err != nil {
		return Entry{}, fmt.Errorf("deployment: write the record to KV bucket %s: %w", r.Bucket(), err)
	}
	return Entry{Record: rec, Revision: next}, nil
}

// Raw reads the record's bytes and revision as they are, readable or not (for `dispenser
// deployment show` of a record Get refuses); 0 and nil when there is none.
func (r *Records) Raw(ctx context.Context) ([]byte, uint64, error) {
	e, err := r.bucket().Get(ctx, wire.DeploymentKey)
	if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, fmt.Errorf("deployment: read the record from KV bucket %s: %w", r.Bucket(), err)
	}
	return e.Value(), e.Revision(), nil
}

// NewRecord is the record a deployment whose dispensers are like own has, written by
// node at now for reason, with the monotonic tags tags (sorted here).
func NewRecord(own Own, tags []string, node string, now time.Time, reason string) wire.Deployment {
	rec := wire.Deployment{
		Version:          wire.DeploymentVersion,
		SegmentStore:     own.Store,
		WorkerRegistries: []wire.DeployedRegistry{own.Registry},
		Snowflake:        own.Layout,
	}
	rec.MonotonicTags = sortedTags(tags)
	return stamp(rec, node, now, reason)
}

// stamp sets who wrote rec, when and why.
func stamp(rec wire.Deployment, node string, now time.Time, reason string) wire.Deployment {
	rec.WrittenBy, rec.WrittenAt, rec.Reason = node, now.UTC().Format("2006-01-02T15:04:05.000Z"), reason
	return rec
}

func sortedTags(tags []string) []string {
	out := slices.Clone(tags)
	slices.Sort(out)
	return slices.Compact(out)
}

// Outcome says what Check did.
type Outcome int

const (
	Checked       Outcome = iota // the record was there and this dispenser fits it
	Created                      // there was none: this dispenser's is the first
	AddedRegistry                // it fits, and its registry was added for its worker IDs
)

func (o Outcome) String() string {
	switch o {
	case Created:
		return "created"
	case AddedRegistry:
		return "registry added"
	}
	return "checked"
}

// Check is the start-up check: it reads the record and compares own with it, writing
// the first record when there is none (a create: of two first starts one writes and the
// other compares with what it wrote) and adding own's registry when Compare says so (a
// compare-and-set). A dispenser that does not fit gets a *MismatchError (ErrMismatch);
// an unreadable record ErrCorrupt; both mean: refuse to start. Any other error is one of
// reading or writing the bucket, which may pass. node and now stamp what it writes.
func Check(ctx context.Context, r *Records, own Own, node string, now time.Time) (Entry, Outcome, error) {
	return CheckLive(ctx, r, own, node, now, nil)
}

// CheckLive is Check for a dispenser that can ask the live dispensers of its prefix
// (live, LivePeers): where there is no record, it writes the first only when none
// answers. A deployment whose record vanished while its dispensers run is not a new
// one: they write the record back (Watch), and until then CheckLive returns
// ErrFleetLive, naming them, which a start waits out within --start-timeout and then
// checks itself against the record they wrote. Only dispensers that say what they are
// (wire.MetaDeployment) count: an older one cannot write the record back. An error of
// asking is returned as it is: the record is not created on a doubt (live says nil,
// nil where the deployment does not let its dispensers ask).
func CheckLive(ctx context.Context, r *Records, own Own, node string, now time.Time, live func(context.Context) ([]Peer, error)) (Entry, Outcome, error) {
	for attempt := 1; ; attempt++ {
		e, err := r.Get(ctx)
		if errors.Is(err, ErrNoRecord) && live != nil {
			peers, lerr := live(ctx)
			switch {
			case lerr != nil:
				return Entry{}, Checked, fmt.Errorf("no deployment record, and the live dispensers could not be asked whether there are any: %w", lerr)
			}
			// A dispenser of a version that does not say what it is cannot write the
			// record back either: it does not hold the start.
			if known := slices.DeleteFunc(peers, func(p Peer) bool { return !p.Known() }); len(known) > 0 {
				return Entry{}, Checked, fmt.Errorf("%w: %s", ErrFleetLive, describePeers(known))
			}
		}
		if errors.Is(err, ErrNoRecord) {
			e, err = r.Create(ctx, NewRecord(own, nil, node, now, "first start"))
			if errors.Is(err, jetstream.ErrKeyExists) && attempt < casAttempts {
				continue // another dispenser wrote the first record: compare with it
			}
			return e, Created, err
		}
		if err != nil {
			return Entry{}, Checked, err
		}
		diffs, add := Compare(e.Record, own)
		if len(diffs) > 0 {
			return e, Checked, &MismatchError{Bucket: r.Bucket(), Record: e.Record, Differences: diffs}
		}
		if !add {
			return e, Checked, nil
		}
		reason := fmt.Sprintf("worker registry %s for worker IDs %d..%d added at the start of %s", own.Registry.Identity, own.Registry.WorkerIDMin, own.Registry.WorkerIDMax, node)
		next, err := r.Update(ctx, stamp(withRegistry(e.Record, own.Registry), node, now, reason), e.Revision)
		if errors.Is(err, ErrChanged) && attempt < casAttempts {
			continue
		}
		return next, AddedRegistry, err
	}
}

// SetMonotonic makes the record's monotonic tags follow a tag marked (on) or unmarked
// through the admin API (leaf.admin.tags.add/.update), with a compare-and-set, by node.
// A record that already says so is not written. No record is ErrNoRecord: the
// deployment's dispensers are older than the record, or it was deleted; the mark itself
// is kept where the monotonic package keeps it either way.
func SetMonotonic(ctx context.Context, r *Records, tag string, on bool, node string, now time.Time) error {
	if err := wire.CheckTag(tag); err != nil {
		return err
	}
	for attempt := 1; ; attempt++ {
		e, err := r.Get(ctx)
		if err != nil {
			return err
		}
		tags := slices.DeleteFunc(slices.Clone(e.Record.MonotonicTags), func(t string) bool { return t == tag })
		if on {
			tags = append(tags, tag)
		}
		tags = sortedTags(tags)
		if slices.Equal(tags, e.Record.MonotonicTags) {
			return nil
		}
		rec := e.Record
		rec.MonotonicTags = tags
		verb := "unmarked"
		if on {
			verb = "marked"
		}
		_, err = r.Update(ctx, stamp(rec, node, now, fmt.Sprintf("tag %s %s monotonic through %s", tag, verb, node)), e.Revision)
		if errors.Is(err, ErrChanged) && attempt < casAttempts {
			continue
		}
		return err
	}
}

// AddMonotonic adds tags to the record's monotonic tags (those not there yet), with a
// compare-and-set: what a dispenser does at start with the tags it finds marked that
// the record lacks (a mark written by a dispenser older than the record).
func AddMonotonic(ctx context.Context, r *Records, tags []string, node string, now time.Time) error {
	for attempt := 1; ; attempt++ {
		e, err := r.Get(ctx)
		if err != nil {
			return err
		}
		all := sortedTags(append(slices.Clone(e.Record.MonotonicTags), tags...))
		if slices.Equal(all, e.Record.MonotonicTags) {
			return nil
		}
		rec := e.Record
		rec.MonotonicTags = all
		_, err = r.Update(ctx, stamp(rec, node, now, "monotonic tags found marked at the start of "+node), e.Revision)
		if errors.Is(err, ErrChanged) && attempt < casAttempts {
			continue
		}
		return err
	}
}

// ErrRangeFixed is returned by SetRange for a change of an opaque tag's range, or of a
// tag to or from opaque: the IDs it handed out could meet the ones it would hand out.
var ErrRangeFixed = errors.New("an opaque tag's range never changes")

// SetRange makes the record's tag ranges say rng for tag (the default: none), with a
// compare-and-set, by node: what the admin calls do before they write the range into
// <prefix>_tagopts, so that a tag's range is in the record first. A record that already
// says so is not written; an opaque range in it is never changed, nor a narrow one made
// opaque (ErrRangeFixed: only a tag the record gives the default range, a new one, may
// become opaque here; package core refuses it for a tag that exists). No record is
// ErrNoRecord.
func SetRange(ctx context.Context, r *Records, tag string, rng wire.TagRange, node string, now time.Time) error {
	if err := wire.CheckTag(tag); err != nil {
		return err
	}
	rng = rng.Normal()
	for attempt := 1; ; attempt++ {
		e, err := r.Get(ctx)
		if err != nil {
			return err
		}
		cur := e.Record.RangeOf(tag)
		if cur == rng {
			return nil
		}
		if cur.Opaque || rng.Opaque && !cur.IsDefault() {
			return fmt.Errorf("%w: tag %q is %s in the deployment record, not %s", ErrRangeFixed, tag, cur, rng)
		}
		rec := e.Record
		rec.TagRanges = withRange(rec.TagRanges, tag, rng)
		_, err = r.Update(ctx, stamp(rec, node, now, fmt.Sprintf("tag %s given the range %s through %s", tag, rng, node)), e.Revision)
		if errors.Is(err, ErrChanged) && attempt < casAttempts {
			continue
		}
		return err
	}
}

// AddRanges adds to the record the ranges of ranges for tags it lists none of, with a
// compare-and-set: what a dispenser does at start with ranges it finds in
// <prefix>_tagopts that the record lacks. A range the record lists is never replaced.
func AddRanges(ctx context.Context, r *Records, ranges map[string]wire.TagRange, node string, now time.Time) error {
	for attempt := 1; ; attempt++ {
		e, err := r.Get(ctx)
		if err != nil {
			return err
		}
		rec, added := e.Record, false
		for _, tag := range slices.Sorted(maps.Keys(ranges)) {
			if rng := ranges[tag].Normal(); !rng.IsDefault() && rec.RangeOf(tag).IsDefault() {
				rec.TagRanges, added = withRange(rec.TagRanges, tag, rng), true
			}
		}
		if !added {
			return nil
		}
		_, err = r.Update(ctx, stamp(rec, node, now, "tag ranges found at the start of "+node), e.Revision)
		if errors.Is(err, ErrChanged) && attempt < casAttempts {
			continue
		}
		return err
	}
}

// SettleRanges makes the record's tag ranges exactly ranges (the running fleet's view:
// an entry no tag's own state bears out taken out, the ranges the tags have put in),
// with one compare-and-set by node. A record that already says so is not written;
// ErrChanged when another writer got in first (the caller reads again at its next turn).
func SettleRanges(ctx context.Context, r *Records, ranges map[string]wire.TagRange, node string, now time.Time) error {
	e, err := r.Get(ctx)
	if err != nil {
		return err
	}
	var next []wire.DeployedRange
	for _, tag := range slices.Sorted(maps.Keys(ranges)) {
		next = withRange(next, tag, ranges[tag])
	}
	cur := map[string]wire.TagRange{}
	for _, d := range e.Record.TagRanges {
		cur[d.Tag] = d.TagRange.Normal()
	}
	want := map[string]wire.TagRange{}
	for _, d := range next {
		want[d.Tag] = d.TagRange
	}
	if maps.Equal(cur, want) {
		return nil
	}
	rec := e.Record
	rec.TagRanges = next
	_, err = r.Update(ctx, stamp(rec, node, now, "tag ranges written back by "+node+" as the running fleet serves them"), e.Revision)
	return err
}

// withRange is ranges with tag's range set to rng (the default: removed), sorted.
func withRange(ranges []wire.DeployedRange, tag string, rng wire.TagRange) []wire.DeployedRange {
	out := slices.DeleteFunc(slices.Clone(ranges), func(r wire.DeployedRange) bool { return r.Tag == tag })
	if !rng.IsDefault() {
		out = append(out, wire.DeployedRange{Tag: tag, TagRange: rng.Normal()})
	}
	slices.SortFunc(out, func(a, b wire.DeployedRange) int { return cmp.Compare(a.Tag, b.Tag) })
	return out
}

// Replace is the record `dispenser deployment set` writes: current (nil when there is
// none, or it is unreadable) with own's segment store and snowflake layout, and own's
// registry for own's worker IDs in place of every registry that hands out any of them
// (with dropOthers, in place of all of them), its monotonic tags and tag ranges kept;
// written by node at now.
func Replace(current *wire.Deployment, own Own, dropOthers bool, node string, now time.Time) wire.Deployment {
	if current == nil {
		return NewRecord(own, nil, node, now, "deployment set by "+node)
	}
	next := *current
	next.Version = wire.DeploymentVersion
	next.SegmentStore, next.Snowflake = own.Store, own.Layout
	next.WorkerRegistries = nil
	for _, r := range current.WorkerRegistries {
		if !dropOthers && !r.Overlaps(own.Registry) {
			next.WorkerRegistries = append(next.WorkerRegistries, r)
		}
	}
	next.WorkerRegistries = append(next.WorkerRegistries, own.Registry)
	slices.SortFunc(next.WorkerRegistries, func(a, b wire.DeployedRegistry) int { return cmp.Compare(a.WorkerIDMin, b.WorkerIDMin) })
	next.MonotonicTags = sortedTags(current.MonotonicTags)
	return stamp(next, node, now, "deployment set by "+node)
}
