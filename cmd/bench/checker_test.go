package main

import (
	"math/rand/v2"
	"os"
	"slices"
	"testing"
)

// uniqueIDs returns n distinct random positive IDs in random order.
func uniqueIDs(tb testing.TB, rng *rand.Rand, n int) []int64 {
	tb.Helper()
	seen := make(map[int64]bool, n)
	out := make([]int64, 0, n)
	for len(out) < n {
		v := rng.Int64N(1<<63-1) + 1
		if !seen[v] {
			seen[v] = true
			out = append(out, v)
		}
	}
	return out
}

func TestChecker(t *testing.T) {
	type plant struct {
		col  int  // collector that receives the repeat
		id   int  // index into the unique IDs of the value repeated
		more int  // extra receipts
		self bool // repeated inside the same collector that got the original
	}
	tests := []struct {
		name      string
		spill     bool
		memIDs    int
		fanIn     int
		unique    int
		plants    []plant
		wantDups  int64
		wantRuns  bool
		wantNames int
	}{
		{"InMemoryNoDuplicates", false, 0, 64, 20000, nil, 0, false, 0},
		{"InMemoryAcrossClients", false, 0, 64, 20000, []plant{{col: 2, id: 5, more: 1}}, 1, false, 1},
		{"InMemorySameClient", false, 0, 64, 20000, []plant{{col: 0, id: 9, more: 1, self: true}}, 1, false, 1},
		{"InMemoryTriple", false, 0, 64, 20000, []plant{{col: 1, id: 7, more: 2}}, 2, false, 1},
		{"SpillNoDuplicates", true, 4 * 1024, 64, 20000, nil, 0, true, 0},
		{"SpillPlanted", true, 4 * 1024, 64, 20000,
			[]plant{{col: 3, id: 1, more: 1}, {col: 0, id: 19999, more: 1, self: true}, {col: 2, id: 500, more: 3}}, 5, true, 3},
		// A fan-in of 2 forces merges of merges before the final pass.
		{"SpillMultiLevel", true, 4 * 1024, 2, 30000, []plant{{col: 1, id: 12345, more: 1}}, 1, true, 1},
	}
	const clients = 4
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rng := rand.New(rand.NewPCG(7, uint64(len(tt.name))))
			root := ""
			if tt.spill {
				root = t.TempDir()
			}
			c, err := newChecker(root, tt.memIDs, clients)
			if err != nil {
				t.Fatalf("newChecker: %v", err)
			}
			c.fanIn = tt.fanIn
			cols := make([]*collector, clients)
			for i := range cols {
				cols[i] = c.collector()
			}
			ids := uniqueIDs(t, rng, tt.unique)
			owner := make([]int, len(ids))
			for i, id := range ids {
				owner[i] = i % clients
				cols[owner[i]].add([]int64{id})
			}
			var want []int64
			for _, p := range tt.plants {
				col := p.col
				if p.self {
					col = owner[p.id]
				}
				for range p.more {
					cols[col].add([]int64{ids[p.id]})
				}
				want = append(want, ids[p.id])
			}
			slices.Sort(want)
			res, err := c.finish(cols)
			if err != nil {
				t.Fatalf("finish: %v", err)
			}
			if res.Duplicates != tt.wantDups || !slices.Equal(res.Samples, want) {
				t.Errorf("finish: %d duplicates %v, want %d %v", res.Duplicates, res.Samples, tt.wantDups, want)
			}
			if wantIDs := int64(tt.unique) + tt.wantDups; res.IDs != wantIDs {
				t.Errorf("finish: counted %d IDs, want %d", res.IDs, wantIDs)
			}
			if (res.Runs > 0) != tt.wantRuns {
				t.Errorf("finish: %d runs spilled, want spilling %v", res.Runs, tt.wantRuns)
			}
			if err := c.close(); err != nil {
				t.Fatalf("close: %v", err)
			}
			if tt.spill {
				if _, err := os.Stat(c.dir); !os.IsNotExist(err) {
					t.Errorf("spill directory %s still there after close (stat: %v)", c.dir, err)
				}
			}
		})
	}
}

func TestCheckerSamplesAreCapped(t *testing.T) {
	c, err := newChecker("", 0, 1)
	if err != nil {
		t.Fatalf("newChecker: %v", err)
	}
	col := c.collector()
	for id := int64(1); id <= 50; id++ {
		col.add([]int64{id, id})
	}
	res, err := c.finish([]*collector{col})
	if err != nil {
		t.Fatalf("finish: %v", err)
	}
	if res.Duplicates != 50 || len(res.Samples) != maxDuplicateSamples {
		t.Fatalf("finish: %d duplicates, %d samples; want 50 and %d", res.Duplicates, len(res.Samples), maxDuplicateSamples)
	}
}

func BenchmarkCollectorAdd(b *testing.B) {
	b.ReportAllocs()
	c, err := newChecker(b.TempDir(), 1<<16, 1)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { c.close() })
	col := c.collector()
	batch := make([]int64, 100)
	var next int64
	for b.Loop() {
		for i := range batch {
			next++
			batch[i] = next
		}
		col.add(batch)
	}
}
