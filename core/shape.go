package core

import (
	"context"
	"errors"
	"fmt"
	"math/bits"
	"slices"
	"sync"

	"github.com/leafbus/leafbus/opaque"
	"github.com/leafbus/leafbus/wire"
)

// Ranges gives each segment tag's range (package monotonic's Manager keeps them beside
// the monotonic marks). TagRange is asked for every segment reply, so it must cost no
// more than a map lookup; it fails (a 503, or a 400) for a tag that must not be served
// now.
type Ranges interface {
	TagRange(tag string) (wire.TagRange, error)
}

// ErrNoKey is the refusal (a 503) of an opaque tag by a dispenser that has no ID key.
var ErrNoKey = fmt.Errorf("%w: no ID key", wire.ErrUnavailable)

// ErrOtherKey is the refusal (a 503) of an opaque tag whose key is not this
// dispenser's: with two keys, two segment numbers could have one image.
var ErrOtherKey = fmt.Errorf("%w: another ID key", wire.ErrUnavailable)

// Shaper gives segment IDs the range of their tag (PROTOCOL.md "Opaque tags and
// widths"), once, for every face and for the pools, which pre-fill replies: a tag
// narrower than 63 bits is refused once its numbers leave the range (never wrapped),
// and an opaque tag's numbers are replaced by their images under the tag's keyed
// permutation (package opaque), sorted, so that a reply's IDs still strictly increase.
// It is safe for concurrent use.
type Shaper struct {
	ranges Ranges
	key    []byte // nil: this dispenser has no ID key
	fp     string // opaque.Fingerprint(key), "" without one

	perms   sync.Map  // permKey -> *opaque.Permutation, built once per tag and width
	scratch sync.Pool // *sortScratch, for spreadSort
}

type permKey struct {
	tag  string
	bits int
}

// NewShaper returns the Shaper of ranges, with the deployment's ID key (nil: none, and
// opaque tags are refused). The key is kept only to key the permutations; it is never
// written anywhere, and only its fingerprint is shown.
func NewShaper(ranges Ranges, key []byte) (*Shaper, error) {
	if ranges == nil {
		return nil, errors.New("core: a Shaper needs the tags' ranges")
	}
	s := &Shaper{ranges: ranges}
	if key != nil {
		if len(key) < opaque.MinKeyBytes {
			return nil, fmt.Errorf("ID key of %d bytes: want at least %d", len(key), opaque.MinKeyBytes)
		}
		s.key, s.fp = slices.Clone(key), opaque.Fingerprint(key)
	}
	return s, nil
}

// Fingerprint names this dispenser's ID key ("" without one): what an opaque tag it
// adds records.
func (s *Shaper) Fingerprint() string { return s.fp }

// Range returns tag's range, and for an opaque tag the permutation to serve it with,
// or why this dispenser must not serve the tag.
func (s *Shaper) Range(tag string) (wire.TagRange, *opaque.Permutation, error) {
	r, err := s.ranges.TagRange(tag)
	if err != nil || !r.Opaque {
		return r, nil, err
	}
	switch {
	case s.key == nil:
		return r, nil, fmt.Errorf("%w: tag %q is opaque, and this dispenser has no ID key: start it with the deployment's key (--id-key-file, or LEAFBUS_ID_KEY)", ErrNoKey, tag)
	case r.Key != s.fp:
		return r, nil, fmt.Errorf("%w: tag %q is opaque under the ID key %s, this dispenser's is %s: start it with the deployment's key, --id-key-file (docs/errors.md#id-key)",
			ErrOtherKey, tag, r.Key, s.fp)
	}
	k := permKey{tag, r.Width()}
	if p, ok := s.perms.Load(k); ok {
		return r, p.(*opaque.Permutation), nil
	}
	p, err := opaque.New(s.key, tag, r.Width())
	if err != nil {
		return r, nil, fmt.Errorf("tag %q: %w", tag, err)
	}
	actual, _ := s.perms.LoadOrStore(k, p)
	return r, actual.(*opaque.Permutation), nil
}

// Shape gives ids, the segment numbers of one reply of tag (strictly increasing, as a
// segment source fills them), the tag's range, in place: unchanged for a tag of the
// default range; an error wrapping wire.ErrRangeUsedUp when a number lies beyond a
// narrower range; the images of the numbers, sorted (spreadSort), for an opaque tag. On
// an error ids hold nothing to hand out (their numbers are a gap, never handed out
// later).
func (s *Shaper) Shape(tag string, ids []int64) error {
	if len(ids) == 0 {
		return nil
	}
	r, p, err := s.Range(tag)
	if err != nil || r.IsDefault() {
		return err
	}
	top := slices.Max(ids)
	if top > r.Max() {
		return fmt.Errorf("%w: tag %q is %d bits wide and its numbers have reached %d, beyond its largest ID %d: its IDs are never wrapped or widened past it; give them a new tag",
			wire.ErrRangeUsedUp, tag, r.Width(), top, r.Max())
	}
	if p == nil {
		return nil
	}
	if err := p.PermuteAll(ids); err != nil {
		return fmt.Errorf("tag %q: %w", tag, err)
	}
	s.sort(ids, r.Width())
	return nil
}

// sortScratch is spreadSort's memory, reused across replies.
type sortScratch struct {
	tmp    []int64
	counts []int32
}

// spreadBelow: replies shorter than this are sorted with slices.Sort.
const spreadBelow = 64

// sort sorts images of width bits. An opaque tag's images are spread evenly over the
// range (they are a pseudo-random permutation's), so a spread sort, a bucket per ID by
// its upper bits and then an insertion sort of what is nearly in order, takes a few
// passes over the reply: about a tenth of a comparison sort's cost at 1000 IDs.
func (s *Shaper) sort(ids []int64, width int) {
	if len(ids) < spreadBelow {
		slices.Sort(ids)
		return
	}
	sc, _ := s.scratch.Get().(*sortScratch)
	if sc == nil {
		sc = &sortScratch{}
	}
	spreadSort(ids, sc, uint(width))
	s.scratch.Put(sc)
}

// spreadSort sorts ids, each below 2^width, with sc's memory (grown as needed): a
// counting pass over their upper bits (about one bucket per ID), a scatter in bucket
// order, then an insertion sort, which moves an ID only past the few that share its
// bucket. Any input is sorted; only the cost depends on the spread.
func spreadSort(ids []int64, sc *sortScratch, width uint) {
	n := len(ids)
	b := min(uint(bits.Len(uint(n))), width)
	shift := width - b
	if cap(sc.tmp) < n {
		sc.tmp = make([]int64, n)
	}
	if cap(sc.counts) < 1<<b+1 {
		sc.counts = make([]int32, 1<<b+1)
	}
	tmp, counts := sc.tmp[:n], sc.counts[:1<<b+1]
	clear(counts)
	for _, v := range ids {
		counts[v>>shift+1]++
	}
	for i := 1; i < len(counts); i++ {
		counts[i] += counts[i-1]
	}
	for _, v := range ids {
		k := v >> shift
		tmp[counts[k]] = v
		counts[k]++
	}
	for i := 1; i < n; i++ {
		v, j := tmp[i], i
		for j > 0 && tmp[j-1] > v {
			tmp[j] = tmp[j-1]
			j--
		}
		tmp[j] = v
	}
	copy(ids, tmp)
}

// SegmentFiller is what the pools take segment IDs from (Ordinary's source and itself).
type SegmentFiller interface {
	Fill(ctx context.Context, tag string, dst []int64) error
}
