//go:build !(darwin || dragonfly || freebsd || linux || netbsd || openbsd)

package fdlimit

import "errors"

// errUnsupported is returned where the system has no RLIMIT_NOFILE in package syscall.
var errUnsupported = errors.New("the open file limit cannot be read on this system")

// Raise is not supported here.
func Raise() (before, hard, soft uint64, err error) { return 0, 0, 0, errUnsupported }

// Soft is not supported here.
func Soft() (uint64, error) { return 0, errUnsupported }
