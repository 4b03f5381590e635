package testenv

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
)

// ZooKeeperEnsemble is a private quorum of ZooKeeper servers on loopback ports.
// Nodes[i] has myid i+1; stop, kill and start nodes to test fail-over.
type ZooKeeperEnsemble struct {
	Nodes []*ZooKeeperServer
}

// StartZooKeeperEnsemble starts size servers (3 is the usual quorum) as one ensemble and
// waits until one leads and the others follow. All are stopped at tb's cleanup.
func StartZooKeeperEnsemble(tb testing.TB, size int) *ZooKeeperEnsemble {
	tb.Helper()
	return startZooKeeperEnsemble(tb, debianZooKeeperPaths(), size)
}

func startZooKeeperEnsemble(tb testing.TB, paths zooKeeperPaths, size int) *ZooKeeperEnsemble {
	tb.Helper()
	if size < 2 {
		tb.Fatalf("testenv: a ZooKeeper ensemble needs at least 2 nodes, got %d", size)
	}
	began := time.Now()
	java, err := paths.resolve()
	if err != nil {
		tb.Fatalf("testenv: start ZooKeeper ensemble: %v", err)
	}
	dir, err := newDir("zkens")
	if err != nil {
		tb.Fatalf("testenv: start ZooKeeper ensemble: %v", err)
	}
	e := &ZooKeeperEnsemble{}
	tb.Cleanup(func() {
		e.halt()
		os.RemoveAll(dir)
	})
	for i := range size {
		nodeDir := filepath.Join(dir, "n"+strconv.Itoa(i+1))
		z := &ZooKeeperServer{tb: tb, java: java, dir: nodeDir, member: true}
		if err := os.MkdirAll(z.dataDir(), 0o755); err != nil {
			tb.Fatalf("testenv: ZooKeeper ensemble: %v", err)
		}
		if err := os.WriteFile(filepath.Join(z.dataDir(), "myid"), []byte(strconv.Itoa(i+1)+"\n"), 0o644); err != nil {
			tb.Fatalf("testenv: ZooKeeper ensemble: %v", err)
		}
		e.Nodes = append(e.Nodes, z)
	}
	for attempt := 1; ; attempt++ {
		err = e.launch()
		if err == nil {
			break
		}
		e.halt()
		if !errors.Is(err, errAddrInUse) || attempt == startAttempts {
			tb.Fatalf("testenv: start ZooKeeper ensemble: %v", err)
		}
	}
	leader, err := e.waitLeader(zkReadyTimeout)
	if err != nil {
		tb.Fatalf("testenv: ZooKeeper ensemble: %v", err)
	}
	tb.Logf("testenv: ZooKeeper ensemble %v ready in %v, leader is node %d", e.Servers(), time.Since(began).Round(time.Millisecond), leader)
	return e
}

// launch picks fresh ports, writes every node's config and starts the nodes.
func (e *ZooKeeperEnsemble) launch() error {
	ports := make([]int, 3*len(e.Nodes)) // client, quorum, election per node
	for i := range ports {
		p, err := FreePort()
		if err != nil {
			return err
		}
		ports[i] = p
	}
	var peers []string
	for i := range e.Nodes {
		peers = append(peers, fmt.Sprintf("server.%d=127.0.0.1:%d:%d", i+1, ports[3*i+1], ports[3*i+2]))
	}
	for i, z := range e.Nodes {
		z.port = ports[3*i]
		z.config = zkConfig(z.dataDir(), z.port, peers)
	}
	// Start all before waiting for any: a node only listens once its JVM is up, and
	// the JVMs' start-up is what takes time.
	procs := make([]*proc, len(e.Nodes))
	for i, z := range e.Nodes {
		p, err := z.spawn()
		if err != nil {
			return err
		}
		procs[i] = p
		z.proc = p
	}
	for i, z := range e.Nodes {
		if err := z.waitReady(procs[i]); err != nil {
			return fmt.Errorf("node %d: %w", i, err)
		}
	}
	return nil
}

// waitLeader waits until exactly one running node leads, every other running node
// follows, and the running nodes are a quorum.
func (e *ZooKeeperEnsemble) waitLeader(timeout time.Duration) (int, error) {
	deadline := time.Now().Add(timeout)
	for {
		leader, state := -1, ""
		running, leaders, followers := 0, 0, 0
		for i, z := range e.Nodes {
			if z.PID() == 0 {
				state += fmt.Sprintf(" %d:stopped", i)
				continue
			}
			running++
			mode, err := z.status()
			switch {
			case err != nil:
				mode = err.Error()
			case mode == "leader":
				leaders++
				leader = i
			case mode == "follower":
				followers++
			}
			state += fmt.Sprintf(" %d:%q", i, mode)
		}
		if leaders == 1 && followers == running-1 && running > len(e.Nodes)/2 {
			return leader, nil
		}
		if time.Now().After(deadline) {
			return -1, fmt.Errorf("no leader with followers after %v; nodes:%s", timeout, state)
		}
		time.Sleep(25 * time.Millisecond)
	}
}

// Leader waits until the running nodes have elected a leader that the others follow
// (after start, or after a node was stopped or killed) and returns its index in Nodes.
// It fails tb when that takes over 30 s or fewer than a quorum of nodes run.
func (e *ZooKeeperEnsemble) Leader(tb testing.TB) int {
	tb.Helper()
	i, err := e.waitLeader(zkReadyTimeout)
	if err != nil {
		tb.Fatalf("testenv: ZooKeeper ensemble: %v", err)
	}
	return i
}

// Servers is every node's client address, for zk.Connect.
func (e *ZooKeeperEnsemble) Servers() []string {
	var s []string
	for _, z := range e.Nodes {
		s = append(s, z.Addr())
	}
	return s
}

// Connect opens a session with the ensemble (any node), closed at tb's cleanup.
func (e *ZooKeeperEnsemble) Connect(tb testing.TB) *zk.Conn {
	tb.Helper()
	return connectZK(tb, e.Servers())
}

func (e *ZooKeeperEnsemble) halt() {
	for _, z := range e.Nodes {
		z.halt()
	}
}
