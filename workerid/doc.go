// Package workerid answers two questions for a snowflake dispenser: "who is this node"
// (its worker ID, from a Registry) and "may this node issue timestamps now" (the clock
// guard).
//
// It follows Leaf-snowflake's design (ZooKeeper worker IDs, a forever record rewritten
// every 3 s, a local cache file, a start-up check against the record, a peer time check
// for a node's first start) and closes the holes found in Leaf:
//
//   - the record is the highest timestamp issued (borrowed ones included), not the clock,
//     and the generator is never allowed past what a restart would wait out (the
//     ceiling: record + heartbeat interval + borrow limit);
//   - start-up waits past that same bound instead of only comparing with the clock, so a
//     crash followed by a small clock step back never repeats a timestamp;
//   - the start-up check still refuses when the record comes from the cache file because
//     the KV bucket (Leaf: ZooKeeper) is unreachable; Leaf swallows it there;
//   - an expiring lease suspends the generator before anyone else can be given the ID,
//     and a recycled ID starts past its previous holder's record;
//   - a lease that changes under its holder (its KV key or ZooKeeper node deleted or
//     rewritten by someone else) stops the holder within milliseconds, through a watch
//     on it, not at the next renewal; while the watch cannot see the lease, the holder
//     does not issue;
//   - whatever the registry, one worker ID has one live holder: the worker ID's record
//     in the forever bucket is a fence written with compare-and-set (fence.go), so two
//     dispensers given one worker ID by two registries never both serve with it;
//   - a claimer starts above the highest ceiling any record of the worker ID holds (its
//     worker record, which keeps its ceiling when released, and every node's record
//     naming it), so one forged write cannot lower its floor; a holder takes back at once
//     a write under it that names no live holder, rather than stopping;
//   - the ceiling leads the records by CeilingLead (4 s), so a KV stream electing a
//     leader does not stop issuing;
//   - a worker ID is trusted only by the registry that issued it (Identifier): the
//     cache file says which one did.
//
// The pieces: Registry/Lease/leaseWatcher (registry.go) with the static, JetStream KV,
// ZooKeeper and MySQL implementations, Forever (the <prefix>_forever bucket),
// CacheFile, Guard (start-up), Heartbeat (runtime: records, ceiling, suspension, the
// lease watch) and TimeResponder (answers <prefix>.time for other nodes' peer checks).
// Keeper puts them together as this node's worker identity, one actor with a Run in the
// manner of oklog/run: it acquires the worker ID, checks the clock for it, starts its
// heartbeat on the generator, takes a new worker ID when this one is lost (rebinding the
// same generator), and checks its peers' worker-ID ranges (peer_ranges.go).
// Every configuration comes from its DefaultXConfig and is checked by its Validate.
package workerid
