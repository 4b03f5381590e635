package client

import (
	"testing"
	"time"
)

// ProcessCPU is processCPU for the benchmarks of package client_test.
func ProcessCPU() time.Duration { return processCPU() }

// ReportRates is reportRates for the benchmarks of package client_test.
func ReportRates(b *testing.B, cpu time.Duration) { reportRates(b, cpu) }
