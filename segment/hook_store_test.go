package segment

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leafbus/leafbus/internal/testutil"
)

// hookStore wraps an InmemStore; a test sets a hook to make a method slow, failing or
// lying, in the way WTF Dial's mock services do. Hooks are set before the store is used;
// a hook that must change behaviour mid-test reads an atomic the test flips.
type hookStore struct {
	inner *InmemStore

	TakeFn func(ctx context.Context, tag string, step int64) (Tag, error) // nil: inner.Take
	TagsFn func(ctx context.Context) ([]Tag, error)                       // nil: inner.Tags
	TagFn  func(ctx context.Context, tag string) (Tag, error)             // nil: inner.Tag

	takes atomic.Int64 // Take calls, counted before the hook runs
}

var _ Store = (*hookStore)(nil)

func newHookStore() *hookStore { return &hookStore{inner: NewInmemStore()} }

func (s *hookStore) Take(ctx context.Context, tag string, step int64) (Tag, error) {
	s.takes.Add(1)
	if s.TakeFn != nil {
		return s.TakeFn(ctx, tag, step)
	}
	return s.inner.Take(ctx, tag, step)
}

func (s *hookStore) Tags(ctx context.Context) ([]Tag, error) {
	if s.TagsFn != nil {
		return s.TagsFn(ctx)
	}
	return s.inner.Tags(ctx)
}

func (s *hookStore) Tag(ctx context.Context, tag string) (Tag, error) {
	if s.TagFn != nil {
		return s.TagFn(ctx, tag)
	}
	return s.inner.Tag(ctx, tag)
}

func (s *hookStore) AddTag(ctx context.Context, t Tag) (Tag, error) {
	return s.inner.AddTag(ctx, t)
}

func (s *hookStore) UpdateTag(ctx context.Context, u TagUpdate) (Tag, error) {
	return s.inner.UpdateTag(ctx, u)
}

// put writes a row as a hand-edited leaf_alloc would, bypassing AddTag's checks.
func (s *InmemStore) put(t Tag) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.tags[t.Name] = t
}

// remove deletes a row, as an operator deleting it from leaf_alloc would.
func (s *InmemStore) remove(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.tags, name)
}

// mustAdd adds tags to s or fails the test.
func mustAdd(tb testing.TB, s Store, tags ...Tag) {
	tb.Helper()
	for _, t := range tags {
		if _, err := s.AddTag(context.Background(), t); err != nil {
			tb.Fatalf("AddTag(%+v): %v", t, err)
		}
	}
}

// testConfig is DefaultConfig over store with short waits and the test's log.
func testConfig(tb testing.TB, store Store) Config {
	cfg := DefaultConfig()
	cfg.Store = store
	cfg.WaitMax = 5 * time.Second
	cfg.Logger = testutil.Logger(tb)
	return cfg
}

// startGenerator runs a Generator for cfg until the test ends and waits until it is
// ready. The returned stop function ends Run and waits for it (also done at cleanup).
func startGenerator(tb testing.TB, cfg Config) (*Generator, func()) {
	tb.Helper()
	g, err := New(cfg)
	if err != nil {
		tb.Fatalf("New: %v", err)
	}
	stop := runGenerator(tb, g)
	select {
	case <-g.Ready():
	case <-time.After(10 * time.Second):
		tb.Fatalf("generator not ready within 10s: %+v", g.Stats())
	}
	return g, stop
}

// runGenerator starts g.Run and returns the function that stops it and waits.
func runGenerator(tb testing.TB, g *Generator) func() {
	tb.Helper()
	return testutil.Run(tb, "Generator.Run", g.Run)
}

// waitFor polls cond until it holds, failing the test after 10s.
func waitFor(tb testing.TB, what string, cond func() bool) {
	tb.Helper()
	testutil.Eventually(tb, 10*time.Second, what, cond)
}

// fill is Fill with a bounded context that fails the test on error.
func fill(tb testing.TB, g *Generator, tag string, n int) []int64 {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	dst := make([]int64, n)
	if err := g.Fill(ctx, tag, dst); err != nil {
		tb.Fatalf("Fill(%q, %d): %v", tag, n, err)
	}
	return dst
}

// bufferOf returns tag's resident buffer, or nil.
func (g *Generator) bufferOf(tag string) *buffer {
	return (*g.tags.Load())[tag]
}

// errBoom is what failing hooks return.
var errBoom = errors.New("boom: store unreachable")
