package snowflake_test

import (
	"testing"
	"time"

	"github.com/leafbus/leafbus/snowflake"
)

// hotPath is a config on the system clock that borrows far enough ahead that the clock never
// makes a call wait: the benchmarks using it measure the lock, the clock read and the
// arithmetic alone.
func hotPath() snowflake.Config {
	return snowflake.Config{WorkerID: 1, BorrowMax: time.Hour}
}

func BenchmarkNext(b *testing.B) {
	g := newGen(b, hotPath())
	b.ReportAllocs()
	for b.Loop() {
		if _, err := g.Next(); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkNextParallel(b *testing.B) {
	g := newGen(b, hotPath())
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if _, err := g.Next(); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

func BenchmarkFill1000(b *testing.B) {
	g := newGen(b, hotPath())
	ids := make([]int64, 1000)
	b.ReportAllocs()
	for b.Loop() {
		if err := g.Fill(ids); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(ids)), "ns/id")
}

// BenchmarkSaturation calls Next as fast as it goes with BorrowMax 0 on the system clock, so
// every millisecond's sequence is spent and the generator waits for the next one. Metrics:
//   - ids/ms: IDs per elapsed millisecond (at most 4096; a random start costs 49.5 on average,
//     so at most 4046.5 with it), which must stay at or above 97% of 4096 = 3973;
//   - ids/used-ms: IDs per millisecond that got at least one ID. The two differ by the
//     milliseconds in which the goroutine did not run at all (preempted, or its virtual CPU
//     descheduled by the host: "steal" in /proc/stat), which no generator can fill without
//     issuing timestamps from the past.
func BenchmarkSaturation(b *testing.B) {
	for _, bc := range []struct {
		name  string
		dense bool
	}{{"random-start", false}, {"dense", true}} {
		b.Run(bc.name, func(b *testing.B) {
			g := newGen(b, snowflake.Config{WorkerID: 1, DenseSequence: bc.dense})
			shift := g.Layout().WorkerBits + g.Layout().SequenceBits
			var used, lastMs int64
			b.ReportAllocs()
			for b.Loop() {
				id, err := g.Next()
				if err != nil {
					b.Fatal(err)
				}
				if ms := id >> shift; ms != lastMs {
					used++
					lastMs = ms
				}
			}
			perMs := float64(b.N) / (float64(b.Elapsed()) / float64(time.Millisecond))
			b.ReportMetric(perMs, "ids/ms")
			b.ReportMetric(100*perMs/4096, "%of4096")
			b.ReportMetric(float64(b.N)/float64(used), "ids/used-ms")
		})
	}
}
