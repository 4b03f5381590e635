//go:build darwin || dragonfly || freebsd || linux || netbsd || openbsd

package fdlimit

import (
	"syscall"
	"testing"
)

// TestRaise: with the soft limit below the hard one, Raise lifts it to the hard one and
// reports both; Soft reads it back. The test restores the limit it found.
func TestRaise(t *testing.T) {
	var orig syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &orig); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Setrlimit(syscall.RLIMIT_NOFILE, &orig) })
	if orig.Max < 512 {
		t.Skipf("hard limit %d: too low to lower the soft one under it", orig.Max)
	}
	low := syscall.Rlimit{Cur: 256, Max: orig.Max}
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &low); err != nil {
		t.Fatal(err)
	}
	before, hard, soft, err := Raise()
	if err != nil || before != 256 || hard != orig.Max || soft != orig.Max {
		t.Fatalf("Raise() = %d, %d, %d, %v; want 256, %d, %d, nil", before, hard, soft, err, orig.Max, orig.Max)
	}
	if got, err := Soft(); err != nil || got != orig.Max {
		t.Fatalf("Soft() = %d, %v; want %d", got, err, orig.Max)
	}
}
