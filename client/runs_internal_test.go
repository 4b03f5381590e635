package client

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"testing"
)

// Batch shapes a source can give, so that tests cover every way IDs map to runs.
const (
	shapeOneRun    = iota // the whole batch consecutive: one run
	shapeRunsOfOne        // a gap after every ID: as many runs as IDs
	shapeMixed            // runs of 1 to 12 IDs with gaps of 1 to 4 between them
	shapeEdges            // gaps right after the first ID and right before the last
	shapes
)

// source is a fetch that hands out increasing IDs in batches of a given shape (or
// rotating through all of them) and records every batch, so that a test knows the
// exact set fetched, gaps included.
type source struct {
	shape int // one of the shapes, or -1 to rotate through them batch by batch

	mu      sync.Mutex
	last    int64     // the last ID handed out
	rng     uint64    // xorshift state, for shapeMixed
	batches [][]int64 // every batch fetched, in order
}

func newSource(shape int) *source { return &source{shape: shape, rng: 88172645463325252} }

func (s *source) fetch(_ context.Context, dst []int64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	shape := s.shape
	if shape < 0 {
		shape = len(s.batches) % shapes
	}
	runLeft := int64(0)
	for i := range dst {
		gap := int64(0) // IDs skipped before this one
		switch shape {
		case shapeRunsOfOne:
			gap = 1
		case shapeMixed:
			if runLeft == 0 {
				gap, runLeft = int64(s.rand()%4+1), int64(s.rand()%12+1)
			}
			runLeft--
		case shapeEdges:
			if i == 1 || (i == len(dst)-1 && i > 1) {
				gap = 3
			}
		}
		s.last += 1 + gap
		dst[i] = s.last
	}
	s.batches = append(s.batches, slices.Clone(dst))
	return nil
}

func (s *source) rand() uint64 {
	s.rng ^= s.rng << 13
	s.rng ^= s.rng >> 7
	s.rng ^= s.rng << 17
	return s.rng
}

// fetched is every batch fetched so far.
func (s *source) fetched() [][]int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.batches)
}

// sources are the sources the concurrency tests run against: consecutive IDs (one run
// a batch, the common case) and IDs with gaps in every shape.
var sourceShapes = []struct {
	name  string
	shape int
}{
	{"OneRun", shapeOneRun},
	{"RunsOfOne", shapeRunsOfOne},
	{"Rotating", -1},
}

// checkExactlyFetched fails unless ids are exactly the IDs of batches, each once, or
// all but the last batch's (dropped if the fetcher was stopped after fetching it).
func checkExactlyFetched(t *testing.T, ids []int64, batches [][]int64) {
	t.Helper()
	want := map[int64]bool{}
	for _, batch := range batches {
		for _, id := range batch {
			want[id] = true
		}
	}
	seen := make(map[int64]bool, len(ids))
	for _, id := range ids {
		if !want[id] {
			t.Fatalf("ID %d: not among the %d fetched", id, len(want))
		}
		if seen[id] {
			t.Fatalf("ID %d handed out or held twice", id)
		}
		seen[id] = true
	}
	if len(seen) != len(want) && len(batches) > 0 {
		for _, id := range batches[len(batches)-1] {
			delete(want, id)
		}
	}
	if len(seen) != len(want) {
		t.Fatalf("%d IDs handed out or held of %d fetched (or all but the last batch)", len(seen), len(want))
	}
	for id := range want {
		if !seen[id] {
			t.Fatalf("ID %d lost: fetched, but neither handed out nor held", id)
		}
	}
}

// heldIDs is what c claimed and did not hand out yet, in order.
func heldIDs(c *Cursor) []int64 {
	var ids []int64
	for i := range c.left {
		ids = append(ids, c.id+i)
	}
	for i := c.pos; i < c.end; i++ {
		ids = append(ids, c.batch.at(i))
	}
	return ids
}

// cursorHeld is how many IDs c claimed and did not hand out yet.
func cursorHeld(c *Cursor) int { return int(c.left + c.end - c.pos) }

// idsFrom is batch c's IDs at indexes from on.
func idsFrom(c *batch, from int64) []int64 {
	var ids []int64
	for i := from; i < c.size; i++ {
		ids = append(ids, c.at(i))
	}
	return ids
}

// TestBatchRuns: a batch of any shape maps every index to the ID fetched there, and
// stretch walks any index range through exactly those IDs, run by run.
func TestBatchRuns(t *testing.T) {
	for _, n := range []int{1, 2, 3, 10, 1000} {
		for shape := range shapes {
			t.Run(fmt.Sprintf("OK/%d/shape%d", n, shape), func(t *testing.T) {
				s := newSource(shape)
				ids := make([]int64, n)
				for range 3 { // reusing ids, as the fetcher does its scratch
					if err := s.fetch(context.Background(), ids); err != nil {
						t.Fatal(err)
					}
					want := slices.Clone(ids)
					c := newBatch(ids)
					clear(ids) // the batch must not refer to the scratch
					if wantRuns := countRuns(want); (wantRuns == 1) != (c.runs == nil) || (c.runs != nil && len(c.runs) != wantRuns) {
						t.Fatalf("%d runs (nil: %v), want %d", len(c.runs), c.runs == nil, wantRuns)
					}
					if got := idsFrom(c, 0); !slices.Equal(got, want) {
						t.Fatalf("at() = %v, want %v", got, want)
					}
					for start := range int64(n) {
						for end := start + 1; end <= int64(n); end++ {
							var got []int64
							for i := start; i < end; {
								first, k := c.stretch(i, end)
								if k < 1 || i+k > end {
									t.Fatalf("stretch(%d, %d) = %d IDs", i, end, k)
								}
								for j := range k {
									got = append(got, first+j)
								}
								i += k
							}
							if !slices.Equal(got, want[start:end]) {
								t.Fatalf("stretches over %d..%d = %v, want %v", start, end, got, want[start:end])
							}
						}
						if n > 100 { // the quadratic walk only for small batches
							break
						}
					}
				}
			})
		}
	}
}

func countRuns(ids []int64) int {
	runs := 1
	for k := 1; k < len(ids); k++ {
		if ids[k] != ids[k-1]+1 {
			runs++
		}
	}
	return runs
}
