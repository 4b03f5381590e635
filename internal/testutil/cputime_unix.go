//go:build unix

package testutil

import (
	"syscall"
	"time"
)

// ProcessCPU is the CPU time (user and system) this process has used, every thread:
// benchmarks report it per operation, which moves less than wall time on a shared host.
func ProcessCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
