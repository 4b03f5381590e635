package wire

import (
	"math"
	"strconv"
	"testing"
)

// BenchmarkAppendIDs measures reply encoding per ID: consecutive IDs, as a segment batch
// gives, and spread ones, as snowflake IDs are.
func BenchmarkAppendIDs(b *testing.B) {
	const n = 1000
	consecutive := make([]int64, n)
	spread := make([]int64, n)
	for i := range n {
		consecutive[i] = 1_000_000_000 + int64(i)
		spread[i] = 1_860_000_000_000_000_000 + int64(i)*4_194_304 + int64(i%7)
	}
	for _, bc := range []struct {
		name string
		ids  []int64
		enc  Encoding
	}{
		{"text/consecutive", consecutive, Text},
		{"text/snowflake", spread, Text},
		{"binary", consecutive, Binary},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			buf := make([]byte, 0, 20*n)
			for b.Loop() {
				buf = AppendIDs(buf[:0], bc.ids, bc.enc)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/ID")
		})
	}
}

// TestAppendIDsTextMatchesFormatting checks the in-place increment of consecutive runs
// against formatting every ID, across carries (9 to 10, 999 to 1000), long runs, runs
// broken by gaps, and the largest IDs.
func TestAppendIDsTextMatchesFormatting(t *testing.T) {
	run := func(from int64, n int) []int64 {
		ids := make([]int64, n)
		for i := range ids {
			ids[i] = from + int64(i)
		}
		return ids
	}
	cases := map[string][]int64{
		"one":          {7},
		"carry 9":      run(1, 25),
		"carry 999":    run(990, 30),
		"carry 99999":  run(99_990, 20),
		"gaps":         {1, 2, 3, 10, 11, 99, 100, 101, 1000, 5000, 5001},
		"largest":      run(math.MaxInt64-20, 21),
		"19 digits":    run(999_999_999_999_999_990, 20),
		"snowflake":    {1860000000000000000, 1860000000004194304, 1860000000004194305, 1860000000008388608},
		"run then gap": append(run(8, 5), 20, 21, 22, 40),
	}
	for name, ids := range cases {
		var want []byte
		for i, id := range ids {
			if i > 0 {
				want = append(want, '\n')
			}
			want = strconv.AppendInt(want, id, 10)
		}
		if got := AppendIDs([]byte("x"), ids, Text); string(got) != "x"+string(want) {
			t.Errorf("%s: AppendIDs = %q, want %q", name, got, "x"+string(want))
		}
	}
}
