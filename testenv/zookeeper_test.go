package testenv_test

import (
	"errors"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
	"github.com/leafbus/leafbus/testenv"
)

func mustCreate(tb testing.TB, conn *zk.Conn, path, data string) {
	tb.Helper()
	if _, err := conn.Create(path, []byte(data), 0, zk.WorldACL(zk.PermAll)); err != nil {
		tb.Fatalf("Create(%q): %v", path, err)
	}
}

func mustGet(tb testing.TB, conn *zk.Conn, path, want string) {
	tb.Helper()
	got, _, err := conn.Get(path)
	if err != nil {
		tb.Fatalf("Get(%q): %v", path, err)
	}
	if string(got) != want {
		tb.Fatalf("Get(%q) = %q, want %q", path, got, want)
	}
}

func TestZooKeeperSharedCreateGet(t *testing.T) {
	z := testenv.ZooKeeper(t)
	if again := testenv.ZooKeeper(t); again != z {
		t.Fatalf("ZooKeeper() returned a second server %s, want the shared %s", again.Addr(), z.Addr())
	}
	if !strings.HasPrefix(z.Addr(), "127.0.0.1:") {
		t.Errorf("Addr() = %q, want 127.0.0.1:port", z.Addr())
	}
	if got := z.Servers(); !slices.Equal(got, []string{z.Addr()}) {
		t.Errorf("Servers() = %v, want [%s]", got, z.Addr())
	}
	conn := z.Connect(t)
	root := z.NewRoot(t)
	mustCreate(t, conn, root+"/worker", "127.0.0.1:8080")
	mustGet(t, conn, root+"/worker", "127.0.0.1:8080")
	seq, err := conn.Create(root+"/worker/n-", nil, zk.FlagSequence|zk.FlagEphemeral, zk.WorldACL(zk.PermAll))
	if err != nil || !strings.HasPrefix(seq, root+"/worker/n-") {
		t.Fatalf("Create sequential ephemeral = %q, %v", seq, err)
	}
}

func TestZooKeeperNewRootIsolated(t *testing.T) {
	z := testenv.ZooKeeper(t)
	conn := z.Connect(t)
	a, b := z.NewRoot(t), z.NewRoot(t)
	if a == b || !strings.HasPrefix(a, "/t") {
		t.Fatalf("NewRoot twice = %q, %q; want two distinct /tN paths", a, b)
	}
	mustCreate(t, conn, a+"/forever", "")
	children, _, err := conn.Children(b)
	if err != nil || len(children) != 0 {
		t.Fatalf("Children(%q) = %v, %v; want none", b, children, err)
	}

	var inner string
	t.Run("OK", func(t *testing.T) {
		inner = z.NewRoot(t)
		mustCreate(t, conn, inner+"/a", "")
		mustCreate(t, conn, inner+"/a/b", "")
	})
	if ok, _, err := conn.Exists(inner); err != nil || ok {
		t.Errorf("Exists(%q) after its test ended = %v, %v; want false (removed recursively)", inner, ok, err)
	}
}

func TestZooKeeperSharedRefusesStop(t *testing.T) {
	z := testenv.ZooKeeper(t)
	defer func() {
		r := recover()
		if s, _ := r.(string); !strings.Contains(s, "StartZooKeeper") {
			t.Errorf("Stop on the shared server: recovered %v, want a panic pointing at StartZooKeeper", r)
		}
	}()
	z.Stop()
}

func TestZooKeeperPrivateStopStartKeepsTree(t *testing.T) {
	z := testenv.StartZooKeeper(t)
	addr := z.Addr()
	root := z.NewRoot(t)
	conn := z.Connect(t)
	mustCreate(t, conn, root+"/persistent", "v0")

	tests := []struct {
		name    string
		stop    func()
		data    string
		stopped bool
	}{
		{name: "Stop", stop: z.Stop, data: "v1", stopped: true},
		{name: "Kill", stop: z.Kill, data: "v2", stopped: true},
		{name: "Restart", stop: z.Restart, data: "v3"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// Each step uses fresh sessions, so that it does not depend on how fast go-zk
			// notices the previous restart.
			if _, err := z.Connect(t).Set(root+"/persistent", []byte(tt.data), -1); err != nil {
				t.Fatalf("Set: %v", err)
			}
			tt.stop()
			if tt.stopped {
				if pid := z.PID(); pid != 0 {
					t.Errorf("PID() after %s = %d, want 0", tt.name, pid)
				}
				if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
					c.Close()
					t.Fatalf("dial %s after %s succeeded, want refused", addr, tt.name)
				}
				z.Start()
			}
			if z.Addr() != addr {
				t.Errorf("Addr() after %s = %s, want %s", tt.name, z.Addr(), addr)
			}
			mustGet(t, z.Connect(t), root+"/persistent", tt.data)
		})
	}
}

func TestZooKeeperEnsembleSurvivesLeaderKill(t *testing.T) {
	e := testenv.StartZooKeeperEnsemble(t, 3)
	if got := len(e.Servers()); got != 3 {
		t.Fatalf("Servers() has %d addresses, want 3", got)
	}
	conn := e.Connect(t)
	mustCreate(t, conn, "/before", "1")

	leader := e.Leader(t)
	e.Nodes[leader].Kill()
	next := e.Leader(t) // bounded: fails after 30 s without a new leader
	if next == leader {
		t.Fatalf("Leader() after killing node %d is still node %d", leader, next)
	}

	// The client's session survives: go-zk moves to another node by itself. Requests
	// made while it reconnects may fail once with a connection error.
	deadline := time.Now().Add(20 * time.Second)
	for {
		_, err := conn.Create("/after", []byte("2"), 0, zk.WorldACL(zk.PermAll))
		if err == nil || errors.Is(err, zk.ErrNodeExists) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("Create after the leader died: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	mustGet(t, conn, "/before", "1")

	e.Nodes[leader].Start()
	e.Leader(t)
	// The restarted node caught up with what was written while it was down.
	mustGet(t, e.Nodes[leader].Connect(t), "/after", "2")
}
