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
//     and a recycled ID starts past its previous holder's record.
//
// The pieces: Registry/Lease (registry.go) with the static and JetStream KV
// implementations, Forever (the <prefix>_forever bucket), CacheFile, Guard (start-up),
// Heartbeat (runtime) and TimeResponder (answers <prefix>.time for other nodes' peer
// checks).
package workerid
