// Package dispenser is the dispenser as a library: it builds, runs and closes one leafbus
// dispenser from a Config.
//
// New builds every part in order (NATS, embedded or not; the segment store and
// generator; the worker-ID registry and this node's worker identity, workerid.Keeper,
// which acquires the worker ID and checks the clock for it; the snowflake generator, on
// which the Keeper starts its heartbeat; the time responder; the pools; the metrics, the
// micro service and the HTTP face), Run runs them as one oklog/run group, and Close undoes what New built,
// in one place. A start that fails at any step is undone by that same Close before New
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
