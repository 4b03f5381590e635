package workerid

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// InmemWorkers is a set of worker IDs kept in memory, for tests only: nothing outlives
// the process. Each node asks through a Registry of its own (Registry(node)) and keeps
// its worker ID for good, as in Leaf's ZooKeeper layout: it gets the same ID back when it
// asks again, distinct nodes get distinct IDs, ErrNoWorkerID once the range is used up,
// and a Lease reports the highest timestamp ever recorded for its ID. It is the reference
// that TestRegistryConformance holds every real registry to. Safe for concurrent use.
type InmemWorkers struct {
	max int64

	mu       sync.Mutex
	ids      map[string]int64 // node -> its worker ID
	recorded map[int64]int64  // worker ID -> highest timestamp recorded
}

// NewInmemWorkers returns the worker IDs 0..max, none handed out.
func NewInmemWorkers(max int64) *InmemWorkers {
	return &InmemWorkers{max: max, ids: map[string]int64{}, recorded: map[int64]int64{}}
}

// Registry is node's registry over these worker IDs.
func (w *InmemWorkers) Registry(node string) Registry { return inmemRegistry{w: w, node: node} }

type inmemRegistry struct {
	w    *InmemWorkers
	node string
}

var (
	_ Registry   = inmemRegistry{}
	_ Identifier = inmemRegistry{}
)

func (r inmemRegistry) Identity() string { return fmt.Sprintf("inmem %p", r.w) }

func (r inmemRegistry) Acquire(ctx context.Context) (Lease, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	w := r.w
	w.mu.Lock()
	defer w.mu.Unlock()
	id, ok := w.ids[r.node]
	if !ok {
		id = int64(len(w.ids))
		if id > w.max {
			return nil, fmt.Errorf("%w: all %d worker IDs are held", ErrNoWorkerID, w.max+1)
		}
		w.ids[r.node] = id
	}
	return &inmemLease{w: w, id: id, recorded: w.recorded[id]}, nil
}

// inmemLease is permanent: Renew and Release record ts, never lower.
type inmemLease struct {
	w        *InmemWorkers
	id       int64
	recorded int64
}

func (l *inmemLease) WorkerID() int64    { return l.id }
func (l *inmemLease) Recorded() int64    { return l.recorded }
func (l *inmemLease) TTL() time.Duration { return 0 }

func (l *inmemLease) Renew(ctx context.Context, ts int64) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	l.w.mu.Lock()
	defer l.w.mu.Unlock()
	l.w.recorded[l.id] = max(l.w.recorded[l.id], ts)
	return nil
}

func (l *inmemLease) Release(ctx context.Context, ts int64) error { return l.Renew(ctx, ts) }
