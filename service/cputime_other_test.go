//go:build !unix

package service

import "time"

// processCPU is unknown here; benchmarks then leave out their CPU metric.
func processCPU() time.Duration { return 0 }
