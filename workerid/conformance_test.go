package workerid

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/leafbus/leafbus/internal/testutil"
	"github.com/leafbus/leafbus/testenv"
)

// registryBackend is one kind of Registry under TestRegistryConformance.
type registryBackend struct {
	name string
	// world makes data of its own (a fresh bucket, path, database) for worker IDs 0..max
	// and returns how node opens a registry over it; close ends that registry, as the
	// node's process stopping would.
	world func(t *testing.T, max int64) (open func(node string) (r Registry, close func()))
	// static hands out the one configured ID to every node and records nothing (the
	// forever bucket and the cache file keep its timestamps); expiring leases are given
	// back by Release, and come back to any node; the others keep a node's ID for good.
	static, expiring bool
	// first is the lowest worker ID it hands out: 1 for MySQL, whose AUTO_INCREMENT
	// never gives 0, else 0.
	first int64
}

// advertiseOf is the ip:port a node of the conformance suite registers under (the ZooKeeper
// and MySQL registries know a node by it).
func advertiseOf(node string) string {
	var n int
	fmt.Sscanf(node, "n%d", &n)
	return fmt.Sprintf("10.0.0.%d:8080", n+1)
}

// registryBackends is every Registry of the project, each against its real server, with
// the in-memory one as the reference.
func registryBackends() []registryBackend {
	return []registryBackend{
		{name: "inmem", world: func(t *testing.T, max int64) func(string) (Registry, func()) {
			w := NewInmemWorkers(max)
			return func(node string) (Registry, func()) { return w.Registry(node), func() {} }
		}},
		{name: "static", static: true, world: func(t *testing.T, max int64) func(string) (Registry, func()) {
			return func(string) (Registry, func()) {
				r, err := NewStaticRegistry(max, max)
				must(t, "NewStaticRegistry", err)
				return r, func() {}
			}
		}},
		{name: "kv", expiring: true, world: func(t *testing.T, max int64) func(string) (Registry, func()) {
			env := startJS(t)
			return func(node string) (Registry, func()) {
				return openKVRegistry(t, env.js, kvConfig(node, kvMaxWorkerID(max))), func() {}
			}
		}},
		{name: "zk", world: func(t *testing.T, max int64) func(string) (Registry, func()) {
			srv := testenv.ZooKeeper(t)
			name := zkTestName(t, srv, srv.Connect(t))
			return func(node string) (Registry, func()) {
				r := openZK(t, zkConfig(srv.Servers(), name, advertiseOf(node), zkMaxWorkerID(max)))
				return r, r.Close
			}
		}},
		{name: "zk-recycle", expiring: true, world: func(t *testing.T, max int64) func(string) (Registry, func()) {
			srv := testenv.ZooKeeper(t)
			name := zkTestName(t, srv, srv.Connect(t))
			return func(node string) (Registry, func()) {
				r := openZK(t, zkConfig(srv.Servers(), name, advertiseOf(node), zkRecycle(8*time.Second), zkMaxWorkerID(max)))
				return r, r.Close
			}
		}},
		{name: "mysql", first: 1, world: func(t *testing.T, max int64) func(string) (Registry, func()) {
			dsn := testenv.MariaDB(t).NewDatabase(t)
			return func(node string) (Registry, func()) {
				r := openMySQLRegistry(t, dsn, advertiseOf(node), max)
				return r, r.Close
			}
		}},
	}
}

// TestRegistryConformance holds every registry to what Registry and Lease promise, with
// one suite over all of them (as segment's testStore does for the stores), so that none
// drifts from the contract the heartbeat, the guard and the keeper rely on.
func TestRegistryConformance(t *testing.T) {
	for _, b := range registryBackends() {
		t.Run(b.name, func(t *testing.T) {
			testRegistry(t, b)
		})
	}
}

