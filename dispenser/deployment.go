package dispenser

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/nats-io/nats.go"

	"github.com/leafbus/leafbus/core"
	"github.com/leafbus/leafbus/deployment"
	"github.com/leafbus/leafbus/metrics"
	"github.com/leafbus/leafbus/monotonic"
	"github.com/leafbus/leafbus/opaque"
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
// monotonic tags follow the admin API (core.Record, deploymentRecord), and a mark the record holds but
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
	e, outcome, err := deployment.CheckLive(ctx, records, own, d.cfg.NodeID, d.clock.Now(), d.livePeers)
	switch {
	case errors.Is(err, deployment.ErrMismatch), errors.Is(err, deployment.ErrCorrupt):
		return fmt.Errorf("refusing to start: %w", err)
	case err != nil:
		return err
	}
	d.records, d.own, d.deployed = records, own, e
	// No key, no serving, as soon as the record says so: before a worker ID is taken
	// and the clock waited for (restoreRanges checks again, against the tags' own
	// options too, once they are loaded).
	if diff, ok := d.keyDifference(e.Record.TagRanges, nil); ok {
		return fmt.Errorf("refusing to start: %w", &deployment.MismatchError{Bucket: records.Bucket(), Record: e.Record, Differences: []deployment.Difference{diff}})
	}
	d.watch = &deployment.Watch{
		Records: records, Own: own, Node: d.cfg.NodeID, Last: e,
		Every: d.opts.deploymentEvery, Now: d.clock.Now,
		Logger: d.log.With("component", "deployment"),
		Seen:   d.remarkMonotonic,
		Peers: func(ctx context.Context) ([]deployment.Peer, error) {
			self := ""
			if d.svc != nil {
				self = d.svc.Info().ID
			}
			return deployment.LivePeers(ctx, d.nc, d.cfg.Prefix, self)
		},
	}
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

// restoreRanges gives the monotonic package the record's tag ranges that the tags' own
// state bears out (checkRanges), adds to the record the ranges <prefix>_tagopts and the
// data dir hold that it lacks, and refuses to start (a *deployment.MismatchError) when
// this deployment has opaque tags and this dispenser has not their ID key: it would
// answer 503 for them. A range the record alone names for a tag the store has served is
// taken only when no live dispenser answers (the record is then the last word, after
// <prefix>_tagopts and every data dir were lost); beside a live fleet the start waits
// (within --start-timeout) for the fleet, which knows, to settle the record.
func (d *Dispenser) restoreRanges(ctx context.Context, rec wire.Deployment) error {
	opts, err := d.mono.TagOptions(ctx) // the tags' own state: nothing recorded is known yet
	if err != nil {
		return err
	}
	accepted, doubts, err := d.checkRanges(ctx, rec, opts, false)
	if err != nil {
		return err
	}
	if len(doubts) > 0 {
		peers, err := d.livePeers(ctx)
		if err != nil {
			return err
		}
		if slices.ContainsFunc(peers, deployment.Peer.Known) {
			return fmt.Errorf("the deployment record names the range %s for tag %s, which neither its tag options nor this data dir name and the store has served, and live dispensers answer: waiting for them to settle the record", doubts[0].TagRange, wire.Quote(doubts[0].Tag))
		}
		for _, r := range doubts {
			d.log.Warn("a tag's range is known from the deployment record only (its tag options and this data dir lost, no live dispenser): taken from the record", "tag", r.Tag, "range", r.TagRange.String())
		}
		accepted = append(accepted, doubts...)
	}
	d.mono.SetRecordedRanges(accepted)
	if err := d.addOwnRanges(ctx, rec, opts); err != nil {
		return err
	}
	if diff, ok := d.keyDifference(accepted, opts); ok {
		return fmt.Errorf("refusing to start: %w", &deployment.MismatchError{Bucket: d.records.Bucket(), Record: rec, Differences: []deployment.Difference{diff}})
	}
	return nil
}

