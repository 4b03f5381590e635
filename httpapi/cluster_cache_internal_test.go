package httpapi

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"
)

// TestClusterCache: page loads within clusterFresh of a discovery take its result, and
// a load that comes while one runs waits for it rather than asking again.
func TestClusterCache(t *testing.T) {
	var c clusterCache
	var mu sync.Mutex
	calls := 0
	release := make(chan struct{})
	fetch := func(ctx context.Context) ([]Peer, error) {
		mu.Lock()
		calls++
		n := calls
		mu.Unlock()
		if n == 1 {
			<-release
		}
		return []Peer{{NodeID: "d1", WorkerID: int64(n)}}, nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	first := make(chan []Peer, 1)
	go func() {
		p, _ := c.get(ctx, fetch, time.Millisecond)
		first <- p
	}()
	// The first fetch is under way once c.loading is set.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
		c.mu.Lock()
		loading := c.loading != nil
		c.mu.Unlock()
		if loading {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the first fetch did not start within 10s")
		}
	}
	second := make(chan []Peer, 1)
	go func() {
		p, _ := c.get(ctx, fetch, 2*time.Millisecond)
		second <- p
	}()
	close(release)
	for name, ch := range map[string]chan []Peer{"first": first, "second": second} {
		select {
		case p := <-ch:
			if len(p) != 1 || p[0].WorkerID != 1 {
				t.Errorf("%s load got %+v, want the one fetch's result", name, p)
			}
		case <-ctx.Done():
			t.Fatalf("%s load: no result within 10s", name)
		}
	}
	if p, _ := c.get(ctx, fetch, clusterFresh); p[0].WorkerID != 1 || calls != 1 {
		t.Errorf("a load within clusterFresh: %+v after %d fetches, want the first result and 1 fetch", p, calls)
	}
	if p, _ := c.get(ctx, fetch, clusterFresh+2*time.Millisecond); p[0].WorkerID != 2 || calls != 2 {
		t.Errorf("a load after clusterFresh: %+v after %d fetches, want a new one", p, calls)
	}
	ended, stop := context.WithCancel(context.Background())
	stop()
	c.loading = make(chan struct{})
	if _, err := c.get(ended, fetch, time.Hour); !errors.Is(err, context.Canceled) {
		t.Errorf("a load whose context ended while another fetched: %v, want context.Canceled", err)
	}
}
