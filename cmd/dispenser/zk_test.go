package main

// The ZooKeeper worker registry (--worker-registry zk, Leaf's layout) through the real
// dispenser code path, against a real ZooKeeper.

import (
	"encoding/json"
	"strconv"
	"strings"
	"testing"

	"github.com/go-zookeeper/zk"

	"github.com/leafbus/leafbus/testenv"
)

// zkNode configures a dispenser that takes its worker ID from ZooKeeper under name as
// advertise, with its own embedded NATS and data dir.
func zkNode(servers, name, node, advertise, dataDir string) func(*testConfig) {
	return func(c *testConfig) {
		c.NodeID = node
		c.DataDir = dataDir
		c.WorkerRegistry = "zk"
		c.ZK = servers
		c.ZKName = name
		c.Advertise = advertise
	}
}

// leafNode reads advertise's node under /snowflake/<name>/forever: its sequence (the
// worker ID) and the JSON timestamp.
func leafNode(t *testing.T, conn *zk.Conn, name, advertise string) (seq, ts int64) {
	t.Helper()
	forever := "/snowflake/" + name + "/forever"
	children, _, err := conn.Children(forever)
	if err != nil {
		t.Fatalf("list %s: %v", forever, err)
	}
	for _, c := range children {
		addr, s, ok := strings.Cut(c, "-")
		if !ok || addr != advertise {
			continue
		}
		if len(s) != 10 {
			t.Fatalf("node %s: sequence %q is not 10 digits", c, s)
		}
		seq, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			t.Fatalf("node %s: %v", c, err)
		}
		b, _, err := conn.Get(forever + "/" + c)
		if err != nil {
			t.Fatalf("get %s: %v", c, err)
		}
		var ep struct {
			IP        string `json:"ip"`
			Port      string `json:"port"`
			Timestamp int64  `json:"timestamp"`
		}
		if err := json.Unmarshal(b, &ep); err != nil || ep.IP+":"+ep.Port != advertise {
			t.Fatalf("node %s holds %s, want Leaf's JSON for %s (%v)", c, b, advertise, err)
		}
		return seq, ep.Timestamp
	}
	t.Fatalf("no node for %s under %s (children %v)", advertise, forever, children)
	return 0, 0
}

// TestZKWorkerRegistry: a dispenser gets its worker ID from its Leaf node, records its
// timestamps there and keeps the ID across a restart; a second dispenser gets another
// ID and their IDs never collide.
func TestZKWorkerRegistry(t *testing.T) {
	srv := testenv.ZooKeeper(t)
	conn := srv.Connect(t)
	name := strings.TrimPrefix(srv.NewRoot(t), "/") + "-e2e"
	seen := map[int64]string{}
	dirA := t.TempDir()

	a := startDispenser(t, zkNode(srv.Addr(), name, "zk-a", "127.0.0.1:7001", dirA))
	wa := workerOf(takeSnowflakes(t, a, seen, "a", 1000))
	if seq, ts := leafNode(t, conn, name, "127.0.0.1:7001"); seq != wa || ts == 0 {
		t.Fatalf("dispenser a issues with worker ID %d; its ZooKeeper node has sequence %d, timestamp %d", wa, seq, ts)
	}

	b := startDispenser(t, zkNode(srv.Addr(), name, "zk-b", "127.0.0.1:7002", t.TempDir()))
	wb := workerOf(takeSnowflakes(t, b, seen, "b", 1000))
	if wb == wa {
		t.Fatalf("dispensers a and b both have worker ID %d", wa)
	}
	if seq, _ := leafNode(t, conn, name, "127.0.0.1:7002"); seq != wb {
		t.Fatalf("dispenser b issues with worker ID %d; its node has sequence %d", wb, seq)
	}

	takeSnowflakes(t, a, seen, "a", 1000)
	if err := a.stop(); err != nil {
		t.Fatalf("stop a: %v", err)
	}
	a2 := startDispenser(t, zkNode(srv.Addr(), name, "zk-a", "127.0.0.1:7001", dirA))
	if w := workerOf(takeSnowflakes(t, a2, seen, "a restarted", 1000)); w != wa {
		t.Fatalf("after a restart a has worker ID %d, want %d", w, wa)
	}
	takeSnowflakes(t, b, seen, "b", 1000)
}

// TestZKDownRestartFromCacheFile: with ZooKeeper stopped, a dispenser restarts from its
// cache file with the same worker ID and repeats no ID.
func TestZKDownRestartFromCacheFile(t *testing.T) {
	srv := testenv.StartZooKeeper(t)
	seen := map[int64]string{}
	dir := t.TempDir()
	configure := zkNode(srv.Addr(), "leafbus", "zk-c", "127.0.0.1:7003", dir)

	c := startDispenser(t, configure)
	wc := workerOf(takeSnowflakes(t, c, seen, "c", 1000))
	if err := c.stop(); err != nil {
		t.Fatalf("stop c: %v", err)
	}
	srv.Stop()
	c2 := startDispenser(t, configure)
	if w := workerOf(takeSnowflakes(t, c2, seen, "c restarted without ZooKeeper", 1000)); w != wc {
		t.Fatalf("restarted from the cache file, c has worker ID %d, want %d", w, wc)
	}
	if !strings.Contains(c2.stderr.String(), "cache file") {
		t.Errorf("no log line says the dispenser started from the cache file")
	}
}

// TestZKRecycleWorkerRegistry: with --zk-recycle two dispensers lease distinct IDs; a
// clean stop gives the ID back at once, and the next holder starts past its record, so
// no ID repeats.
func TestZKRecycleWorkerRegistry(t *testing.T) {
	srv := testenv.ZooKeeper(t)
	name := strings.TrimPrefix(srv.NewRoot(t), "/") + "-recycle"
	recycle := func(node, advertise string) func(*testConfig) {
		return func(c *testConfig) {
			zkNode(srv.Addr(), name, node, advertise, t.TempDir())(c)
			c.ZKRecycle = true
		}
	}
	seen := map[int64]string{}
	a := startDispenser(t, recycle("zk-ra", "127.0.0.1:7011"))
	wa := workerOf(takeSnowflakes(t, a, seen, "a", 1000))
	b := startDispenser(t, recycle("zk-rb", "127.0.0.1:7012"))
	if wb := workerOf(takeSnowflakes(t, b, seen, "b", 1000)); wb == wa {
		t.Fatalf("dispensers a and b both lease worker ID %d", wa)
	}
	takeSnowflakes(t, a, seen, "a", 1000)
	if err := a.stop(); err != nil {
		t.Fatalf("stop a: %v", err)
	}
	c := startDispenser(t, recycle("zk-rc", "127.0.0.1:7013"))
	if wc := workerOf(takeSnowflakes(t, c, seen, "c", 1000)); wc != wa {
		t.Fatalf("after a released worker ID %d, c leased %d, want the freed one", wa, wc)
	}
}
