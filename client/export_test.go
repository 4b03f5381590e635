package client

import "time"

// ProcessCPU is processCPU for the benchmarks of package client_test.
func ProcessCPU() time.Duration { return processCPU() }
