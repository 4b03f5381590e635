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
// TestChaosShort (a few faults, about a minute) runs in `make test`; TestChaos, the
// whole sequence under heavier load, runs with `make chaos` (LEAFBUS_CHAOS=full). The
// package has no non-test code: this file only says what it is.
package chaos
