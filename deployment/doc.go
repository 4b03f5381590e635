// Package deployment keeps the deployment record (wire.Deployment): what one
// deployment, one prefix on one NATS, is. Its segment store, its worker registries and
// the worker IDs each hands out, its snowflake layout and epoch, its monotonic tags.
//
// The first dispenser of a deployment writes the record (Check, with a KV create, so
// that of two first starts one writes and the other checks); every later one compares
// its own configuration with it (Compare, a pure function) and refuses to start when
// it does not fit, naming each difference and the flags that would make it fit. A
// running dispenser reads the record again every few seconds (Watch) and stops once it
// no longer fits. Changing the record is an operator's step (`dispenser deployment
// set`, a compare-and-set on its revision), never a side effect of a start: the one
// thing a start may add is a worker registry for worker IDs no registry of the record
// hands out, which changes nothing that is there.
//
// It is the fleet's counterpart of the segment high-water marks: the marks keep one
// dispenser from serving a store that went backwards, the record keeps a dispenser from
// joining a deployment it does not belong to (ARCHITECTURE.md, invariant 6), such as a
// node started with default flags on the NATS of a MySQL deployment, which would serve
// the same tag from a KV bucket of its own.
package deployment
