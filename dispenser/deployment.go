package dispenser

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"

	"github.com/leafbus/leafbus/deployment"
	"github.com/leafbus/leafbus/monotonic"
	"github.com/leafbus/leafbus/segment"
	"github.com/leafbus/leafbus/wire"
	"github.com/leafbus/leafbus/workerid"
)

// The deployment record (package deployment, README "The deployment record"): the step
// "deployment" runs once the segment store and the worker registry are open, and before
// anything is created in them, a worker ID is taken or an ID served. The first
// dispenser of a deployment writes the record; every other refuses to start when it
// does not fit it. While Run runs, the record is read again every few seconds
// (watchDeployment) and a dispenser that no longer fits it stops. The record's
// monotonic tags follow the admin API (recordedMarks), and a mark the record holds but
// the monotonic package lost is written again before it could be served as an ordinary
// tag (restoreMonotonicMarks).

// ownDeployment is what this dispenser is: its store and registry as they name
// themselves (segment.Identifier, workerid.Identifier), its range, its layout.
func (d *Dispenser) ownDeployment() (deployment.Own, error) {
	store, ok := d.store.(segment.Identifier)
	if !ok {
		return deployment.Own{}, fmt.Errorf("the %s segment store cannot say which store it is", d.cfg.SegmentStore)
	}
	reg, ok := d.registry.(workerid.Identifier)
	if !ok {
		return deployment.Own{}, fmt.Errorf("the %s worker registry cannot say which registry it is", d.cfg.WorkerRegistry)
	}
	l := d.cfg.Layout()
	return deployment.Own{
		Store: wire.DeployedStore{Kind: d.cfg.SegmentStore, Identity: store.Identity()},
		Registry: wire.DeployedRegistry{Kind: d.cfg.WorkerRegistry, Identity: reg.Identity(),
			WorkerIDMin: d.cfg.WorkerIDMin, WorkerIDMax: d.cfg.WorkerIDMax},
		Layout: wire.DeployedLayout{Epoch: l.Epoch, TimeBits: l.TimeBits, WorkerBits: l.WorkerBits, SequenceBits: l.SequenceBits},
	}, nil
}

// checkDeployment is the step "deployment": it checks this dispenser against the
// record, writing it when it is the first (deployment.Check). One that does not fit,
// or a record that cannot be read as one, is refused at once; a record that cannot be
// read at all (JetStream still electing its leaders) is waited for within
// --start-timeout, like any dependency.
func (d *Dispenser) checkDeployment(ctx context.Context) error {
	own, err := d.ownDeployment()
	if err != nil {
		return err
	}
	records, err := deployment.Open(ctx, d.js, d.cfg.Prefix, d.cfg.KVReplicas)
	if err != nil {
		return err
	}
	e, outcome, err := deployment.Check(ctx, records, own, d.cfg.NodeID, d.clock.Now())
	switch {
	case errors.Is(err, deployment.ErrMismatch), errors.Is(err, deployment.ErrCorrupt):
		return fmt.Errorf("refusing to start: %w", err)
	case err != nil:
		return err
	}
	d.records, d.own, d.deployed = records, own, e
	d.log.Info("deployment record "+outcome.String(), "bucket", records.Bucket(), "revision", e.Revision,
		"segment_store", own.Store.Identity, "worker_registry", own.Registry.Identity, "written_by", e.Record.WrittenBy)
	return nil
}

// restoreMonotonicMarks is the step after "monotonic tags", before anything is served:
// the marks the record lists and the monotonic package does not have (its bucket lost,
// <prefix>_tagopts) are written again, and the marks it has that the record lacks (set
// by a dispenser older than the record) are added to the record. Either way a tag ends
// up marked: the stronger promise is the safe side of a doubt. The record's tag ranges
// go to the monotonic package, which serves a tag with the range the record names when
// its value lost it (and writes it back), and ranges found in <prefix>_tagopts that the
// record lacks are added to it.
func (d *Dispenser) restoreMonotonicMarks(ctx context.Context) error {
	marked, err := d.mono.MonotonicTags(ctx)
	if err != nil {
		return err
	}
	e, err := d.records.Get(ctx)
	if err != nil {
		return err
	}
	if err := d.restoreRanges(ctx, e.Record); err != nil {
		return err
	}
	for _, tag := range e.Record.MonotonicTags {
		if !marked[tag] {
			if err := d.mono.SetMonotonic(ctx, tag, true); err != nil {
				return err
			}
			d.log.Warn("a tag the deployment record lists as monotonic was not marked (its marks bucket lost?): marked again", "tag", tag, "bucket", d.records.Bucket())
		}
	}
	var missing []string
	for tag := range marked {
		if !slices.Contains(e.Record.MonotonicTags, tag) {
			missing = append(missing, tag)
		}
	}
	if len(missing) > 0 {
		if err := deployment.AddMonotonic(ctx, d.records, missing, d.cfg.NodeID, d.clock.Now()); err != nil {
			return err
		}
		d.log.Info("monotonic tags added to the deployment record", "tags", missing)
	}
	return nil
}

