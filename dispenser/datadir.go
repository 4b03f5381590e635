package dispenser

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/leafbus/leafbus/internal/datadir"
	"github.com/leafbus/leafbus/segment"
	"github.com/leafbus/leafbus/wire"
	"github.com/leafbus/leafbus/workerid"
)

// lockDataDir is the first step of New, in every mode: the data dir holds the embedded
// JetStream store, the segment high-water marks and the worker-ID cache file, and two
// dispensers sharing them hand out the same IDs (issue 16). It takes the dir's lock
// (internal/datadir), which a second dispenser on the same dir is refused at once,
// naming this one; the kernel drops the lock when the process ends, however it ends,
// so a kill -9 never blocks the restart. The lock is the first thing registered with
// onClose, so Close releases it last, once nothing uses the dir any more.
//
// Before the embedded server opens the dir, it also notes whether the dir already held
// a segment store (segmentStoreOnDisk), half of the sample tag's rule (openMarks).
func (d *Dispenser) lockDataDir(context.Context) error {
	lock, err := datadir.Acquire(d.cfg.DataDir, d.cfg.NodeID)
	if err != nil {
		return fmt.Errorf("--data-dir: %w", err)
	}
	d.dirLock = lock
	d.onClose("data dir lock", lock.Release)
	d.storeOnDisk, err = segmentStoreOnDisk(d.cfg.DataDir, d.cfg.Prefix)
	return err
}

// segmentStoreOnDisk reports whether dir holds the embedded server's stream of the
// segments bucket (<prefix>_segments), in any account.
func segmentStoreOnDisk(dir, prefix string) (bool, error) {
	pattern := filepath.Join(globQuote(dir), "jetstream", "*", "streams", wire.KVStream(wire.Subjects{Prefix: prefix}.Bucket(wire.BucketSegments)))
	found, err := filepath.Glob(pattern)
	if err != nil {
		return false, fmt.Errorf("--data-dir %s: look for a segment store: %w", dir, err)
	}
	return len(found) > 0, nil
}

// globQuote quotes the pattern characters of a path for filepath.Glob.
func globQuote(path string) string {
	var b strings.Builder
	for _, r := range path {
		if strings.ContainsRune(`*?[\`, r) {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	return b.String()
}

// newDataDir is the sample tag's rule (Config.SampleTag): the tag is created only in a
// data dir never used for segments, one whose marks file records no tag (this node
// never served a segment ID from it: a mark is written before any ID of a segment is
// served) and that held no embedded segment store before this start. A dir that ever
// served the sample tag is never new again, whatever was lost from it since, so a lost
// store does not restart the tag at 1. A start that failed before serving (a port
// taken) leaves the dir new.
func (d *Dispenser) newDataDir() bool {
	return !d.storeOnDisk && len(d.marks.All()) == 0
}

// noSampleTag is the sample tag's rule in a data dir that was used before: it is never
// created there, since a store that no longer has it lost it (a deleted or corrupted
// JetStream dir), and creating it again would start it at 1 under IDs already handed
// out. Only a missing tag is logged; the marks check names it if this node served it.
func (d *Dispenser) noSampleTag(ctx context.Context) {
	if _, err := d.store.Tag(ctx, SampleTagName); errors.Is(err, segment.ErrTagNotFound) {
		d.log.Warn("the sample tag is not in the segment store, and is created only in a data dir never used for segments (this one may have lost it): add it with `dispenser tag add` if it is wanted",
			"tag", SampleTagName, "data_dir", d.cfg.DataDir)
	}
}

// ErrDataDirRestored is returned by New when the data dir is older than what the
// deployment's KV knows of this node: the clock record this node writes to
// <prefix>_forever every second is ahead of the one it writes, with it, to the cache
// file in the data dir. The dir was put back from a copy (or copied from another host),
// so its high-water marks lack what this node served since the copy, and a segment
// store restored with it would serve those IDs again. `dispenser fence` makes it safe.
var ErrDataDirRestored = errors.New("the data dir is older than this node's clock record")

// Restored data dirs (docs/operations.md "When the store goes backwards").
const (
	// restoreSlack is how far the KV clock record may be ahead of the cache file before
	// the dir counts as restored: both are written in the same beat, once a second, so
	// only a copy (or cache writes failing for seconds) leaves them further apart.
	restoreSlack = 10 * time.Second
	// restoreWarnAge: a data dir whose last record is older than this is logged as
	// possibly restored, naming `dispenser fence`. Nothing else can tell an old copy put
	// back together with an embedded store from a dispenser that was stopped that long.
	restoreWarnAge = time.Hour
)

// checkRestore is the step "restore check": what a data dir put back from a copy looks
// like, as far as it can be seen. The data dir's last record is the cache file's (the
// heartbeat rewrites it every second), or the last fence when that came later.
//   - With --nats the clock records live outside the data dir: this node's record in
//     <prefix>_forever ahead of the cache file (by over restoreSlack) means the dir is
//     older than the node, and the start is refused (ErrDataDirRestored) until the dir
//     is fenced.
//   - A last record over restoreWarnAge old is logged as a warning that names the
//     command: an embedded store and its marks restored together agree with each
//     other, and nothing in the dir says they are old but their age.
func (d *Dispenser) checkRestore(ctx context.Context) error {
	var fence segment.Fence
	if f, ok := d.marks.(interface{ Fence() segment.Fence }); ok {
		fence = f.Fence()
	}
	cache := d.cfg.cacheFile()
	entry, err := cache.Load()
	if err != nil {
		return nil // none (no snowflake ID was issued from this dir), or unreadable: the clock check says so
	}
	dirLast := max(entry.Timestamp, fence.At)
	fenceCmd := fmt.Sprintf("`dispenser fence --data-dir %s` with this dispenser's flags", d.cfg.DataDir)
	if d.cfg.NATS != "" {
		forever, err := workerid.OpenForever(ctx, d.js, workerid.ForeverBucket(d.cfg.Prefix), d.cfg.KVReplicas)
		if err != nil {
			return err
		}
		rec, err := forever.Get(ctx, d.cfg.NodeID)
		switch {
		case errors.Is(err, workerid.ErrNoRecord):
		case err != nil:
			return err
		case rec.Timestamp > dirLast+restoreSlack.Milliseconds():
			ahead := time.Duration(rec.Timestamp-dirLast) * time.Millisecond
			return fmt.Errorf("refusing to start: %w: cache file %s is %v behind node %s's clock record in KV %s (%s, %s): run %s, then start (docs/errors.md#data-dir-restored)",
				ErrDataDirRestored, cache.Path, ahead.Round(time.Second), d.cfg.NodeID, forever.Bucket(), fmtMs(entry.Timestamp), fmtMs(rec.Timestamp), fenceCmd)
		}
	}
	if age := d.clock.Now().Sub(time.UnixMilli(dirLast)); age > restoreWarnAge {
		d.log.Warn("the data dir's last record is old: if it was restored from a backup, IDs served after that backup may be served again; stop and run "+fenceCmd+" before serving",
			"data_dir", d.cfg.DataDir, "last_record", fmtMs(dirLast), "age", age.Round(time.Second))
	}
	return nil
}

// fmtMs shows Unix ms as RFC 3339 UTC with milliseconds.
func fmtMs(ms int64) string { return time.UnixMilli(ms).UTC().Format("2006-01-02T15:04:05.000Z") }