// addOwnRanges adds to the record the ranges of opts (the tags' own state) it lacks.
func (d *Dispenser) addOwnRanges(ctx context.Context, rec wire.Deployment, opts map[string]monotonic.Options) error {
	missing := map[string]wire.TagRange{}
	for tag, o := range opts {
		if o.Err == nil && !o.Range.IsDefault() && rec.RangeOf(tag).IsDefault() {
			missing[tag] = o.Range
		}
	}
	if len(missing) == 0 {
		return nil
	}
	if err := deployment.AddRanges(ctx, d.records, missing, d.cfg.NodeID, d.clock.Now()); err != nil {
		return err
	}
	d.log.Info("tag ranges added to the deployment record", "tags", slices.Sorted(maps.Keys(missing)))
	return nil
}

// keyDifference is the ID key this dispenser lacks: a tag of ranges (the record's, as
// borne out) or of opts (its tag options, the data dir's memory) is opaque, keyed with
// another key than this dispenser's, or this one has none. No key, no serving: such a
// dispenser would join the queue group and answer 503 for those tags.
func (d *Dispenser) keyDifference(ranges []wire.DeployedRange, opts map[string]monotonic.Options) (deployment.Difference, bool) {
	mine := ""
	if d.idKey != nil {
		mine = opaque.Fingerprint(d.idKey)
	}
	keys := map[string][]string{} // fingerprint: tags
	for _, r := range ranges {
		if r.Opaque && r.Key != mine {
			keys[r.Key] = append(keys[r.Key], r.Tag)
		}
	}
	for tag, o := range opts {
		if o.Range.Opaque && o.Range.Key != mine && !slices.Contains(keys[o.Range.Key], tag) {
			keys[o.Range.Key] = append(keys[o.Range.Key], tag)
		}
	}
	if len(keys) == 0 {
		return deployment.Difference{}, false
	}
	var want []string
	for _, fp := range slices.Sorted(maps.Keys(keys)) {
		tags := slices.Sorted(slices.Values(keys[fp]))
		want = append(want, fmt.Sprintf("fingerprint %s (opaque tags %s)", fp, strings.Join(tags[:min(len(tags), 3)], ", ")))
	}
	own := "none"
	if mine != "" {
		own = "fingerprint " + mine
	}
	return deployment.Difference{
		What:     "ID key of opaque tags",
		Recorded: strings.Join(want, " and "),
		Own:      own,
		Fix:      fmt.Sprintf("start it with --id-key-file naming the key file of fingerprint %s, or that key in %s: every dispenser of the deployment needs it", slices.Sorted(maps.Keys(keys))[0], IDKeyEnv),
	}, true
}

