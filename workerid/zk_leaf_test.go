package workerid

import (
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/leafbus/leafbus/internal/testutil"
	"github.com/leafbus/leafbus/testenv"
)

func TestZKRegistryLeafLayout(t *testing.T) {
	t.Parallel()
	srv := testenv.ZooKeeper(t)
	conn := srv.Connect(t)
	name := zkTestName(t, srv, conn)

	r := openZK(t, zkConfig(srv.Servers(), name, "10.0.0.5:8080"))
	l := zkAcquire(t, r)
	if l.WorkerID() != 0 || l.TTL() != 0 {
		t.Fatalf("first node: WorkerID %d TTL %s, want 0 and 0", l.WorkerID(), l.TTL())
	}
	node := "/snowflake/" + name + "/forever/10.0.0.5:8080-0000000000"
	ctx := testutil.Context(t, 10*time.Second)
	ts := time.Now().UnixMilli() + 1000
	must(t, "Renew", l.Renew(ctx, ts))
	if got, want := zkGet(t, conn, node), fmt.Sprintf(`{"ip":"10.0.0.5","port":"8080","timestamp":%d}`, ts); got != want {
		t.Fatalf("%s = %s, want %s", node, got, want)
	}
	// The record only rises.
	must(t, "Renew lower", l.Renew(ctx, ts-500))
	if got := zkGet(t, conn, node); !strings.Contains(got, fmt.Sprint(ts)) {
		t.Fatalf("after a lower Renew %s = %s, want the higher timestamp kept", node, got)
	}

	l2 := zkAcquire(t, openZK(t, zkConfig(srv.Servers(), name, "10.0.0.6:8080")))
	if l2.WorkerID() != 1 {
		t.Fatalf("second node: WorkerID %d, want 1", l2.WorkerID())
	}
	children, _, err := conn.Children("/snowflake/" + name + "/forever")
	must(t, "Children", err)
	if len(children) != 2 {
		t.Fatalf("forever/ children %v, want exactly the two Leaf nodes", children)
	}
}

func TestZKRegistryRestartKeepsWorkerID(t *testing.T) {
	t.Parallel()
	srv := testenv.ZooKeeper(t)
	conn := srv.Connect(t)
	name := zkTestName(t, srv, conn)
	cfg := zkConfig(srv.Servers(), name, "10.0.0.5:8080")
	// Another node first, so the ID kept is not 0 by chance.
	zkAcquire(t, openZK(t, zkConfig(srv.Servers(), name, "10.0.0.9:8080")))

	ctx := testutil.Context(t, 20*time.Second)
	r1 := openZK(t, cfg)
	l1 := zkAcquire(t, r1)
	if l1.Recorded() != 0 {
		t.Fatalf("new node: Recorded %d, want 0 (nothing issued yet)", l1.Recorded())
	}
	ts := time.Now().UnixMilli() + 1000
	must(t, "Renew", l1.Renew(ctx, ts))
	must(t, "Release", l1.Release(ctx, ts+100))
	r1.Close()

	l2 := zkAcquire(t, openZK(t, cfg))
	if l2.WorkerID() != l1.WorkerID() || l2.Recorded() != ts+100 {
		t.Fatalf("after restart: WorkerID %d Recorded %d, want %d and %d", l2.WorkerID(), l2.Recorded(), l1.WorkerID(), ts+100)
	}
}

// A node that Leaf itself registered (persistent sequential, Leaf's JSON) is found by
// ip:port and its timestamp is the record.
func TestZKRegistryTakesOverLeafNode(t *testing.T) {
	t.Parallel()
	srv := testenv.ZooKeeper(t)
	conn := srv.Connect(t)
	name := zkTestName(t, srv, conn)
	forever := "/snowflake/" + name + "/forever"
	for _, p := range []string{"/snowflake", "/snowflake/" + name, forever} {
		if _, err := conn.Create(p, nil, 0, zk.WorldACL(zk.PermAll)); err != nil && !errors.Is(err, zk.ErrNodeExists) {
			t.Fatalf("create %s: %v", p, err)
		}
	}
	const leafTS = int64(1763790000999)
	var created string
	for _, addr := range []string{"10.0.0.1:8080", "10.0.0.2:8080", "10.0.0.7:8080"} {
		data := fmt.Sprintf(`{"ip":"%s","port":"8080","timestamp":%d}`, strings.Split(addr, ":")[0], leafTS)
		var err error
		created, err = conn.Create(forever+"/"+addr+"-", []byte(data), zk.FlagSequence, zk.WorldACL(zk.PermAll))
		must(t, "create Leaf node", err)
	}
	if !strings.HasSuffix(created, "-0000000002") {
		t.Fatalf("hand-made Leaf node %s, want sequence 2", created)
	}
	l := zkAcquire(t, openZK(t, zkConfig(srv.Servers(), name, "10.0.0.7:8080")))
	if l.WorkerID() != 2 || l.Recorded() != leafTS {
		t.Fatalf("Leaf node taken over: WorkerID %d Recorded %d, want 2 and %d", l.WorkerID(), l.Recorded(), leafTS)
	}
}