// restoreRanges gives the monotonic package the record's tag ranges, adds to the
// record the ranges <prefix>_tagopts holds that it lacks, and says in the log which
// opaque tags this dispenser will refuse for want of their key.
func (d *Dispenser) restoreRanges(ctx context.Context, rec wire.Deployment) error {
	d.mono.SetRecordedRanges(rec.TagRanges)
	opts, err := d.mono.TagOptions(ctx)
	if err != nil {
		return err
	}
	missing := map[string]wire.TagRange{}
	for tag, o := range opts {
		if o.Err == nil && !o.Range.IsDefault() && rec.RangeOf(tag).IsDefault() {
			missing[tag] = o.Range
		}
	}
	if len(missing) > 0 {
		if err := deployment.AddRanges(ctx, d.records, missing, d.cfg.NodeID, d.clock.Now()); err != nil {
			return err
		}
		d.log.Info("tag ranges added to the deployment record", "tags", slices.Sorted(maps.Keys(missing)))
	}
	var refused []string
	for _, r := range rec.TagRanges {
		if r.Opaque && r.Key != d.shaper.Fingerprint() {
			refused = append(refused, r.Tag)
		}
	}
	switch {
	case len(refused) == 0:
	case d.shaper.Fingerprint() == "":
		d.log.Warn("this deployment has opaque tags, and this dispenser no ID key: it refuses them (503) until it is started with --id-key-file", "tags", len(refused), "first", refused[0])
	default:
		d.log.Error("opaque tags of this deployment are keyed with another ID key than this dispenser's: it refuses them (503); every dispenser needs the same --id-key-file", "tags", len(refused), "first", refused[0], "fingerprint", d.shaper.Fingerprint())
	}
	return nil
}

// watchDeployment runs while Run runs: it reads the record every few seconds and stops
// the dispenser (its error names every difference) once it no longer fits it; and it
// marks again a monotonic tag the record lists that the monotonic package lost while
// running.
func (d *Dispenser) watchDeployment(ctx context.Context) error {
	w := &deployment.Watch{
		Records: d.records, Own: d.own, Node: d.cfg.NodeID, Last: d.deployed,
		Every: d.opts.deploymentEvery, Now: d.clock.Now,
		Logger: d.log.With("component", "deployment"),
		Seen:   d.remarkMonotonic,
	}
	return w.Run(ctx)
}

// remarkMonotonic marks again each tag of rec that is no longer marked where the
// monotonic package keeps the marks (<prefix>_tagopts lost while this dispenser ran,
// and created again empty), so that no dispenser goes on serving it, or starts to
// serve it, as an ordinary tag; and gives the monotonic package rec's tag ranges.
func (d *Dispenser) remarkMonotonic(ctx context.Context, rec wire.Deployment) {
	d.mono.SetRecordedRanges(rec.TagRanges)
	if len(rec.MonotonicTags) == 0 {
		return
	}
	marked, err := d.mono.MonotonicTags(ctx)
	if err != nil {
		return // the watch tries again at its next read
	}
	for _, tag := range rec.MonotonicTags {
		if marked[tag] {
			continue
		}
		if err := d.mono.SetMonotonic(ctx, tag, true); err != nil {
			d.log.Warn("cannot mark again a tag the deployment record lists as monotonic", "tag", tag, "err", err)
			continue
		}
		d.log.Error("a tag the deployment record lists as monotonic was no longer marked (its marks bucket lost?): marked again", "tag", tag)
	}
}

// recordedMarks is the monotonic Manager as the service's admin subjects use it: a tag
// marked through leaf.admin.tags.add/.update is also added to the record, and one
// unmarked is taken out of it first, so that a failure between the two writes leaves
// the tag marked in one of them, and so marked for every dispenser's next start.
func (d *Dispenser) recordedMarks() recordedMarks {
	return recordedMarks{Manager: d.mono, d: d}
}

type recordedMarks struct {
	*monotonic.Manager
	d *Dispenser
}

// SetMonotonic writes the mark and the record.
func (m recordedMarks) SetMonotonic(ctx context.Context, tag string, on bool) error {
	if on {
		if err := m.Manager.SetMonotonic(ctx, tag, true); err != nil {
			return err
		}
		return m.record(ctx, tag, true)
	}
	if err := m.record(ctx, tag, false); err != nil {
		return err
	}
	return m.Manager.SetMonotonic(ctx, tag, false)
}

// SetRange writes a tag's range to the record first, then to <prefix>_tagopts (which
// waits until every dispenser serves it): the record is how a dispenser that remembers
// nothing learns the range of an opaque tag whose value was lost, so it must never lack
// one that is served. Nothing is written while a dispenser knows no ranges.
func (m recordedMarks) SetRange(ctx context.Context, tag string, r wire.TagRange) error {
	if err := m.Manager.RangesKnown(ctx); err != nil {
		return err
	}
	err := deployment.SetRange(ctx, m.d.records, tag, r, m.d.cfg.NodeID, m.d.clock.Now())
	switch {
	case errors.Is(err, deployment.ErrRangeFixed):
		return fmt.Errorf("%w: %w", wire.ErrConflict, err)
	case err != nil:
		return fmt.Errorf("%w: tag %q: the deployment record's tag ranges were not updated (retry): %w", wire.ErrUnavailable, tag, err)
	}
	return m.Manager.SetRange(ctx, tag, r)
}

func (m recordedMarks) record(ctx context.Context, tag string, on bool) error {
	err := deployment.SetMonotonic(ctx, m.d.records, tag, on, m.d.cfg.NodeID, m.d.clock.Now())
	if err != nil {
		return fmt.Errorf("%w: tag %q: the deployment record's monotonic tags were not updated (retry): %w", wire.ErrUnavailable, tag, err)
	}
	return nil
}
