// Package dispenser is the dispenser as a library: it builds, runs and closes one leafbus
// dispenser from a Config.
//
// New builds every part in the order of its steps (build.go: steps, each a stepName
// that the start's waits and hints and the admin commands name too): the data dir, NATS
// (embedded or not), the segment marks and store, the worker-ID registry, the
// deployment record, the segment generator, this node's worker ID and clock check, the
// snowflake generator and its heartbeat, the monotonic tags, the pools, the core, the
// metrics, the micro service and the HTTP face. Run runs them as one oklog/run group,
// and Close undoes what New built, in one place. A start that fails at any step is undone by that same Close before New
// returns, so a worker ID acquired on the way is given back at once rather than held
// until a lease expires.
//
//	d, err := dispenser.New(ctx, cfg, dispenser.WithLogger(logger))
//	if err != nil {
//		return err
//	}
//	defer d.Close()
//	return d.Run(ctx)
//
// It is what cmd/dispenser runs after parsing flags, what `bench --embedded` runs inside
// the load generator, and what end-to-end tests start on random ports; like WTF Dial's
// Main, minus the flags. The in-process NATS server of the one-binary default is
// package bus's (StartEmbedded), with the NATS service.
package dispenser