// Leaf's first start on an empty tree gives two nodes starting together worker 0 both.
func TestZKRegistryFirstStartRace(t *testing.T) {
	t.Parallel()
	srv := testenv.ZooKeeper(t)
	conn := srv.Connect(t)
	for round := range 10 {
		name := zkTestName(t, srv, conn)
		regs := []*ZKRegistry{
			openZK(t, zkConfig(srv.Servers(), name, "10.0.0.1:8080")),
			openZK(t, zkConfig(srv.Servers(), name, "10.0.0.2:8080")),
		}
		for _, r := range regs { // both ready, so they really start together
			if !r.waitSession(testutil.Context(t, 10*time.Second), 10*time.Second) {
				t.Fatalf("round %d: no session", round)
			}
		}
		ids := raceAcquire(t, regs)
		if ids[0] == ids[1] {
			t.Fatalf("round %d: both nodes got worker ID %d", round, ids[0])
		}
	}
}

func TestZKRegistrySameAddressRefused(t *testing.T) {
	t.Parallel()
	srv := testenv.ZooKeeper(t)
	conn := srv.Connect(t)
	name := zkTestName(t, srv, conn)
	cfg := zkConfig(srv.Servers(), name, "10.0.0.5:8080", zkSessionTimeout(time.Second))

	first := zkAcquire(t, openZK(t, cfg))
	_, err := openZK(t, cfg).Acquire(testutil.Context(t, 15*time.Second))
	wantErrIs(t, "second Acquire as the same ip:port", err, ErrZKAddressInUse)
	if !strings.Contains(err.Error(), "10.0.0.5:8080") {
		t.Fatalf("error %q does not name the ip:port", err)
	}
	// Released, the ID is this ip:port's again at once.
	must(t, "Release", first.Release(testutil.Context(t, 5*time.Second), 1))
	if l := zkAcquire(t, openZK(t, cfg)); l.WorkerID() != first.WorkerID() {
		t.Fatalf("after release: WorkerID %d, want %d", l.WorkerID(), first.WorkerID())
	}
}

func TestZKRegistrySequenceOutOfRange(t *testing.T) {
	t.Parallel()
	srv := testenv.ZooKeeper(t)
	conn := srv.Connect(t)
	name := zkTestName(t, srv, conn)
	for i := range 3 {
		l := zkAcquire(t, openZK(t, zkConfig(srv.Servers(), name, fmt.Sprintf("10.0.0.%d:8080", i+1), zkMaxWorkerID(2))))
		if l.WorkerID() != int64(i) {
			t.Fatalf("node %d: WorkerID %d", i, l.WorkerID())
		}
	}
	_, err := openZK(t, zkConfig(srv.Servers(), name, "10.0.0.9:8080", zkMaxWorkerID(2))).
		Acquire(testutil.Context(t, 10*time.Second))
	wantErrIs(t, "Acquire past the range", err, ErrZKSequenceOutOfRange)
	for _, want := range []string{"worker ID 3", "10.0.0.9:8080-0000000003", "above 2", "--zk-recycle"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
}

// Started from the cache file, the lease finds its node once ZooKeeper is back and
// records there again.
func TestZKRegistryCacheThenZooKeeperBack(t *testing.T) {
	t.Parallel()
	srv := testenv.StartZooKeeper(t)
	cfg := zkConfig(srv.Servers(), "back", "10.0.0.5:8080", zkSessionTimeout(time.Second))
	zkAcquire(t, openZK(t, zkConfig(srv.Servers(), "back", "10.0.0.1:8080")))
	first := openZK(t, cfg)
	l := zkAcquire(t, first)
	must(t, "Release", l.Release(testutil.Context(t, 5*time.Second), 1000))
	first.Close()
	cfg.Cache = &CacheFile{Path: filepath.Join(t.TempDir(), "cache.json")}
	must(t, "Save", cfg.Cache.Save(cacheEntry{NodeID: "n1", WorkerID: l.WorkerID(), Timestamp: 2000, Registry: "zk /snowflake/back"}))

	srv.Stop()
	down := openZK(t, cfg)
	fallback := zkAcquire(t, down)
	if fallback.WorkerID() != l.WorkerID() || fallback.Recorded() != 2000 {
		t.Fatalf("from cache: WorkerID %d Recorded %d, want %d and 2000", fallback.WorkerID(), fallback.Recorded(), l.WorkerID())
	}
	srv.Start()
	ts := time.Now().UnixMilli() + 5000
	testutil.Eventually(t, 15*time.Second, "Renew to reach ZooKeeper again", func() bool {
		return fallback.Renew(testutil.Context(t, 2*time.Second), ts) == nil
	})
	conn := srv.Connect(t)
	if got := zkGet(t, conn, "/snowflake/back/forever/10.0.0.5:8080-0000000001"); !strings.Contains(got, fmt.Sprintf(`"timestamp":%d`, ts)) {
		t.Fatalf("node after ZooKeeper came back = %s, want timestamp %d", got, ts)
	}
}
