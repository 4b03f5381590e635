package main

import "time"

// coarseSlack is how early the open-loop sender leaves a Go timer before a slot is due.
// Go's timers sleep in the network poller, whose resolution is a millisecond: measured
// here, a 200 µs timer fires after about 1.4 ms. Since latency counts from the due
// time, that lateness would be charged to the server. The last stretch is therefore slept
// with preciseSleep, which the kernel times to tens of microseconds.
const coarseSlack = 2 * time.Millisecond

// waitUntil blocks until the phase clock (time since epoch) reads due. It returns false
// when done closes first.
func waitUntil(epoch time.Time, due time.Duration, timer *time.Timer, done <-chan struct{}) bool {
	d := due - time.Since(epoch)
	if d <= 0 {
		return true
	}
	if d > coarseSlack {
		timer.Reset(d - coarseSlack)
		select {
		case <-timer.C:
		case <-done:
			return false
		}
		d = due - time.Since(epoch)
	}
	if d > 0 {
		preciseSleep(d)
	}
	return true
}
