package dispenser

import (
	"fmt"

	"github.com/leafbus/leafbus/wire"
	"github.com/leafbus/leafbus/workerid"
)

// Worker-ID ranges (PROTOCOL.md "Worker-ID ranges"): --worker-id-min and --worker-id-max
// restrict the registry, the range is published in $SRV.INFO metadata (worker_id,
// worker_id_min, worker_id_max) and in the snowflake endpoint's $SRV.STATS, and every
// dispenser looks at its peers' metadata through $SRV discovery and warns about a
// misconfiguration it can see (workerid.PeersConfig, run by the worker identity).

// workerRange is --worker-id-min..--worker-id-max.
func (c Config) workerRange() workerid.Range {
	return workerid.Range{Min: c.WorkerIDMin, Max: c.WorkerIDMax}
}

// checkWorkerRange checks --worker-id-min and --worker-id-max against the layout and each
// other, and --worker-id against them.
func (c Config) checkWorkerRange() []error {
	var errs []error
	add := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	maxID := c.Layout().MaxWorkerID()
	if c.WorkerIDMin < 0 || c.WorkerIDMin > maxID {
		add("--worker-id-min %d: want 0 to %d (the layout's highest worker ID)", c.WorkerIDMin, maxID)
	}
	if c.WorkerIDMax < 0 || c.WorkerIDMax > maxID {
		add("--worker-id-max %d: want 0 to %d (the layout's highest worker ID)", c.WorkerIDMax, maxID)
	}
	if c.WorkerIDMin > c.WorkerIDMax {
		add("--worker-id-min %d is above --worker-id-max %d: the range of worker IDs would be empty", c.WorkerIDMin, c.WorkerIDMax)
	}
	if c.WorkerRegistry == "static" && c.WorkerID >= 0 && c.WorkerID <= maxID && !c.workerRange().Contains(c.WorkerID) {
		add("--worker-id %d is outside --worker-id-min %d .. --worker-id-max %d, this deployment's range", c.WorkerID, c.WorkerIDMin, c.WorkerIDMax)
	}
	return errs
}

// rangeStats is the worker ID and range in the snowflake endpoint's $SRV.STATS, with the
// number of peers whose range conflicted with this node's at the last check.
func (d *Dispenser) rangeStats(data map[string]any) map[string]any {
	data[wire.MetaWorkerID] = d.snowflakes.WorkerID()
	data[wire.MetaWorkerIDMin] = d.cfg.WorkerIDMin
	data[wire.MetaWorkerIDMax] = d.cfg.WorkerIDMax
	data["worker_id_conflicts"] = d.heartbeat.PeerConflicts()
	return data
}
