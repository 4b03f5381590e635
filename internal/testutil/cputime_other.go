//go:build !unix

package testutil

import "time"

// ProcessCPU is unknown here (0); benchmarks then leave out their CPU metric.
func ProcessCPU() time.Duration { return 0 }
