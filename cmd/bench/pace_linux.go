package main

import (
	"errors"
	"syscall"
	"time"
)

// preciseSleep sleeps d in the kernel (nanosleep), which wakes within tens of
// microseconds instead of the Go timer's millisecond. It blocks its thread; the runtime
// hands the goroutine's processor to others meanwhile. Only short waits come here.
func preciseSleep(d time.Duration) {
	ts := syscall.NsecToTimespec(int64(d))
	for {
		var left syscall.Timespec
		// The runtime's preemption signals interrupt the sleep; carry on with what is left.
		if err := syscall.Nanosleep(&ts, &left); !errors.Is(err, syscall.EINTR) {
			return
		}
		ts = left
	}
}