func testRegistry(t *testing.T, b registryBackend) {
	acquire := func(t *testing.T, r Registry) Lease {
		t.Helper()
		l, err := r.Acquire(testutil.Context(t, 15*time.Second))
		if err != nil {
			t.Fatalf("Acquire: %v", err)
		}
		return l
	}
	now := time.Now().UnixMilli()

	t.Run("Acquire/InRange", func(t *testing.T) {
		open := b.world(t, 3)
		a, _ := open("n0")
		l := acquire(t, a)
		if id := l.WorkerID(); id < 0 || id > 3 {
			t.Fatalf("WorkerID() = %d, want 0..3", id)
		}
		other, _ := open("n1")
		ia, ok1 := a.(Identifier)
		io, ok2 := other.(Identifier)
		if !ok1 || !ok2 || ia.Identity() == "" || ia.Identity() != io.Identity() {
			t.Fatalf("two registries over the same data: Identifier %v %v, identities %q and %q; want one, not empty", ok1, ok2, identity(a), identity(other))
		}
	})

	t.Run("Acquire/Distinct", func(t *testing.T) {
		if b.static {
			t.Skip("static: the operator keeps nodes apart")
		}
		open := b.world(t, 5)
		seen := map[int64]string{}
		for i := range 3 {
			node := fmt.Sprintf("n%d", i)
			r, _ := open(node)
			id := acquire(t, r).WorkerID()
			if other, dup := seen[id]; dup {
				t.Fatalf("nodes %s and %s both hold worker ID %d", other, node, id)
			}
			seen[id] = node
		}
	})

	t.Run("Acquire/ErrNoWorkerID", func(t *testing.T) {
		if b.static {
			t.Skip("static: one configured ID")
		}
		open := b.world(t, b.first+1)
		for i := range 2 {
			r, _ := open(fmt.Sprintf("n%d", i))
			acquire(t, r)
		}
		r, _ := open("n2")
		if _, err := r.Acquire(testutil.Context(t, 15*time.Second)); !errors.Is(err, ErrNoWorkerID) {
			t.Fatalf("Acquire with worker IDs %d..%d held = %v, want ErrNoWorkerID", b.first, b.first+1, err)
		}
	})

	t.Run("Recorded/NeverGoesDown", func(t *testing.T) {
		if b.static {
			t.Skip("static: records nothing (its node's forever record and cache file do)")
		}
		open := b.world(t, b.first) // one worker ID
		r, closeR := open("n0")
		l := acquire(t, r)
		ctx := testutil.Context(t, 10*time.Second)
		must(t, "Renew", l.Renew(ctx, now+1000))
		must(t, "Renew higher", l.Renew(ctx, now+2000))
		must(t, "Release lower", l.Release(ctx, now+10)) // a record never goes down
		closeR()
		next := "n0" // a restart of the same node
		if b.expiring {
			next = "n1" // or anyone, once given back
		}
		again, _ := open(next)
		l2 := acquire(t, again)
		if l2.WorkerID() != l.WorkerID() {
			t.Fatalf("%s got worker ID %d after %d was released; want it back", next, l2.WorkerID(), l.WorkerID())
		}
		if got := l2.Recorded(); got < now+2000 {
			t.Fatalf("Recorded() = %d after Renew(%d): the record went down", got, now+2000)
		}
	})

	t.Run("Acquire/SameNodeSameID", func(t *testing.T) {
		if b.expiring {
			t.Skip("expiring leases: a node gets whichever ID is free")
		}
		open := b.world(t, 3)
		r, closeR := open("n0")
		first := acquire(t, r).WorkerID()
		closeR()
		again, _ := open("n0")
		if id := acquire(t, again).WorkerID(); id != first {
			t.Fatalf("restarted node got worker ID %d, want its own %d", id, first)
		}
	})

	t.Run("Lease/TTL", func(t *testing.T) {
		open := b.world(t, b.first)
		r, _ := open("n0")
		l := acquire(t, r)
		if got := l.TTL(); b.expiring != (got > 0) {
			t.Fatalf("TTL() = %v; want > 0 exactly for expiring leases (%v)", got, b.expiring)
		}
	})
}

func identity(r Registry) string {
	if i, ok := r.(Identifier); ok {
		return i.Identity()
	}
	return "(none)"
}
