package dispenser

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"time"

	"github.com/leafbus/leafbus/segment"
)

// MarksFileName is the file in --data-dir that keeps this node's segment high-water
// marks (segment.FileMarks): per tag, the highest max_id it ever took from the store.
const MarksFileName = "segment.marks"

// storeCheckTimeout bounds reading the tag list for the start-up check against the marks.
const storeCheckTimeout = 10 * time.Second

// openMarks opens, or creates, this node's high-water marks in the data dir. Any error
// stops the start: a node that cannot keep its marks could serve a store that went
// backwards, and one whose marks file is damaged could have forgotten what it served.
func (d *Dispenser) openMarks(context.Context) error {
	path := filepath.Join(d.cfg.DataDir, MarksFileName)
	marks, err := segment.OpenFileMarks(path)
	if err != nil {
		return fmt.Errorf("--data-dir: high-water marks: %w", err)
	}
	d.marks = marks
	if n := len(marks.All()); n > 0 {
		d.log.Info("segment high-water marks loaded", "file", path, "tags", n)
	}
	d.freshDataDir = d.newDataDir()
	return nil
}

// checkStoreMarks compares the segment store with the marks before anything is served
// (segment.CheckStoreAgainstMarks): a tag this node served that the store lost, or whose
// max_id is now below its mark, fails the start with ErrStoreWentBack naming each tag.
// That is what a lost or rebuilt KV bucket, or a leaf_alloc restored from a backup, looks
// like, and serving on from it would repeat IDs.
//
// With Config.AllowStoreBehind the start goes on instead, the finding logged as an
// error: the generator still refuses every segment below a mark (those tags answer 503
// with the reason, a lost tag is unknown until it is added again), and the admin API is
// there to repair the store (docs/operations.md "When the store goes backwards").
func (d *Dispenser) checkStoreMarks(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, storeCheckTimeout)
	defer cancel()
	err := segment.CheckStoreAgainstMarks(ctx, d.store, d.marks)
	switch {
	case err == nil:
		return nil
	case !errors.Is(err, segment.ErrStoreWentBack):
		return err
	case d.cfg.AllowStoreBehind:
		d.log.Error("starting with --allow-store-behind: the tags named answer 503 until repaired", "err", err)
		return nil
	}
	return fmt.Errorf("refusing to start: %w. To repair through the admin API, start with --allow-store-behind: those tags answer 503 until repaired, the others serve", err)
}
