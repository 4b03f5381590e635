package dispenser

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/leafbus/leafbus/internal/datadir"
	"github.com/leafbus/leafbus/segment"
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
	pattern := filepath.Join(globQuote(dir), "jetstream", "*", "streams", "KV_"+prefix+"_segments")
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
