//go:build darwin || dragonfly || freebsd || linux || netbsd || openbsd

// Package fdlimit reads and raises the process's limit on open files (RLIMIT_NOFILE):
// every connection, HTTP or NATS, and every open file takes one descriptor, and a
// process that runs out can neither accept a client nor write its own files. Go's os
// package already raises the soft limit to the hard one when the process starts (Go
// 1.19 and later); Raise does it explicitly and says what the limits are, so that the
// dispenser can log them and size its HTTP connection cap from them.
package fdlimit

import (
	"fmt"
	"syscall"
)

// Raise sets the soft limit to the hard one and returns the limits it found (before)
// and the soft limit now.
func Raise() (before, hard, soft uint64, err error) {
	var l syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		return 0, 0, 0, fmt.Errorf("read the open file limit: %w", err)
	}
	before, hard = l.Cur, l.Max
	if l.Cur < l.Max {
		l.Cur = l.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
			return before, hard, before, fmt.Errorf("raise the open file limit from %d to %d: %w", before, hard, err)
		}
	}
	return before, hard, l.Cur, nil
}

// Soft is the soft limit in effect: how many descriptors the process may hold open.
func Soft() (uint64, error) {
	var l syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &l); err != nil {
		return 0, fmt.Errorf("read the open file limit: %w", err)
	}
	return l.Cur, nil
}
