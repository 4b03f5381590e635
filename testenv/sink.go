package testenv

import (
	"bufio"
	"io"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"
)

// Sink subscribes to subject on the server at natsURL over a plain TCP connection
// speaking the NATS protocol, and reads and drops whatever comes, allocating nothing
// per message, until the test ends. It is for tests that count allocations
// (testing.AllocsPerRun counts the whole process's): a request to a subject nobody
// subscribes draws the server's no-responders reply, and an in-process nats.go
// subscriber allocates per message.
func Sink(tb testing.TB, natsURL, subject string) {
	tb.Helper()
	u, err := url.Parse(natsURL)
	if err != nil {
		tb.Fatalf("testenv: sink %s: %v", subject, err)
	}
	conn, err := net.Dial("tcp", u.Host)
	if err != nil {
		tb.Fatalf("testenv: sink %s: %v", subject, err)
	}
	fail := func(format string, args ...any) {
		conn.Close()
		tb.Fatalf(format, args...)
	}
	if _, err := io.WriteString(conn, "CONNECT {\"verbose\":false,\"pedantic\":false}\r\nSUB "+subject+" 1\r\nPING\r\n"); err != nil {
		fail("testenv: sink %s: %v", subject, err)
	}
	r := bufio.NewReader(conn)
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second)) // a server that never answers fails the test, not hangs it
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			fail("testenv: sink %s: no PONG: %v", subject, err)
		}
		if strings.HasPrefix(line, "PONG") {
			break
		}
	}
	_ = conn.SetReadDeadline(time.Time{})
	done := make(chan struct{})
	go func() { // ends when the cleanup closes the connection
		defer close(done)
		buf := make([]byte, 64<<10)
		for {
			if _, err := r.Read(buf); err != nil {
				return
			}
		}
	}()
	tb.Cleanup(func() {
		conn.Close()
		<-done
	})
}