// checkRanges splits the record's tag ranges by the tags' own state (opts: their tag
// options in <prefix>_tagopts, the data dir's memory, and what this dispenser already
// took from the record): accepted, the entries it bears out and those of tags the store
// does not have yet (`tag add` writes the record first); doubts, the entries of tags
// whose own state names no range but that the store has served (a range the record
// alone names: applying it would serve the tag's numbers through the permutation, over
// the raw ones it served). An entry that names another range than the tag's own is
// refused, never applied. running says the dispenser serves: it has served those tags
// as their own state says, so a doubt is refused too; the refusals are kept for
// /readyz, the status page and the metric, and logged once. A running dispenser refuses
// an entry only when two reads in a row find it so: an admin call writes a range to the
// record first and to the tag options after, and a read between the two would refuse
// (and write the record back without) the range being set. The first finding is
// returned among doubts: neither applied nor refused.
func (d *Dispenser) checkRanges(ctx context.Context, rec wire.Deployment, opts map[string]monotonic.Options, running bool) (accepted, doubts []wire.DeployedRange, err error) {
	refused := map[string]string{}
	var inStore map[string]bool
	for _, r := range rec.TagRanges {
		want := r.TagRange.Normal()
		o, ok := opts[r.Tag]
		switch {
		case ok && o.Range.Normal() == want:
			accepted = append(accepted, r)
			continue
		case ok && !o.Range.IsDefault():
			refused[r.Tag] = fmt.Sprintf("the deployment record names tag %s %s, its tag options %s: the record's entry is refused", wire.Quote(r.Tag), want, o.Range)
			continue
		}
		if inStore == nil {
			tags, err := d.store.Tags(ctx)
			if err != nil {
				return nil, nil, fmt.Errorf("deployment record: check its tag ranges against the store: %w", err)
			}
			inStore = make(map[string]bool, len(tags))
			for _, t := range tags {
				inStore[t.Name] = true
			}
		}
		switch {
		case !inStore[r.Tag]:
			accepted = append(accepted, r)
		case running:
			refused[r.Tag] = fmt.Sprintf("the deployment record names tag %s %s, which this dispenser served without: the record's entry is refused", wire.Quote(r.Tag), want)
		default:
			doubts = append(doubts, r)
		}
	}
	d.rangeMu.Lock()
	if running {
		held := map[string]string{}
		for _, r := range rec.TagRanges {
			why, ok := refused[r.Tag]
			if ok && d.refusedRanges[r.Tag] != why && d.heldRanges[r.Tag] != why {
				held[r.Tag] = why
				delete(refused, r.Tag)
				doubts = append(doubts, r)
			}
		}
		d.heldRanges = held
	}
	for tag, why := range refused {
		if d.refusedRanges[tag] != why {
			d.log.Error("a tag range of the deployment record contradicts the tag's own state: refused, never applied (a range comes only through `dispenser tag add`)", "tag", tag, "why", why)
		}
	}
	d.refusedRanges = refused
	d.rangeMu.Unlock()
	return accepted, doubts, nil
}

// watchDeployment runs while Run runs: it reads the record every few seconds and stops
// the dispenser (its error names every difference) once it no longer fits it; and it
// marks again a monotonic tag the record lists that the monotonic package lost while
// running.
func (d *Dispenser) watchDeployment(ctx context.Context) error {
	return d.watch.Run(ctx)
}

// remarkMonotonic marks again each tag of rec that is no longer marked where the
// monotonic package keeps the marks (<prefix>_tagopts lost while this dispenser ran,
// and created again empty), so that no dispenser goes on serving it, or starts to
// serve it, as an ordinary tag; and gives the monotonic package rec's tag ranges.
func (d *Dispenser) remarkMonotonic(ctx context.Context, rec wire.Deployment) {
	// A running dispenser knows its tags: an entry the tag's own state does not bear
	// out is refused here too, doubts among them (it served the tag without it).
	if opts, err := d.mono.TagOptions(ctx); err == nil {
		if accepted, held, err := d.checkRanges(ctx, rec, opts, true); err == nil {
			d.mono.SetRecordedRanges(accepted)
			if len(held) == 0 { // else the next read settles them
				d.settleRanges(ctx, rec, accepted, opts)
			}
		}
	}
	if len(rec.MonotonicTags) == 0 {
		return
	}
	marked, err := d.mono.MonotonicTags(ctx)
	if err != nil {
		return // the watch tries again at its next read
	}
	lost := slices.DeleteFunc(slices.Clone(rec.MonotonicTags), func(tag string) bool { return marked[tag] })
	if len(lost) == 0 {
		return
	}
	// rec was read before the marks: an unmark in between (core records it first and
	// writes the mark after) would look like a lost mark and be undone. A record read
	// after the marks is as new as they are; a tag that record still lists and they
	// lack was lost, or is being marked (the mark is written before the record) and
	// ends up marked either way.
	now, err := d.records.Get(ctx)
	if err != nil {
		return // the watch tries again at its next read
	}
	for _, tag := range lost {
		if !slices.Contains(now.Record.MonotonicTags, tag) {
			continue
		}
		if err := d.mono.SetMonotonic(ctx, tag, true); err != nil {
			d.log.Warn("cannot mark again a tag the deployment record lists as monotonic", "tag", tag, "err", err)
			continue
		}
		d.log.Error("a tag the deployment record lists as monotonic was no longer marked (its marks bucket lost?): marked again", "tag", tag)
	}
}

