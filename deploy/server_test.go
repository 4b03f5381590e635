package deploy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/leafbus/leafbus/internal/testutil"
)

// rolesConf is the file under test, relative to this package's directory (where go test
// runs the test binary).
const rolesConf = "nats-roles.conf"

// violationWait bounds how long a refusal may take to come back from the server; it is
// a round trip on loopback, so the bound only matters when something is wrong.
const violationWait = 10 * time.Second

// rolesServer is a nats-server started from rolesConf as it is, with a client listen
// address (127.0.0.1, a random port) and JetStream in a temporary store directory.
type rolesServer struct {
	srv       *server.Server
	url       string
	passwords map[string]string // user -> password, as the file gives them
}

// parseRolesConf reads rolesConf as nats-server does, with every role's password in
// the environment as an operator's secrets file puts it, and returns the options and
// every user's password.
func parseRolesConf(t *testing.T) (*server.Options, map[string]string) {
	t.Helper()
	testutil.NATSConfPasswords(t, rolesConf)
	opts, err := server.ProcessConfigFile(rolesConf)
	if err != nil {
		t.Fatalf("parse %s: %v", rolesConf, err)
	}
	passwords := make(map[string]string, len(opts.Users))
	for _, u := range opts.Users {
		passwords[u.Username] = u.Password
	}
	return opts, passwords
}

func startRolesServer(t *testing.T) *rolesServer {
	t.Helper()
	opts, passwords := parseRolesConf(t)
	// The test must never listen anywhere but loopback: a listener the file may grow
	// (monitoring, cluster, ...) would open a port here, so it fails the test instead.
	for name, port := range map[string]int{
		"http_port": opts.HTTPPort, "https_port": opts.HTTPSPort, "prof_port": opts.ProfPort,
		"cluster": opts.Cluster.Port, "gateway": opts.Gateway.Port, "leafnodes": opts.LeafNode.Port,
		"websocket": opts.Websocket.Port, "mqtt": opts.MQTT.Port,
	} {
		if port != 0 {
			t.Fatalf("%s opens a %s listener (port %d): this test would bind it; keep extra listeners out of the file or teach the test to move them to 127.0.0.1", rolesConf, name, port)
		}
	}
	// The file holds the roles only: the server around it (deploy/nats.conf, or the
	// embedded one of --nats-config) gives the listen address and JetStream.
	opts.JetStream = true
	opts.Host = "127.0.0.1"
	opts.Port = server.RANDOM_PORT
	opts.StoreDir = t.TempDir()
	opts.NoSigs = true // the test binary's signals are not the server's
	srv, err := server.NewServer(opts)
	if err != nil {
		t.Fatalf("nats-server from %s: %v", rolesConf, err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		srv.Shutdown()
		t.Fatalf("nats-server from %s not ready within 10s", rolesConf)
	}
	t.Cleanup(func() {
		srv.Shutdown()
		srv.WaitForShutdown()
	})
	addr, ok := srv.Addr().(*net.TCPAddr)
	if !ok || !addr.IP.IsLoopback() {
		t.Fatalf("nats-server listens on %v, want 127.0.0.1", srv.Addr())
	}
	return &rolesServer{srv: srv, url: srv.ClientURL(), passwords: passwords}
}

// roleConn is one user's connection; the server's asynchronous errors (permission
// violations above all) arrive on errs.
type roleConn struct {
	*nats.Conn
	user string
	errs chan error
}

func (rs *rolesServer) connect(t *testing.T, user string, opts ...nats.Option) *roleConn {
	t.Helper()
	pw, ok := rs.passwords[user]
	if !ok {
		t.Fatalf("%s has no user %q", rolesConf, user)
	}
	c := &roleConn{user: user, errs: make(chan error, 256)}
	all := append([]nats.Option{
		nats.UserInfo(user, pw),
		nats.Name("roles test " + user),
		nats.MaxReconnects(0),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			select {
			case c.errs <- err:
			default: // a test that piles up 256 unread errors has failed already
			}
		}),
	}, opts...)
	nc, err := nats.Connect(rs.url, all...)
	if err != nil {
		t.Fatalf("connect as %s: %v", user, err)
	}
	t.Cleanup(func() {
		nc.Close()
		if t.Failed() {
			for {
				select {
				case err := <-c.errs:
					t.Logf("%s: unread asynchronous error: %v", user, err)
					continue
				default:
				}
				break
			}
		}
	})
	c.Conn = nc
	return c
}

