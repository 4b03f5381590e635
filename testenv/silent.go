package testenv

import (
	"net"
	"testing"
)

// SilentTCP listens on a random loopback port, accepts every connection and never
// writes a byte: a server that hangs instead of refusing (a frozen MySQL, something
// else on its port). It returns the address and closes everything at cleanup.
func SilentTCP(tb testing.TB) string {
	tb.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatalf("testenv: silent listener: %v", err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		var conns []net.Conn
		for {
			c, err := l.Accept()
			if err != nil {
				for _, c := range conns {
					c.Close()
				}
				return
			}
			conns = append(conns, c)
		}
	}()
	tb.Cleanup(func() {
		l.Close()
		<-done
	})
	return l.Addr().String()
}
