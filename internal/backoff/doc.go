// Package backoff is the one retry policy of leafbus: every loop that waits after a
// failure (a segment load, a KV compare-and-set, a pool fill or publish, a client
// buffer's fetch, a NATS reconnect) waits as a [Policy] says, so their waits are tuned
// and tested in one place instead of six copies of the same three constants.
//
// A Policy is exponential back-off with a floor, a cap and jitter, as gRPC's connection
// back-off and AWS's "Exponential Backoff And Jitter" describe it, reduced to what the
// loops here need: the wait doubles from Min up to Max, and a random share of each wait
// is taken off so that dispensers (or tags) that failed together retry apart. A
// [Backoff] is one loop's position in that sequence; [Backoff.Reset] after a success
// starts it again from Min. [Sleep] is the context-aware wait the loops share.
//
// Standard library only, so that package client keeps depending on nats.go and wire
// alone.
package backoff
