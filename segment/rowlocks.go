package segment

import (
	"context"
	"sync"
)

// rowLocks serializes the takes of one store row in a Generator. A take and its marks
// check (guard) must not interleave with another take of the same row: a segment the
// store granted first but checked second would meet the mark the later one already
// raised, and be refused as if the store had gone backwards. That false alarm refuses
// the tag until the next recheck and tells an operator to repair a store that is fine.
// One row has two takers when a monotonic tag's fresh segments (TakeSegment) are
// taken beside its buffer's loads. Keys are the tags' exact bytes: a tag is served only
// by its stored spelling (CheckSpelling), so one row is one key. A lock lives only
// while someone holds or waits for it, so 10,000 tags cost nothing between loads.
type rowLocks struct {
	mu    sync.Mutex
	locks map[string]*rowLock
}

type rowLock struct {
	held chan struct{} // one slot: full while a take of the row is under way
	refs int           // takers holding or waiting for it; guarded by rowLocks.mu
}

// lock waits until no other take of key's row is under way, or ctx ends. Call unlock
// once the take is checked and its mark recorded.
func (r *rowLocks) lock(ctx context.Context, key string) (unlock func(), err error) {
	r.mu.Lock()
	if r.locks == nil {
		r.locks = map[string]*rowLock{}
	}
	l := r.locks[key]
	if l == nil {
		l = &rowLock{held: make(chan struct{}, 1)}
		r.locks[key] = l
	}
	l.refs++
	r.mu.Unlock()
	release := func() {
		r.mu.Lock()
		if l.refs--; l.refs == 0 {
			delete(r.locks, key)
		}
		r.mu.Unlock()
	}
	select {
	case l.held <- struct{}{}:
		return func() { <-l.held; release() }, nil
	case <-ctx.Done():
		release()
		return nil, ctx.Err()
	}
}

// size is how many rows have a lock now (tests).
func (r *rowLocks) size() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.locks)
}
