package segment

import (
	"context"
	"fmt"
	"runtime"
	"testing"
	"time"
)

// benchGenerator runs a generator over an in-memory store holding tags, with steps
// large enough that loads are rare; it discards logs.
func benchGenerator(b *testing.B, tags ...string) *Generator {
	b.Helper()
	store := NewInmemStore()
	for _, name := range tags {
		mustAdd(b, store, Tag{Name: name, Step: MaxStoredStep})
	}
	cfg := DefaultConfig()
	cfg.Store = store
	cfg.MaxStep = MaxStoredStep
	g, _ := startGenerator(b, cfg)
	for _, name := range tags {
		fill(b, g, name, 1)
	}
	return g
}

// tryFill is what a caller does: TryFill, and Fill when the IDs are not in memory.
func tryFill(b *testing.B, g *Generator, tag string, dst []int64) {
	if ok, err := g.TryFill(tag, dst); ok {
		return
	} else if err != nil {
		b.Fatalf("TryFill: %v", err)
	}
	if err := g.Fill(context.Background(), tag, dst); err != nil {
		b.Fatalf("Fill: %v", err)
	}
}

func BenchmarkTryFill1(b *testing.B) {
	g := benchGenerator(b, "orders")
	dst := make([]int64, 1)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		tryFill(b, g, "orders", dst)
	}
}

func BenchmarkTryFill1000(b *testing.B) {
	g := benchGenerator(b, "orders")
	dst := make([]int64, 1000)
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		tryFill(b, g, "orders", dst)
	}
}

// BenchmarkTryFillParallel: every goroutine on one tag (one contended add).
func BenchmarkTryFillParallel(b *testing.B) {
	g := benchGenerator(b, "orders")
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		dst := make([]int64, 1)
		for pb.Next() {
			tryFill(b, g, "orders", dst)
		}
	})
}

// BenchmarkTryFillParallelTags: goroutines spread over 64 tags.
func BenchmarkTryFillParallelTags(b *testing.B) {
	var tags []string
	for i := range 64 {
		tags = append(tags, fmt.Sprintf("tag%02d", i))
	}
	g := benchGenerator(b, tags...)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		dst := make([]int64, 1)
		i := 0
		for pb.Next() {
			tryFill(b, g, tags[i%len(tags)], dst)
			i++
		}
	})
}

// BenchmarkResidentTags measures the heap a tag costs: after the tag list load (a
// buffer) and after the first request (plus its current segment). The store's own rows
// are excluded.
func BenchmarkResidentTags(b *testing.B) {
	const n = 10_000
	b.ReportAllocs()
	// Each iteration builds everything anew (ns/op is the cost of listing and first
	// loading 10,000 tags); the timer runs throughout, or b.Loop would never end.
	for b.Loop() {
		store := NewInmemStore()
		names := make([]string, n)
		for i := range names {
			names[i] = fmt.Sprintf("tag-%05d", i)
			mustAdd(b, store, Tag{Name: names[i], Step: 1000})
		}
		// The names are shared with the store, so they are not counted below; a real
		// store returns fresh strings, about 16 more bytes a tag.
		heap := func() uint64 {
			runtime.GC()
			var ms runtime.MemStats
			runtime.ReadMemStats(&ms)
			return ms.HeapAlloc
		}
		before := heap()
		cfg := DefaultConfig()
		cfg.Store = store
		cfg.RefreshInterval = time.Hour
		g, stop := startGenerator(b, cfg)
		listed := heap()
		dst := make([]int64, 1)
		for _, name := range names {
			tryFill(b, g, name, dst)
		}
		loaded := heap()
		b.ReportMetric(float64(listed-before)/n, "B/tag-listed")
		b.ReportMetric(float64(loaded-before)/n, "B/tag-loaded")
		stop()
	}
}
