package testenv

import (
	"net"
	"strconv"
	"testing"
)

// TestFreePortBelowEphemeral: the ports FreePort gives are free, distinct enough, and
// never from the range the kernel hands outgoing connections, which could take one
// before the server that asked for it binds it.
func TestFreePortBelowEphemeral(t *testing.T) {
	low, ok := ephemeralLow()
	if !ok {
		t.Skip("no /proc/sys/net/ipv4/ip_local_port_range: FreePort leaves the port to the kernel")
	}
	seen := map[int]bool{}
	for range 50 {
		p, err := FreePort()
		if err != nil {
			t.Fatal(err)
		}
		if low-minPickedPort >= 1000 && (p < minPickedPort || p >= low) {
			t.Fatalf("FreePort = %d, want a port in [%d, %d): below the ephemeral range", p, minPickedPort, low)
		}
		l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			t.Fatalf("FreePort = %d, which cannot be bound: %v", p, err)
		}
		l.Close()
		seen[p] = true
	}
	if len(seen) < 40 {
		t.Errorf("50 calls of FreePort gave %d distinct ports: drawn at random, they should seldom repeat", len(seen))
	}
}
