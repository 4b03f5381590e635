// Package monotonic serves the segment tags marked monotonic (PROTOCOL.md "Monotonic
// tags") with the stronger promise: across all dispensers and across replies, every ID
// in a reply is greater than every ID of that tag in any reply received before the
// request was sent. It is Leaf's segment mode with one server per tag, the way a
// primary serves a key in a lease-based store (Chubby, etcd's lessor), built on
// JetStream KV and core NATS.
//
// The mark is the key of the tag in the KV bucket <prefix>_tagopts, so Leaf's
// leaf_alloc is not changed and the KV and MySQL stores work alike. Every dispenser
// watches it; until it has loaded it, segment requests are answered 503.
//
// # Leases
//
// One dispenser at a time leads a marked tag, under a lease: the key of the tag in
// <prefix>_leaders. The record names the leader and an inbox subject of its own where
// followers forward requests. Every write of the key but the very first is a
// compare-and-set on the revision the writer saw, so a write succeeds only if nobody
// wrote the key since: the leader renews every RenewInterval over the revision it
// wrote last, and a renewal that finds another revision means the lease is lost. The
// bucket keeps a record for twice the lease TTL after its last write; expiry only
// collects what nobody took, and safety does not depend on it.
//
// # Fencing, by time
//
// A leader serves only while its clock is within half a TTL of the send of its last
// renewal that succeeded; it checks that for every request, after the request
// arrived. The others take the lease over:
//
//   - from a record they have seen unchanged for a whole TTL on their own clock, by a
//     compare-and-set on its revision: its leader sent its last successful renewal
//     before it could be seen, and stopped serving half a TTL later, so half a TTL
//     before the takeover at least; the compare-and-set proves no renewal came since;
//   - from a released record (its leader stopped serving, then wrote it), at once;
//   - from a record of their own (nobody wrote the key since), at once;
//   - from no record at all (it expired, was deleted, or never was), by a create-only
//     write, and then serve no earlier than half a TTL after the write returned: the
//     previous leader's last successful renewal was stored before that write, so it was
//     sent before the write returned.
//
// So two leaders never serve at once, whatever the NATS servers' clocks do, as long as
// the dispensers' clocks measure half a TTL alike (they run on Go's monotonic clock).
//
// A request that passed the check was sent before any later leader served, so the IDs
// it takes may leave after that: the promise only concerns replies received before a
// request was sent.
//
// # One sequence per term
//
// Each lease a leader takes (a term) serves from a sequence of its own, filled with
// fresh segments straight from the store (segment.Generator.TakeSegment, which checks
// the high-water marks): never a buffer held before. The sequence holds the current
// segment and one fetched ahead, always above it, and hands IDs out strictly in order
// under one lock. A term takes its first segment only once it may serve (after the
// previous leader stopped, by the rules above), and a segment joins a term only if the
// store call returned while the lease was valid: so every segment of an earlier term
// was granted before any segment of a later one, and every ID of a later term is above
// every ID of an earlier one.
//
// # Forwarding
//
// A request that reaches a dispenser that does not lead the tag is forwarded to the
// leader's inbox (a core NATS request on the dispenser's JetStream connection, so only
// inbox subjects are used) and the answer relayed, within ForwardTimeout. Requests that
// arrive while earlier ones are under way travel together in the next forwarded
// message. A forwarded request was sent after the client's request, so the leader's
// check covers it. When no leader is known, or it does not answer, the answer is 503.
//
// # Faults
//
//   - Leader killed: a follower that saw no renewal for a TTL takes the lease over and
//     serves at once, so the tag answers 503 for about one TTL.
//   - Leader paused (GC, SIGSTOP, VM pause) past half a TTL: on resume its clock says
//     its term is over; it serves nothing from it, and takes the lease again only by a
//     new write (with a fresh segment), if nobody took it meanwhile.
//   - NATS unreachable from the leader: renewals fail, it stops at half a TTL; the
//     others take over as after a kill.
//   - NATS node restart: connections move to another node; a leader that could not
//     renew for half a TTL stops and takes the lease again when it can.
//   - Store unreachable: the leader serves what it holds, then answers 503.
//   - Graceful stop: the leader stops serving, then writes a released record; a
//     follower takes over at once.
//
// The promise starts once every dispenser has seen a tag's mark: their watches see it
// within milliseconds, and a dispenser that sees a tag marked while it runs serves it
// as a leader no earlier than half a TTL later, which covers a watch that lags. With a
// MySQL store (Config.FoldCase), a tag whose name differs only in case from a marked one
// is refused (400), since MySQL keeps both as one row; the KV store keeps them apart,
// and there both are served. Pools never serve a monotonic tag (OrdinaryOnly), and the
// JetStream pool stream purges the batches it stored for a tag before it was marked
// (pools.StreamConfig.Excluded is IsMonotonic).
package monotonic
