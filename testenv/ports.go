package testenv

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
)

// FreePort picks a loopback port that nothing listens on right now, for a server a test
// starts later, and outside the kernel's ephemeral range (net.ipv4.ip_local_port_range).
// The kernel takes the local port of every outgoing connection, and of every listener on
// port 0, from that range, so a port from it released for a server to bind later can be
// taken in between by any connection the machine opens (a MySQL or NATS client of a test
// running beside): deploy's cluster test once lost its monitoring port so. Below the
// range a port is only ever taken by an explicit bind; the ports are drawn at random, so
// that test binaries running side by side seldom draw the same one, and checked free.
// Where the range cannot be read, or leaves too little room below it, the port is the
// kernel's choice.
func FreePort() (int, error) {
	if low, ok := ephemeralLow(); ok && low-minPickedPort >= 1000 {
		for range 100 {
			p := minPickedPort + rand.IntN(low-minPickedPort)
			l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
			if err != nil {
				continue // taken
			}
			l.Close()
			return p, nil
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("reserve a loopback port: %w", err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

// minPickedPort is the lowest port FreePort draws: below it are the well-known and the
// commonly configured ports of services a machine may run.
const minPickedPort = 10000

// ephemeralLow is the lowest port of the kernel's ephemeral range (Linux only).
func ephemeralLow() (int, bool) {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 0, false
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return 0, false
	}
	low, err := strconv.Atoi(f[0])
	return low, err == nil
}
