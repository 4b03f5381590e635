package client

import (
	"testing"
	"time"
)

// ReportRates is reportRates for the benchmarks of package client_test.
func ReportRates(b *testing.B, cpu time.Duration) { reportRates(b, cpu) }
