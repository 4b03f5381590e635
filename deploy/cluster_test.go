package deploy

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/leafbus/leafbus/bus"
	"github.com/leafbus/leafbus/internal/testutil"
	"github.com/leafbus/leafbus/testenv"
)

// clusterConf is the cluster node's configuration: every node of the secured cluster
// runs it, with its own environment.
const clusterConf = "nats.conf"

// clusterNode is the environment one node of clusterConf starts with.
type clusterNode struct {
	name                            string
	client, monitor, cluster, store string
}

// env is the node's variables (the roles' passwords are set once for all nodes).
func (n clusterNode) env(routes string) map[string]string {
	return map[string]string{
		"NATS_SERVER_NAME":    n.name,
		"NATS_LISTEN":         n.client,
		"NATS_MONITOR":        n.monitor,
		"NATS_STORE_DIR":      n.store,
		"NATS_CLUSTER_LISTEN": n.cluster,
		"NATS_ROUTES":         routes,
	}
}

// freeAddr is a loopback address with a port nothing listens on right now, and that
// outgoing connections do not take meanwhile (testenv.FreePort).
func freeAddr(t *testing.T) string {
	t.Helper()
	p, err := testenv.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(p))
}

// clusterNodes are n nodes on loopback, and the NATS_ROUTES value that lists them all
// with the route password.
func clusterNodes(t *testing.T, n int, routePassword string) ([]clusterNode, string) {
	t.Helper()
	var nodes []clusterNode
	var routes []string
	for i := range n {
		node := clusterNode{
			name:   fmt.Sprintf("n%d", i+1),
			client: freeAddr(t), monitor: freeAddr(t), cluster: freeAddr(t),
			store: t.TempDir(),
		}
		nodes = append(nodes, node)
		routes = append(routes, "nats-route://route:"+routePassword+"@"+node.cluster)
	}
	return nodes, "[" + strings.Join(routes, ", ") + "]"
}

// parseNode reads clusterConf as nats-server does, in env (the roles' passwords must be
// set already).
func parseNode(t *testing.T, env map[string]string) (*server.Options, error) {
	t.Helper()
	for k, v := range env {
		t.Setenv(k, v)
	}
	return server.ProcessConfigFile(clusterConf)
}

// TestClusterConfig: nats.conf takes every per-node setting from the environment, as
// it documents, carries the roles of nats-roles.conf, authenticates routes, and refuses
// to start without any of its variables, naming it.
func TestClusterConfig(t *testing.T) {
	secrets := testutil.NATSConfPasswords(t, clusterConf)
	routePW := secrets["NATS_ROUTE_PASSWORD"]
	if routePW == "" {
		t.Fatalf("%s reads no NATS_ROUTE_PASSWORD: its routes would be open to anyone", clusterConf)
	}
	nodes, routes := clusterNodes(t, 3, routePW)
	env := nodes[1].env(routes)
	opts, err := parseNode(t, env)
	if err != nil {
		t.Fatalf("%s with %v: %v", clusterConf, env, err)
	}
	hostPort := func(h string, p int) string { return net.JoinHostPort(h, fmt.Sprint(p)) }
	for _, c := range []struct{ what, got, want string }{
		{"server_name", opts.ServerName, "n2"},
		{"client listen", hostPort(opts.Host, opts.Port), nodes[1].client},
		{"monitoring", hostPort(opts.HTTPHost, opts.HTTPPort), nodes[1].monitor},
		{"store_dir", opts.StoreDir, nodes[1].store},
		{"cluster listen", hostPort(opts.Cluster.Host, opts.Cluster.Port), nodes[1].cluster},
		{"cluster name", opts.Cluster.Name, "leafbus"},
		{"route user", opts.Cluster.Username, "route"},
		{"route password", opts.Cluster.Password, routePW},
	} {
		if c.got != c.want {
			t.Errorf("%s: %s is %q, want %q", clusterConf, c.what, c.got, c.want)
		}
	}
	if !opts.JetStream {
		t.Errorf("%s does not enable JetStream", clusterConf)
	}
	if len(opts.Routes) != 3 {
		t.Errorf("%s: routes %v, want the 3 of NATS_ROUTES", clusterConf, opts.Routes)
	}
	for _, r := range opts.Routes {
		if pw, _ := r.User.Password(); r.User.Username() != "route" || pw != routePW {
			t.Errorf("%s: route %s does not carry the route user's credentials", clusterConf, r.Redacted())
		}
	}
	users := map[string]bool{}
	for _, u := range opts.Users {
		users[u.Username] = true
	}
	for _, u := range []string{"dispenser", "dispenser-service", "client-a", "client-b", "etl", "operator"} {
		if !users[u] {
			t.Errorf("%s: no user %s: it must include the roles of %s", clusterConf, u, rolesConf)
		}
	}

	for name := range env {
		t.Run("Missing"+name, func(t *testing.T) {
			t.Setenv(name, "") // restored when this subtest ends
			os.Unsetenv(name)
			if _, err := server.ProcessConfigFile(clusterConf); err == nil || !strings.Contains(err.Error(), name) {
				t.Errorf("%s without %s: %v, want an error naming the variable", clusterConf, name, err)
			}
		})
	}
}

