package deployment

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/leafbus/leafbus/internal/kvbucket"
	"github.com/leafbus/leafbus/wire"
)

// DefaultWatchEvery is how often a running dispenser reads the record again: a record
// that vanished or was changed to one the running fleet contradicts is written back
// within about this long.
const DefaultWatchEvery = 5 * time.Second

// Watch keeps the record in step with a running dispenser, after Check passed at its
// start. The record follows the fleet: a running dispenser never stops because of what
// the record says (it was checked at its start, and its store, registry and layout have
// not changed since). Every Every it reads the record:
//   - gone (deleted, purged, or the bucket lost): it is written back as this dispenser
//     last read it, with a create, so of several dispensers one writes it and the others
//     check against it;
//   - changed to one this dispenser contradicts (another store, layout or registry for
//     its worker IDs): the change is refused. It is reported (Problem, ERROR once per
//     revision), and the record this dispenser runs under is written back over it with
//     a compare-and-set, unless a live dispenser (Peers) fits the new record and not
//     this one's: then two fleets disagree, and this dispenser does not decide which is
//     wrong; it keeps serving and reports it until an operator stops one;
//   - changed and fits, but without this dispenser's registry for its worker IDs (an
//     operator dropped it): it is added again, as at a start;
//   - unreadable, or the bucket unreachable: logged once per revision or outage, and the
//     dispenser goes on under the record it last read.
//
// Seen, when set, is called with every record read that this dispenser fits, on Run's
// goroutine (the dispenser restores the monotonic marks the record lists from it, and
// checks the record's tag ranges against the tags' own state).
type Watch struct {
	Records *Records
	Own     Own
	Node    string
	Last    Entry // the record as Check left it
	Every   time.Duration
	Now     func() time.Time // nil: time.Now
	Logger  *slog.Logger     // nil: discard
	Seen    func(ctx context.Context, rec wire.Deployment)
	// Peers, when set, lists the live dispensers of the prefix as their $SRV metadata
	// describes them (other than this one); see Watch.
	Peers func(ctx context.Context) ([]Peer, error)

	unreadable uint64 // the revision last logged as unreadable
	refused    uint64 // the revision last logged as refused
	failing    bool   // a read failed, and that was logged

	mu       sync.Mutex
	problem  string // what is wrong with the record now; "" when nothing
	refusals uint64 // records refused or written back
}

// Refusals counts the records this dispenser refused (a change it contradicts, an
// unreadable value) or wrote back (a record gone) since it started.
func (w *Watch) Refusals() uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.refusals
}

func (w *Watch) countRefusal() {
	w.mu.Lock()
	w.refusals++
	w.mu.Unlock()
}

// Problem says what is wrong with the record as this dispenser last read it: "" when it
// fits, else one line (for /readyz, the status page and the metric).
func (w *Watch) Problem() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.problem
}

func (w *Watch) setProblem(p string) {
	w.mu.Lock()
	w.problem = p
	w.mu.Unlock()
}

// Run watches until ctx ends. It returns nil: nothing the record says stops a running
// dispenser.
func (w *Watch) Run(ctx context.Context) error {
	every := w.Every
	if every <= 0 {
		every = DefaultWatchEvery
	}
	if w.Logger == nil {
		w.Logger = slog.New(slog.DiscardHandler)
	}
	if w.Now == nil {
		w.Now = time.Now
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		rctx, cancel := context.WithTimeout(ctx, every)
		w.once(rctx)
		cancel()
	}
}

// once reads the record and acts on it.
func (w *Watch) once(ctx context.Context) {
	e, err := w.Records.Get(ctx)
	if err != nil && !errors.Is(err, ErrNoRecord) && !errors.Is(err, ErrCorrupt) {
		// A deleted bucket answers a read with "no responders" (no stream serves its
		// direct gets) or "stream not found": open it again, which creates it when it
		// is gone and only binds to it when it is there.
		if rerr := w.Records.reopen(ctx); rerr == nil {
			if kvbucket.Gone(err) || errors.Is(err, nats.ErrNoResponders) {
				w.Logger.Warn("the deployment record's bucket was unreachable or gone: opened it again", "bucket", w.Records.Bucket(), "err", err)
			}
			e, err = w.Records.Get(ctx)
		}
	}
	switch {
	case errors.Is(err, ErrNoRecord):
		w.rewrite(ctx)
		return
	case errors.Is(err, ErrCorrupt):
		if e.Revision != w.unreadable {
			w.unreadable = e.Revision
			w.countRefusal()
			w.Logger.Error("the deployment record is unreadable: written back as this dispenser runs under it",
				"bucket", w.Records.Bucket(), "revision", e.Revision, "last_revision", w.Last.Revision, "err", err)
		}
		w.setProblem(fmt.Sprintf("deployment record revision %d unreadable: writing back revision %d's", e.Revision, w.Last.Revision))
		w.writeBack(ctx, w.Last.Record, e.Revision, "the record was unreadable")
		return
	case err != nil:
		if !w.failing {
			w.failing = true
			w.Logger.Warn("cannot read the deployment record; going on under the last one read", "bucket", w.Records.Bucket(), "revision", w.Last.Revision, "err", err)
		}
		return
	}
	if w.failing {
		w.failing = false
		w.Logger.Info("the deployment record is readable again", "bucket", w.Records.Bucket(), "revision", e.Revision)
	}
	if e.Revision != w.Last.Revision && e.Revision != w.refused {
		w.Logger.Info("the deployment record changed", "bucket", w.Records.Bucket(), "revision", e.Revision,
			"written_by", e.Record.WrittenBy, "written_at", e.Record.WrittenAt, "reason", e.Record.Reason)
	}
	diffs, add := Compare(e.Record, w.Own)
	if len(diffs) > 0 {
		w.refuse(ctx, e, diffs)
		return
	}
	w.setProblem("")
	w.Last = e
	if add {
		reason := fmt.Sprintf("worker registry %s for worker IDs %d..%d added again by %s, which serves with it", w.Own.Registry.Identity, w.Own.Registry.WorkerIDMin, w.Own.Registry.WorkerIDMax, w.Node)
		next, err := w.Records.Update(ctx, stamp(withRegistry(e.Record, w.Own.Registry), w.Node, w.Now(), reason), e.Revision)
		if err != nil {
			w.Logger.Warn("could not add this dispenser's worker registry back to the deployment record; trying again", "bucket", w.Records.Bucket(), "err", err)
		} else {
			w.Logger.Warn("this dispenser's worker registry was missing from the deployment record: added again", "registry", w.Own.Registry.Identity, "revision", next.Revision)
			w.Last = next
		}
	}
	if w.Seen != nil {
		w.Seen(ctx, w.Last.Record)
	}
}

