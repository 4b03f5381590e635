package testenv

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

// NATSProcess is a nats-server in a process of its own: the module's nats-server
// command, built for the test, on a random loopback port, without JetStream. It is for
// tests that count allocations: testing.AllocsPerRun counts the whole process's, and
// an embedded server allocates on its own goroutines as it routes each message, which
// a loaded machine schedules in the middle of the measurement.
type NATSProcess struct {
	url string
}

// StartNATSProcess builds and starts the server for tb and kills it at cleanup. It is
// started as testenv starts MariaDB and ZooKeeper (startProc: killed with the test
// binary, its output in a log whose tail a failure shows).
func StartNATSProcess(tb testing.TB) *NATSProcess {
	tb.Helper()
	dir, err := newDir("nats")
	if err != nil {
		tb.Fatalf("testenv: %v", err)
	}
	tb.Cleanup(func() { os.RemoveAll(dir) })
	bin := filepath.Join(dir, "nats-server")
	if out, err := exec.Command("go", "build", "-o", bin, "github.com/nats-io/nats-server/v2").CombinedOutput(); err != nil {
		tb.Fatalf("testenv: build nats-server: %v\n%s", err, out)
	}
	var last error
	for range 5 { // the port may be taken between its pick and the server's bind
		port, err := FreePort()
		if err != nil {
			tb.Fatalf("testenv: %v", err)
		}
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
		p, err := startProc(bin, []string{"-a", "127.0.0.1", "-p", strconv.Itoa(port)}, dir, filepath.Join(dir, "nats-server.log"))
		if err != nil {
			tb.Fatalf("testenv: %v", err)
		}
		if last = waitForINFO(addr, p, 10*time.Second); last == nil {
			tb.Cleanup(func() { _ = p.kill() })
			return &NATSProcess{url: "nats://" + addr}
		}
		_ = p.kill()
		last = fmt.Errorf("%w\n%s", last, p.tail())
	}
	tb.Fatalf("testenv: nats-server not ready: %v", last)
	return nil
}

// waitForINFO waits until a server answers on addr with its INFO line, p exits, or d
// passes.
func waitForINFO(addr string, p *proc, d time.Duration) error {
	deadline := time.Now().Add(d)
	for {
		conn, err := net.DialTimeout("tcp", addr, time.Second)
		if err == nil {
			_ = conn.SetReadDeadline(time.Now().Add(time.Second))
			line, rerr := bufio.NewReader(conn).ReadString('\n')
			conn.Close()
			if rerr == nil && strings.HasPrefix(line, "INFO ") {
				return nil
			}
			err = fmt.Errorf("no INFO line from %s: %w", addr, rerr)
		}
		select {
		case <-p.done:
			return errExited
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%w within %v: %w", errNotReady, d, err)
		}
	}
}

// URL is the client URL, e.g. nats://127.0.0.1:41234.
func (p *NATSProcess) URL() string { return p.url }

// Connect returns a client connection to the server, closed at cleanup.
func (p *NATSProcess) Connect(tb testing.TB, opts ...nats.Option) *nats.Conn {
	tb.Helper()
	return connect(tb, p.url, opts...)
}
