package durable

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
)

// TestGroupWriterGroups: many concurrent changes, each returning only once the file
// holds it, cost far fewer writes than changes, and the file ends with every change.
func TestGroupWriterGroups(t *testing.T) {
	path := filepath.Join(t.TempDir(), "values")
	var mu sync.Mutex
	var version uint64
	values := map[int]bool{}
	g := &GroupWriter{Path: path, Snapshot: func() ([]byte, uint64) {
		mu.Lock()
		defer mu.Unlock()
		return []byte(fmt.Sprint(len(values))), version
	}}
	const n = 200
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			mu.Lock()
			values[i] = true
			version++
			need := version
			mu.Unlock()
			if err := g.Commit(need); err != nil {
				t.Error(err)
				return
			}
			if g.Durable() < need {
				t.Errorf("Commit(%d) returned with version %d durable", need, g.Durable())
			}
		}()
	}
	close(start)
	wg.Wait()
	if b, err := os.ReadFile(path); err != nil || string(b) != fmt.Sprint(n) {
		t.Fatalf("file holds %q (%v), want %d", b, err, n)
	}
	if w := g.Writes(); w >= n {
		t.Fatalf("%d writes for %d changes: nothing grouped", w, n)
	} else {
		t.Logf("%d changes in %d writes", n, w)
	}
}

// TestGroupWriterFailedWrite: a failed write is the caller's error and leaves the version
// not durable, so the next Commit writes again.
func TestGroupWriterFailedWrite(t *testing.T) {
	boom := errors.New("disk full")
	fail := true
	g := &GroupWriter{Path: filepath.Join(t.TempDir(), "f"), Snapshot: func() ([]byte, uint64) { return []byte("x"), 1 }}
	g.Write = func(path string, data []byte) error {
		if fail {
			return boom
		}
		return WriteFile(path, data)
	}
	if err := g.Commit(1); !errors.Is(err, boom) {
		t.Fatalf("Commit with a failing write = %v, want %v", err, boom)
	}
	if g.Durable() != 0 {
		t.Fatalf("durable %d after a failed write, want 0", g.Durable())
	}
	fail = false
	if err := g.Commit(1); err != nil || g.Durable() != 1 || g.Writes() != 1 {
		t.Fatalf("Commit after the failure = %v, durable %d, writes %d; want nil, 1, 1", err, g.Durable(), g.Writes())
	}
}