// refuse handles a record e that this running dispenser contradicts (diffs): it is
// reported once per revision and, unless a live dispenser fits it, the record this one
// runs under is written back over it.
func (w *Watch) refuse(ctx context.Context, e Entry, diffs []Difference) {
	mismatch := &MismatchError{Bucket: w.Records.Bucket(), Record: e.Record, Differences: diffs}
	var backers []string
	if w.Peers != nil {
		peers, err := w.Peers(ctx)
		if err == nil {
			for _, p := range peers {
				if p.Known() && p.Fits(e.Record) && !p.Fits(w.Last.Record) {
					backers = append(backers, p.NodeID)
				}
			}
		}
	}
	first := e.Revision != w.refused
	w.refused = e.Revision
	if first {
		w.countRefusal()
	}
	if len(backers) > 0 {
		w.setProblem(fmt.Sprintf("deployment record revision %d contradicts this dispenser, and live dispensers %v fit it: two fleets disagree; stop the wrong one", e.Revision, backers))
		if first {
			w.Logger.Error("the deployment record contradicts this running dispenser, and live dispensers fit it: two fleets disagree on what this deployment is. This one keeps serving under the record it started with; stop the wrong fleet",
				"bucket", w.Records.Bucket(), "revision", e.Revision, "fit_it", backers, "err", mismatch)
		}
		return
	}
	w.setProblem(fmt.Sprintf("deployment record revision %d contradicts this running dispenser (%s): refused, writing back revision %d's", e.Revision, diffs[0].What, w.Last.Revision))
	if first {
		w.Logger.Error("the deployment record was changed to one this running dispenser contradicts: the change is refused and the record it runs under written back. To change the deployment, stop its dispensers and run `dispenser deployment set`",
			"bucket", w.Records.Bucket(), "revision", e.Revision, "written_by", e.Record.WrittenBy, "err", mismatch)
	}
	next := e.Record
	next.SegmentStore, next.Snowflake = w.Last.Record.SegmentStore, w.Last.Record.Snowflake
	next.WorkerRegistries = slices.Clone(w.Last.Record.WorkerRegistries)
	next.MonotonicTags = sortedTags(append(slices.Clone(e.Record.MonotonicTags), w.Last.Record.MonotonicTags...))
	for _, r := range w.Last.Record.TagRanges {
		next.TagRanges = withRange(next.TagRanges, r.Tag, r.TagRange)
	}
	w.writeBack(ctx, next, e.Revision, "a change it contradicts was refused")
}

// writeBack writes rec over revision rev, stamped by this dispenser: of several
// dispensers writing back, one wins the compare-and-set and the others check against
// what it wrote at their next read.
func (w *Watch) writeBack(ctx context.Context, rec wire.Deployment, rev uint64, why string) {
	next, err := w.Records.Update(ctx, stamp(rec, w.Node, w.Now(), "written back by "+w.Node+", which serves under it: "+why), rev)
	switch {
	case errors.Is(err, ErrChanged):
		return // another dispenser wrote first: the next read checks it
	case err != nil:
		w.Logger.Warn("could not write the deployment record back; trying again", "bucket", w.Records.Bucket(), "err", err)
		return
	}
	w.Logger.Warn("the deployment record was written back", "bucket", w.Records.Bucket(), "revision", next.Revision, "over", rev)
	w.Last = next
	w.setProblem("")
}

// rewrite writes the last record read again, after the record was deleted.
func (w *Watch) rewrite(ctx context.Context) {
	rec := stamp(w.Last.Record, w.Node, w.Now(), "written back by "+w.Node+", which serves under it: the record was gone")
	e, err := w.Records.Create(ctx, rec)
	switch {
	case errors.Is(err, jetstream.ErrKeyExists):
		return // another dispenser wrote it again first: the next read checks it
	case err != nil:
		if !w.failing {
			w.failing = true
			w.Logger.Warn("the deployment record is gone and could not be written again; trying again", "bucket", w.Records.Bucket(), "err", err)
		}
		w.setProblem("deployment record gone, and not written back yet: " + err.Error())
		return
	}
	w.countRefusal()
	w.Logger.Error("the deployment record was gone (deleted or purged): written back as this dispenser runs under it", "bucket", w.Records.Bucket(), "revision", e.Revision)
	w.Last = e
	w.setProblem("")
}
