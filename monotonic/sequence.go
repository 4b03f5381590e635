package monotonic

import (
	"errors"
	"fmt"
	"sync"

	"github.com/leafbus/leafbus/segment"
	"github.com/leafbus/leafbus/wire"
)

// errTermEnded is returned by a sequence whose term is over: its IDs are never served
// again, whatever is left of them.
var errTermEnded = fmt.Errorf("%w: monotonic: this dispenser's lease on the tag ended", wire.ErrUnavailable)

// sequence is what a leader serves one tag from during one term: the current segment
// and at most one segment fetched ahead, handed out strictly in order under one lock.
// Unlike a segment buffer it never holds a range below one it has already served, so
// IDs taken later are always higher.
type sequence struct {
	mu      sync.Mutex
	next    int64          // the next ID of the current segment
	end     int64          // the current segment's exclusive end; next == end: spent
	ahead   *segment.Range // fetched ahead, above the current segment
	floor   int64          // the end of the last range installed: a new one must start there or above
	last    int64          // the highest ID handed out; 0: none
	closed  bool
	err     error         // why the last load failed; nil after a success
	changed chan struct{} // closed at each install, failure and close; made when someone waits
	wake    chan struct{} // one token: the range fetched ahead was switched to
}

func newSequence() *sequence { return &sequence{wake: make(chan struct{}, 1)} }

// take fills dst from its start with the next IDs in order and returns how many it
// filled. With all, it fills nothing unless all of dst is in memory. When it filled
// less than dst (and not all), wait is closed at the next install; err is final for
// this sequence (the term ended, or the tag is gone from the store).
func (s *sequence) take(dst []int64, all bool) (n int, wait <-chan struct{}, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return 0, nil, errTermEnded
	}
	if all {
		have := s.end - s.next
		if s.ahead != nil {
			have += s.ahead.End - s.ahead.First
		}
		if have < int64(len(dst)) {
			return 0, nil, nil
		}
	}
	for n < len(dst) {
		if s.next == s.end {
			if s.ahead == nil {
				break
			}
			s.next, s.end, s.ahead = s.ahead.First, s.ahead.End, nil
			select {
			case s.wake <- struct{}{}:
			default:
			}
			continue
		}
		k := min(int64(len(dst)-n), s.end-s.next)
		for i := range k {
			dst[n+int(i)] = s.next + i
		}
		s.next += k
		s.last = s.next - 1
		n += int(k)
	}
	if n == len(dst) || all {
		return n, nil, nil
	}
	if s.err != nil && final(s.err) {
		return n, nil, s.err
	}
	if s.changed == nil {
		s.changed = make(chan struct{})
	}
	return n, s.changed, nil
}

// final reports whether a load error will not go away by waiting a moment.
func final(err error) bool {
	return errors.Is(err, segment.ErrTagNotFound) || errors.Is(err, segment.ErrInvalidTag) || errors.Is(err, segment.ErrStoreWentBack)
}

// wantsLoad reports whether the loader should fetch: nothing is fetched ahead.
func (s *sequence) wantsLoad() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ahead == nil && !s.closed
}

// install adds r as the current segment (when it is spent) or the one ahead, if still
// valid() says the term holds its lease; it reports whether r was installed. A range
// below the last one is refused with an error: serving it would go backwards.
func (s *sequence) install(r segment.Range, valid func() bool) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed || !valid() {
		return false, nil
	}
	if r.First < s.floor || r.End < r.First || s.ahead != nil {
		return false, fmt.Errorf("monotonic: segment [%d, %d) does not follow the last one (ending at %d, one ahead: %v)", r.First, r.End, s.floor, s.ahead != nil)
	}
	s.floor = r.End
	if s.next == s.end {
		s.next, s.end = r.First, r.End
	} else {
		s.ahead = &r
	}
	s.err = nil
	s.signal()
	return true, nil
}

// failed records why a load failed, for the requests that wait.
func (s *sequence) failed(err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.err = err
	s.signal()
}

// close ends the sequence: nothing is taken from it or installed in it again.
func (s *sequence) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.closed = true
	s.signal()
}

// highest is the highest ID handed out, or 0.
func (s *sequence) highest() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.last
}

// lastErr is why the last load failed, or nil.
func (s *sequence) lastErr() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.err
}

func (s *sequence) signal() {
	if s.changed != nil {
		close(s.changed)
		s.changed = nil
	}
}
