// Package chaos is leafbus's own chaos suite, as tests: real dispenser processes (the
// compiled cmd/dispenser) on a 3-node NATS cluster, MariaDB and ZooKeeper from testenv,
// across every registry (JetStream KV leases on R3 buckets, ZooKeeper in Leaf's layout,
// ZooKeeper recycle, MySQL) with MySQL segments, under a steady load of single IDs and
// batches through the hedging client, while faults come one after another: kill -9 and
// restart, SIGSTOP past the lease and SIGCONT, MariaDB down, a NATS node lost and back,
// ZooKeeper restarted, SIGTERM under load. Every ID is kept and checked for duplicates,
// and the run ends with a report: IDs checked, duplicates, errors by code per fault, the
// longest gap without service per kind, and the time from each fault's end to full
// service (every dispenser answering, issuing snowflake IDs, with all its
// dependencies connected).
//
// A monotonic tag (issue 15, PROTOCOL.md "Monotonic tags") runs alongside, marked
// through the admin API, with a 2 s --monotonic-lease-ttl: many clients spread over
// the NATS nodes, and so over every dispenser, record each request's send and receive
// times on the test process's one monotonic clock, and every reply must lie above
// every reply received before its request was sent, through every fault; IDs twice,
// or an answer other than IDs, 503 or none, fail the run. Faults aim at the tag's
// leader (found through $SRV.STATS): kill -9 and restart as a supervisor would, and
// SIGSTOP past the lease until another dispenser leads, then SIGCONT, after which the
// resumed process may not report itself leader of its old term; for those two the
// longest gap without a monotonic reply must stay within 2 lease TTLs (the contract's
// failover bound). The full run also stops the leader with SIGTERM (a graceful
// handover, held to the same bound). Every fault reports the tag's longest gap.
//
// TestChaosShort (a few faults, the monotonic leader's kill -9 among them, about a
// minute) runs in `make test`; TestChaos, the whole sequence under heavier load, runs
// with `make chaos` (LEAFBUS_CHAOS=full). The package has no non-test code: this file
// only says what it is.
package chaos
