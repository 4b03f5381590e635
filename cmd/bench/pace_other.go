//go:build !linux

package main

import "time"

// preciseSleep falls back to the Go timer where nanosleep is not wired up; the
// report's sender lag shows what that costs.
func preciseSleep(d time.Duration) { time.Sleep(d) }
