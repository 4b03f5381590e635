package testenv

import (
	"bufio"
	"fmt"
	"net"
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

// StartNATSProcess builds and starts the server for tb and kills it at cleanup.
func StartNATSProcess(tb testing.TB) *NATSProcess {
	tb.Helper()
	bin := filepath.Join(tb.TempDir(), "nats-server")
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
		cmd := exec.Command(bin, "-a", "127.0.0.1", "-p", strconv.Itoa(port))
		if err := cmd.Start(); err != nil {
			tb.Fatalf("testenv: start nats-server: %v", err)
		}
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		stop := func() {
			_ = cmd.Process.Kill()
			<-exited
		}
		if last = waitForINFO(addr, exited, 10*time.Second); last == nil {
			tb.Cleanup(stop)
			return &NATSProcess{url: "nats://" + addr}
		}
		stop()
	}
	tb.Fatalf("testenv: nats-server not ready: %v", last)
	return nil
}

// waitForINFO waits until a server answers on addr with its INFO line, the process
// exits, or d passes.
func waitForINFO(addr string, exited <-chan error, d time.Duration) error {
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
		case werr := <-exited:
			return fmt.Errorf("it exited (%v)", werr)
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("within %v: %w", d, err)
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
