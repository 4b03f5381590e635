//go:build !linux

package main

import (
	"errors"
	"time"
)

// processCPU needs /proc; elsewhere the report has no CPU figures.
func processCPU(int) (time.Duration, error) {
	return 0, errors.New("CPU per request is measured on Linux only")
}