// drain forgets errors reported so far, so that the next expectation is about the next
// action only.
func (c *roleConn) drain() {
	for {
		select {
		case <-c.errs:
		default:
			return
		}
	}
}

// expectViolation waits until the server reports that c may not do op ("Publish" or
// "Subscription") on subject.
func (c *roleConn) expectViolation(t *testing.T, op, subject string) {
	t.Helper()
	want := fmt.Sprintf("%s to %q", op, subject)
	timer := time.NewTimer(violationWait)
	defer timer.Stop()
	var seen []string
	for {
		select {
		case err := <-c.errs:
			if errors.Is(err, nats.ErrPermissionViolation) && strings.Contains(err.Error(), want) {
				return
			}
			seen = append(seen, err.Error())
		case <-timer.C:
			t.Fatalf("%s: no permissions violation for %s within %v (other errors: %q)", c.user, want, violationWait, seen)
		}
	}
}

// refusedPublish publishes to subject and expects the server to refuse it.
func (c *roleConn) refusedPublish(t *testing.T, subject string, data []byte) {
	t.Helper()
	c.drain()
	if err := c.Publish(subject, data); err != nil {
		t.Fatalf("%s: publish %s: %v", c.user, subject, err)
	}
	c.expectViolation(t, "Publish", subject)
}

// refusedCall runs call, which publishes to subject and waits for an answer (a request,
// a JetStream API call), and expects the server to refuse the publish and call to fail:
// once the refusal is in, the call's context is cancelled, so nothing waits for a
// timeout that cannot end well.
func (c *roleConn) refusedCall(t *testing.T, subject string, call func(ctx context.Context) error) {
	t.Helper()
	c.drain()
	ctx, cancel := context.WithTimeout(context.Background(), 2*violationWait)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- call(ctx) }()
	c.expectViolation(t, "Publish", subject)
	cancel()
	select {
	case err := <-done:
		if err == nil {
			t.Fatalf("%s: call on %s succeeded after the server refused the publish", c.user, subject)
		}
	case <-time.After(violationWait):
		t.Fatalf("%s: call on %s did not return within %v of being cancelled", c.user, subject, violationWait)
	}
}

// refusedRequest is refusedCall for a plain request.
func (c *roleConn) refusedRequest(t *testing.T, subject string) {
	t.Helper()
	c.refusedCall(t, subject, func(ctx context.Context) error {
		_, err := c.RequestWithContext(ctx, subject, nil)
		return err
	})
}

// refusedSubscribe subscribes to subject (in queue group queue unless empty) and
// expects the server to refuse it.
func (c *roleConn) refusedSubscribe(t *testing.T, subject, queue string) {
	t.Helper()
	c.drain()
	sub, err := c.QueueSubscribe(subject, queue, func(m *nats.Msg) {
		t.Errorf("%s: refused subscription %s got a message on %s", c.user, subject, m.Subject)
	})
	if err != nil {
		t.Fatalf("%s: subscribe %s: %v", c.user, subject, err)
	}
	defer sub.Unsubscribe()
	c.expectViolation(t, "Subscription", subject)
}

// waitAPIIdle waits until the server's JetStream API has no request in flight and
// returns how many it has handled since it started.
func (rs *rolesServer) waitAPIIdle(t *testing.T) uint64 {
	t.Helper()
	deadline := time.Now().Add(violationWait)
	for {
		info, err := rs.srv.Jsz(nil)
		if err != nil {
			t.Fatalf("jsz: %v", err)
		}
		if info.API.Inflight == 0 {
			return info.API.Total
		}
		if time.Now().After(deadline) {
			t.Fatalf("JetStream API still has %d requests in flight after %v", info.API.Inflight, violationWait)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// testLog collects the project code's logs and prints them only when the test fails.
func testLog(t *testing.T) *slog.Logger {
	var mu sync.Mutex
	var buf bytes.Buffer
	t.Cleanup(func() {
		mu.Lock()
		defer mu.Unlock()
		if t.Failed() && buf.Len() > 0 {
			t.Logf("logs:\n%s", buf.String())
		}
	})
	return slog.New(slog.NewTextHandler(lockedWriter{&mu, &buf}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type lockedWriter struct {
	mu  *sync.Mutex
	buf *bytes.Buffer
}

func (w lockedWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.buf.Write(p)
}
