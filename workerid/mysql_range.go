package workerid

import (
	"context"
	"fmt"
)

// Worker-ID ranges with the MySQL registry. The worker ID is the row's AUTO_INCREMENT id
// and nothing else (mysql_registry.go says why), so a datacenter whose range starts above
// 0 keeps its own leaf_workerid_alloc whose counter starts at the range's start:
// --mysql-create-table creates a missing table that way, and an existing one is moved
// there once with ALTER TABLE ... AUTO_INCREMENT. A row whose id lies outside the range
// is refused: one inserted just now below the range is removed again (nothing used its
// ID), one above it is kept as before (the range is used up: an operator gives it a free
// id by hand), and an older one below it is kept and refused (its node used that ID,
// which may be another datacenter's).

// schema is the CREATE TABLE of --mysql-create-table: MySQLRegistrySchema, counting from
// MinWorkerID when the range starts above 0.
func (r *MySQLRegistry) schema() string {
	if r.cfg.MinWorkerID == 0 {
		return MySQLRegistrySchema
	}
	return fmt.Sprintf("%s AUTO_INCREMENT=%d", MySQLRegistrySchema, r.cfg.MinWorkerID)
}

// checkRow refuses a row whose id lies outside the range; inserted says Acquire inserted
// it just now.
func (r *MySQLRegistry) checkRow(ctx context.Context, id int64, inserted bool) error {
	rng := r.cfg.workerRange()
	switch {
	case rng.Contains(id):
		return nil
	case id > rng.Max:
		// The row stays: the next start finds it and says the same, no further
		// auto-increment value is burnt, and an operator can give it a free id by hand.
		return fmt.Errorf("%w: %w: worker ID %d for %s in leaf_workerid_alloc is above %d, the top of %s: set the row's id to a free one in range (docs/errors.md#mysql-worker-range)",
			ErrNoWorkerID, ErrWorkerIDOutOfRange, id, r.cfg.Advertise, rng.Max, rng.describe())
	case inserted:
		removed := "the row was removed again (nothing used its ID)"
		if _, err := r.db.ExecContext(context.WithoutCancel(ctx),
			"DELETE FROM leaf_workerid_alloc WHERE id = ? AND ip_port = ?", id, r.cfg.Advertise); err != nil {
			removed = fmt.Sprintf("removing the row again failed (%v): delete it by hand, nothing used its ID", err)
		}
		return fmt.Errorf("%w: leaf_workerid_alloc gave %s worker ID %d, below %s (%s): start the table's AUTO_INCREMENT at %d (docs/errors.md#mysql-worker-range)",
			ErrWorkerIDOutOfRange, r.cfg.Advertise, id, rng.describe(), removed, rng.Min)
	}
	return fmt.Errorf("%w: the row of %s in leaf_workerid_alloc holds worker ID %d, below %s: run the node with its range, or delete its row (docs/errors.md#mysql-worker-range)",
		ErrWorkerIDOutOfRange, r.cfg.Advertise, id, rng.describe())
}