// deploymentRecord is the deployment record as core's admin calls write a mark or a
// range to it (core.Record), stamped with this node and the time; core says in which
// order against the marks and ranges themselves.
type deploymentRecord struct{ d *Dispenser }

func (r deploymentRecord) SetMonotonic(ctx context.Context, tag string, on bool) error {
	return deployment.SetMonotonic(ctx, r.d.records, tag, on, r.d.cfg.NodeID, r.d.clock.Now())
}

func (r deploymentRecord) SetRange(ctx context.Context, tag string, rng wire.TagRange) error {
	return deployment.SetRange(ctx, r.d.records, tag, rng, r.d.cfg.NodeID, r.d.clock.Now())
}

// deploymentProblems is what is wrong with the deployment record for this running
// dispenser: the watch's finding and the tag ranges of the record it refused.
func (d *Dispenser) deploymentProblems() []string {
	var out []string
	if d.watch != nil {
		if p := d.watch.Problem(); p != "" {
			out = append(out, p)
		}
	}
	d.rangeMu.Lock()
	defer d.rangeMu.Unlock()
	for _, tag := range slices.Sorted(maps.Keys(d.refusedRanges)) {
		out = append(out, d.refusedRanges[tag])
	}
	return out
}

// withDeployment adds the deployment record's problems to /readyz and the status page:
// as warnings, for the dispenser serves on safely (it refused what it contradicts).
func (d *Dispenser) withDeployment(r core.Readiness) core.Readiness {
	return core.ReadinessFunc(func() core.Health {
		h := r.Health()
		if p := d.deploymentProblems(); len(p) > 0 {
			h.Warning = strings.Join(append([]string{h.Warning}[:min(len(h.Warning), 1)], p...), "; ")
		}
		return h
	})
}

// deploymentState is the metrics' view of the deployment record.
func (d *Dispenser) deploymentState() metrics.Deployment {
	var m metrics.Deployment
	if d.watch != nil {
		m.Refusals = d.watch.Refusals()
	}
	m.Problem = len(d.deploymentProblems()) > 0
	return m
}

// settleRanges writes the record back as the running fleet serves its tags: the entries
// it refused (checkRanges) out, the ranges of the tags' own state in, with a
// compare-and-set (of several dispensers one writes; the others see it at their next
// read). It is how a start that waits on a range in doubt gets on.
func (d *Dispenser) settleRanges(ctx context.Context, rec wire.Deployment, accepted []wire.DeployedRange, opts map[string]monotonic.Options) {
	want := map[string]wire.TagRange{}
	for _, r := range accepted {
		want[r.Tag] = r.TagRange.Normal()
	}
	for tag, o := range opts {
		if o.Err == nil && !o.Range.IsDefault() {
			if _, ok := want[tag]; !ok {
				want[tag] = o.Range.Normal()
			}
		}
	}
	err := deployment.SettleRanges(ctx, d.records, want, d.cfg.NodeID, d.clock.Now())
	if err != nil && !errors.Is(err, deployment.ErrChanged) {
		d.log.Warn("could not write the deployment record's tag ranges back as this dispenser serves them; trying again", "err", err)
	}
}

// livePeers lists the live dispensers of the prefix (deployment.LivePeers). Where this
// dispenser's NATS user may not ask $SRV.INFO, it says so and lists none, as the other
// peer checks do: such a deployment has chosen to go without discovery.
func (d *Dispenser) livePeers(ctx context.Context) ([]deployment.Peer, error) {
	peers, err := deployment.LivePeers(ctx, d.nc, d.cfg.Prefix, "")
	if errors.Is(err, nats.ErrPermissionViolation) {
		d.log.Warn("this dispenser's NATS user may not ask $SRV.INFO which dispensers run: the deployment record's checks of the live fleet are off", "err", err)
		return nil, nil
	}
	return peers, err
}
