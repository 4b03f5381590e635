package testenv

import (
	"fmt"
	"net"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// NATS is one embedded nats-server with JetStream, on a random loopback port, with its
// store in a temp dir. Unlike MariaDB and ZooKeeper it starts in milliseconds, so each
// test gets its own.
type NATS struct {
	tb   testing.TB
	mu   sync.Mutex
	opts server.Options
	srv  *server.Server
}

// StartNATS starts a single JetStream-enabled server for tb and stops it at cleanup.
func StartNATS(tb testing.TB) *NATS {
	tb.Helper()
	n := &NATS{tb: tb, opts: server.Options{
		ServerName: "n0",
		Host:       "127.0.0.1",
		Port:       server.RANDOM_PORT,
		JetStream:  true,
		StoreDir:   tb.TempDir(),
		NoLog:      true,
		NoSigs:     true,
		// Small limits keep several servers per test binary cheap.
		JetStreamMaxMemory: 256 << 20,
		JetStreamMaxStore:  1 << 30,
	}}
	n.start()
	// The port is fixed after the first start so that Restart comes back on the same
	// address and clients reconnect by themselves.
	n.opts.Port = n.srv.Addr().(*net.TCPAddr).Port
	tb.Cleanup(n.Stop)
	return n
}

func (n *NATS) start() {
	n.tb.Helper()
	opts := n.opts
	var err error
	for attempt := 0; ; attempt++ {
		var srv *server.Server
		if srv, err = server.NewServer(&opts); err == nil {
			go srv.Start()
			if srv.ReadyForConnections(10 * time.Second) {
				n.mu.Lock()
				n.srv = srv
				n.mu.Unlock()
				return
			}
			srv.Shutdown()
			err = fmt.Errorf("not ready within 10s")
		}
		if attempt == 20 {
			break
		}
		time.Sleep(100 * time.Millisecond) // the port may still be held by the previous instance
	}
	n.tb.Fatalf("testenv: start nats-server on %s:%d: %v", opts.Host, opts.Port, err)
}

// URL is the client URL, e.g. nats://127.0.0.1:41234.
func (n *NATS) URL() string {
	return fmt.Sprintf("nats://%s:%d", n.opts.Host, n.opts.Port)
}

// Server is the running server (nil while stopped).
func (n *NATS) Server() *server.Server {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.srv
}

// Connect opens a client connection that is closed at cleanup. It retries reconnects
// forever, so it survives Stop/Start of the server.
func (n *NATS) Connect(tb testing.TB, opts ...nats.Option) *nats.Conn {
	tb.Helper()
	return connect(tb, n.URL(), opts...)
}

// Stop shuts the server down and waits until it is gone. Safe to call twice.
func (n *NATS) Stop() {
	n.mu.Lock()
	srv := n.srv
	n.srv = nil
	n.mu.Unlock()
	if srv != nil {
		srv.Shutdown()
		srv.WaitForShutdown()
	}
}

// Start starts a stopped server again on the same port with the same JetStream store.
func (n *NATS) Start() {
	n.tb.Helper()
	if n.Server() != nil {
		return
	}
	n.start()
}

// Restart is Stop followed by Start.
func (n *NATS) Restart() {
	n.tb.Helper()
	n.Stop()
	n.Start()
}

// Cluster is a JetStream cluster of in-process servers, each on its own loopback client
// and route ports.
type Cluster struct {
	Nodes []*NATS
}

// StartNATSCluster starts size clustered servers (3 for an R3 test) and waits until
// every node sees the others and JetStream has a meta leader that every node follows.
func StartNATSCluster(tb testing.TB, size int) *Cluster {
	tb.Helper()
	if size < 2 {
		tb.Fatalf("testenv: a cluster needs at least 2 nodes, got %d", size)
	}
	routePorts := freePorts(tb, size)
	clientPorts := freePorts(tb, size)
	var routes []*url.URL
	for _, p := range routePorts {
		routes = append(routes, &url.URL{Scheme: "nats", Host: fmt.Sprintf("127.0.0.1:%d", p)})
	}
	c := &Cluster{}
	for i := 0; i < size; i++ {
		n := &NATS{tb: tb, opts: server.Options{
			ServerName:         fmt.Sprintf("n%d", i),
			Host:               "127.0.0.1",
			Port:               clientPorts[i],
			JetStream:          true,
			StoreDir:           tb.TempDir(),
			NoLog:              true,
			NoSigs:             true,
			JetStreamMaxMemory: 256 << 20,
			JetStreamMaxStore:  1 << 30,
			Cluster: server.ClusterOpts{
				Name: "testenv",
				Host: "127.0.0.1",
				Port: routePorts[i],
			},
			Routes: routes,
		}}
		n.start()
		tb.Cleanup(n.Stop)
		c.Nodes = append(c.Nodes, n)
	}
	deadline := time.Now().Add(20 * time.Second)
	for _, n := range c.Nodes {
		for n.Server().NumRoutes() < size-1 {
			if time.Now().After(deadline) {
				tb.Fatalf("testenv: cluster node %s sees %d routes, want %d", n.opts.ServerName, n.Server().NumRoutes(), size-1)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	c.WaitJetStream(tb, deadline)
	return c
}

// WaitJetStream waits until one running node is the JetStream meta leader and every
// running node is current with it (after start, or after a node was stopped).
func (c *Cluster) WaitJetStream(tb testing.TB, deadline time.Time) {
	tb.Helper()
	for {
		leaders, current, running := 0, 0, 0
		for _, n := range c.Nodes {
			s := n.Server()
			if s == nil {
				continue
			}
			running++
			if s.JetStreamIsLeader() {
				leaders++
			}
			if s.JetStreamIsCurrent() {
				current++
			}
		}
		if leaders == 1 && current == running {
			return
		}
		if time.Now().After(deadline) {
			tb.Fatalf("testenv: JetStream cluster not ready: %d leaders, %d of %d nodes current", leaders, current, running)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// URLs is every node's client URL, comma separated, as nats.Connect and --nats take them.
func (c *Cluster) URLs() string {
	var urls []string
	for _, n := range c.Nodes {
		urls = append(urls, n.URL())
	}
	return strings.Join(urls, ",")
}

// Connect connects to the whole cluster (any node), closed at cleanup.
func (c *Cluster) Connect(tb testing.TB, opts ...nats.Option) *nats.Conn {
	tb.Helper()
	return connect(tb, c.URLs(), opts...)
}

func connect(tb testing.TB, urls string, opts ...nats.Option) *nats.Conn {
	tb.Helper()
	base := []nats.Option{
		nats.MaxReconnects(-1),
		nats.ReconnectWait(50 * time.Millisecond),
		nats.Timeout(5 * time.Second),
	}
	nc, err := nats.Connect(urls, append(base, opts...)...)
	if err != nil {
		tb.Fatalf("testenv: connect to %s: %v", urls, err)
	}
	tb.Cleanup(nc.Close)
	return nc
}

// freePorts picks n distinct ports with FreePort. Another process may yet take one
// before its server binds it; start retries cover that rare case.
func freePorts(tb testing.TB, n int) []int {
	tb.Helper()
	seen := map[int]bool{}
	var ports []int
	for len(ports) < n {
		p, err := FreePort()
		if err != nil {
			tb.Fatalf("testenv: %v", err)
		}
		if !seen[p] {
			seen[p] = true
			ports = append(ports, p)
		}
	}
	return ports
}

// shortTempDir makes a temp dir with a short path (unix socket paths are limited to 107
// bytes and t.TempDir() can be longer) and removes it at cleanup.
func shortTempDir(tb testing.TB, prefix string) string {
	tb.Helper()
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		tb.Fatalf("testenv: temp dir: %v", err)
	}
	tb.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}
