package deployment

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/leafbus/leafbus/internal/kvbucket"
	"github.com/leafbus/leafbus/wire"
)

// DefaultWatchEvery is how often a running dispenser reads the record again: a record
// changed by `dispenser deployment set` stops the dispensers that no longer fit it
// within about this long.
const DefaultWatchEvery = 5 * time.Second

// Watch keeps a running dispenser checked against the record, after Check passed at
// its start. Every Every it reads the record:
//   - changed, and this dispenser no longer fits it: Run returns the *MismatchError
//     (ErrMismatch), and the dispenser stops serving;
//   - changed and fits, but without this dispenser's registry for its worker IDs (an
//     operator dropped it): it is added again, as at a start;
//   - gone (deleted, or the bucket lost): it is written again as last read, so the
//     dispensers that start next are still checked;
//   - unreadable, or the bucket unreachable: logged once per revision or outage, and the
//     dispenser goes on under the record it last read.
//
// Seen, when set, is called with every record read that this dispenser fits, on Run's
// goroutine (the dispenser restores the monotonic marks the record lists from it).
type Watch struct {
	Records *Records
	Own     Own
	Node    string
	Last    Entry // the record as Check left it
	Every   time.Duration
	Now     func() time.Time // nil: time.Now
	Logger  *slog.Logger     // nil: discard
	Seen    func(ctx context.Context, rec wire.Deployment)

	unreadable uint64 // the revision last logged as unreadable
	failing    bool   // a read failed, and that was logged
}

// Run watches until ctx ends (returning nil) or this dispenser no longer fits the
// record (returning the *MismatchError).
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
		err := w.once(rctx)
		cancel()
		if errors.Is(err, ErrMismatch) {
			return err
		}
	}
}

// once reads the record and acts on it; it returns a *MismatchError only.
func (w *Watch) once(ctx context.Context) error {
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
		return nil
	case errors.Is(err, ErrCorrupt):
		if e.Revision != w.unreadable {
			w.unreadable = e.Revision
			w.Logger.Error("the deployment record is unreadable: dispensers that start now refuse to; this one goes on under the last record it read. Write a good one with `dispenser deployment set`",
				"bucket", w.Records.Bucket(), "last_revision", w.Last.Revision, "err", err)
		}
		return nil
	case err != nil:
		if !w.failing {
			w.failing = true
			w.Logger.Warn("cannot read the deployment record; going on under the last one read", "bucket", w.Records.Bucket(), "revision", w.Last.Revision, "err", err)
		}
		return nil
	}
	if w.failing {
		w.failing = false
		w.Logger.Info("the deployment record is readable again", "bucket", w.Records.Bucket(), "revision", e.Revision)
	}
	if e.Revision != w.Last.Revision {
		w.Logger.Info("the deployment record changed", "bucket", w.Records.Bucket(), "revision", e.Revision,
			"written_by", e.Record.WrittenBy, "written_at", e.Record.WrittenAt, "reason", e.Record.Reason)
	}
	diffs, add := Compare(e.Record, w.Own)
	if len(diffs) > 0 {
		w.Logger.Error("this dispenser no longer fits the deployment record: it stops serving", "bucket", w.Records.Bucket(), "revision", e.Revision)
		return fmt.Errorf("the deployment record changed (revision %d): %w", e.Revision, &MismatchError{Bucket: w.Records.Bucket(), Record: e.Record, Differences: diffs})
	}
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
	return nil
}

// rewrite writes the last record read again, after the record was deleted.
func (w *Watch) rewrite(ctx context.Context) {
	rec := stamp(w.Last.Record, w.Node, w.Now(), "written again by "+w.Node+": the record was gone")
	e, err := w.Records.Create(ctx, rec)
	switch {
	case errors.Is(err, jetstream.ErrKeyExists):
		return // another dispenser wrote it again first: the next read checks it
	case err != nil:
		if !w.failing {
			w.failing = true
			w.Logger.Warn("the deployment record is gone and could not be written again; trying again", "bucket", w.Records.Bucket(), "err", err)
		}
		return
	}
	w.Logger.Error("the deployment record was gone (deleted?): written again as this dispenser last read it", "bucket", w.Records.Bucket(), "revision", e.Revision)
	w.Last = e
}