// TestClusterStarts runs three nodes of nats.conf in this process, each with the
// environment it documents: they form the cluster over authenticated routes, a
// dispenser's JetStream user creates a bucket with three replicas, an application on
// one node is answered by a service on another, and the cluster port refuses a server
// that does not know the route password.
func TestClusterStarts(t *testing.T) {
	secrets := testutil.NATSConfPasswords(t, clusterConf)
	nodes, routes := clusterNodes(t, 3, secrets["NATS_ROUTE_PASSWORD"])
	var servers []*server.Server
	for _, node := range nodes {
		opts, err := parseNode(t, node.env(routes))
		if err != nil {
			t.Fatalf("%s for %s: %v", clusterConf, node.name, err)
		}
		opts.NoSigs = true // the test binary's signals are not the server's
		srv, err := server.NewServer(opts)
		if err != nil {
			t.Fatalf("node %s: %v", node.name, err)
		}
		srv.SetLoggerV2(testLogger{t, node.name}, false, false, false)
		go srv.Start()
		t.Cleanup(func() {
			srv.Shutdown()
			srv.WaitForShutdown()
		})
		if !srv.ReadyForConnections(10 * time.Second) {
			t.Fatalf("node %s not ready within 10s", node.name)
		}
		servers = append(servers, srv)
	}
	testutil.Eventually(t, 20*time.Second, "every node routed to the two others", func() bool {
		for _, srv := range servers {
			if srv.NumRoutes() < 2 {
				return false
			}
		}
		return true
	})

	t.Run("RoutesAuthenticate", func(t *testing.T) {
		for _, pw := range []string{"", "wrong"} {
			if got := routeConnect(t, nodes[0].cluster, pw); !strings.Contains(got, "Authorization Violation") {
				t.Errorf("a route with password %q was answered %q, want an Authorization Violation", pw, got)
			}
		}
	})

	ctx := testutil.Context(t, time.Minute)
	connect := func(node clusterNode, user string, opts ...nats.Option) *nats.Conn {
		t.Helper()
		opts = append([]nats.Option{nats.UserInfo(user, secrets[passwordVar(user)]), nats.Name("cluster test " + user)}, opts...)
		nc, err := nats.Connect("nats://"+node.client, opts...)
		if err != nil {
			t.Fatalf("connect as %s to %s: %v", user, node.name, err)
		}
		t.Cleanup(nc.Close)
		return nc
	}

	t.Run("ReplicatedBucket", func(t *testing.T) {
		js, err := jetstream.New(connect(nodes[2], "dispenser"))
		if err != nil {
			t.Fatal(err)
		}
		// The first replicated asset waits for the meta leader's election.
		testutil.Eventually(t, 30*time.Second, "a KV bucket with 3 replicas", func() bool {
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			_, err := js.CreateKeyValue(cctx, jetstream.KeyValueConfig{Bucket: "leaf_forever", Replicas: 3})
			return err == nil
		})
	})

	t.Run("ServiceAcrossNodes", func(t *testing.T) {
		svc := connect(nodes[0], "dispenser-service")
		sub, err := svc.QueueSubscribe("leaf.segment.*", "leaf", func(m *nats.Msg) { _ = m.Respond([]byte("1")) })
		if err != nil {
			t.Fatal(err)
		}
		defer sub.Unsubscribe()
		if err := svc.Flush(); err != nil {
			t.Fatal(err)
		}
		app := connect(nodes[2], "client-a", nats.CustomInboxPrefix("_INBOX_client-a"))
		testutil.Eventually(t, 10*time.Second, "an application on n3 answered by the service on n1", func() bool {
			m, err := app.Request("leaf.segment.orders", nil, time.Second)
			return err == nil && string(m.Data) == "1"
		})
	})
}

