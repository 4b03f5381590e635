// Package deployment keeps the deployment record (wire.Deployment): what one
// deployment, one prefix on one NATS, is. Its segment store, its worker registries and
// the worker IDs each hands out, its snowflake layout and epoch, its monotonic tags.
//
// The record follows the fleet, not the other way round. The first dispenser of a
// deployment writes it (CheckLive, with a KV create, so that of two first starts one
// writes and the other checks), but only where no live dispenser of the prefix answers
// $SRV.INFO (LivePeers; each dispenser publishes what it is, Own.Meta, under
// wire.MetaDeployment): a start that finds the record gone beside a live fleet waits
// for the fleet to write it back (ErrFleetLive) and checks itself against that. Every
// later start compares its own configuration with it (Compare, a pure function) and
// refuses to start when it does not fit, naming each difference and the flags that
// would make it fit. A running dispenser never stops because of the record: it reads it
// every few seconds (Watch), writes it back when it is gone or unreadable, and refuses a
// change it contradicts (reported once per revision, and the record it runs under
// written back with a compare-and-set) unless a live dispenser fits the change, which
// means two fleets disagree and an operator must stop one. Changing the record is an
// operator's step (`dispenser deployment set`, a compare-and-set on its revision,
// refused while live dispensers contradict the new record: Contradicting), never a side
// effect of a start: the one thing a start may add is a worker registry for worker IDs
// no registry of the record hands out, which changes nothing that is there. Tag ranges
// come through the admin calls (SetRange); the dispenser applies a recorded range only
// where the tag's own state bears it out, and writes the record back as it serves
// (SettleRanges).
//
// It is the fleet's counterpart of the segment high-water marks: the marks keep one
// dispenser from serving a store that went backwards, the record keeps a dispenser from
// joining a deployment it does not belong to (ARCHITECTURE.md, invariant 6), such as a
// node started with default flags on the NATS of a MySQL deployment, which would serve
// the same tag from a KV bucket of its own.
package deployment
