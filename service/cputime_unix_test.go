//go:build unix

package service

import (
	"syscall"
	"time"
)

// processCPU is the CPU time (user and system) this process has used, every thread.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