// routeConnect connects to a cluster port as a route with user route and password pw
// and returns the server's first answer to the CONNECT.
func routeConnect(t *testing.T, addr, pw string) string {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, violationWait)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(violationWait)); err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(conn)
	if line, err := r.ReadString('\n'); err != nil || !strings.HasPrefix(line, "INFO ") {
		t.Fatalf("cluster port %s: first line %q (%v), want INFO", addr, line, err)
	}
	connect := fmt.Sprintf(`CONNECT {"verbose":false,"pedantic":false,"user":"route","pass":%q,"name":"intruder","cluster":"leafbus","headers":true}`+"\r\nPING\r\n", pw)
	if _, err := conn.Write([]byte(connect)); err != nil {
		t.Fatal(err)
	}
	line, err := r.ReadString('\n')
	if err != nil {
		return "closed: " + err.Error()
	}
	return strings.TrimSpace(line)
}

// testLogger sends a server's log lines to t.Log.
type testLogger struct {
	t    *testing.T
	name string
}

func (l testLogger) Noticef(format string, v ...any) { l.log("INF", format, v...) }
func (l testLogger) Warnf(format string, v ...any)   { l.log("WRN", format, v...) }
func (l testLogger) Fatalf(format string, v ...any)  { l.log("FTL", format, v...) }
func (l testLogger) Errorf(format string, v ...any)  { l.log("ERR", format, v...) }
func (l testLogger) Debugf(format string, v ...any)  { l.log("DBG", format, v...) }
func (l testLogger) Tracef(format string, v ...any)  { l.log("TRC", format, v...) }

func (l testLogger) log(level, format string, v ...any) {
	l.t.Logf("%s [%s] %s", l.name, level, fmt.Sprintf(format, v...))
}

// TestClusterConfigLiveness: nats.conf drops a stalled client (a SIGSTOPped dispenser)
// within seconds, with the values the embedded server uses.
func TestClusterConfigLiveness(t *testing.T) {
	secrets := testutil.NATSConfPasswords(t, clusterConf)
	nodes, routes := clusterNodes(t, 1, secrets["NATS_ROUTE_PASSWORD"])
	opts, err := parseNode(t, nodes[0].env(routes))
	if err != nil {
		t.Fatalf("%s: %v", clusterConf, err)
	}
	if opts.PingInterval != bus.LivenessPingInterval || opts.MaxPingsOut != bus.LivenessMaxPingsOut || opts.WriteDeadline != bus.LivenessWriteDeadline {
		t.Errorf("%s: ping_interval %v, ping_max %d, write_deadline %v; want the embedded server's %v, %d, %v",
			clusterConf, opts.PingInterval, opts.MaxPingsOut, opts.WriteDeadline,
			bus.LivenessPingInterval, bus.LivenessMaxPingsOut, bus.LivenessWriteDeadline)
	}
}
