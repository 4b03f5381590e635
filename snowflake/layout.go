package snowflake

import (
	"fmt"
	"math"
	"time"
)

// Layout says how an ID's 63 usable bits are split and where time starts. It is a plain value:
// the generator that encodes and the code that decodes must use the same one.
type Layout struct {
	Epoch        int64 // Unix ms that timestamp 0 stands for; Leaf's default 1288834974657 (2010-11-04T01:42:54.657Z)
	TimeBits     int   // bits of milliseconds since Epoch; 41 gives about 69.7 years
	WorkerBits   int   // bits of worker ID; 10 gives workers 0 to 1023
	SequenceBits int   // bits of per-millisecond sequence; 12 gives 4096 IDs per ms per worker
}

// Decoded is an ID taken apart by [Layout.Decode].
type Decoded struct {
	ID        int64
	Timestamp int64 // Unix ms (the epoch added back)
	WorkerID  int64
	Sequence  int64
}

// leafEpoch is Leaf's (and Twitter's) epoch, 2010-11-04T01:42:54.657Z.
const leafEpoch = 1288834974657

// idBits is how many bits an ID has besides the sign bit, which stays 0.
const idBits = 63

// DefaultLayout returns Leaf's layout: epoch 1288834974657, 41 time bits, 10 worker bits,
// 12 sequence bits.
func DefaultLayout() Layout {
	return Layout{Epoch: leafEpoch, TimeBits: 41, WorkerBits: 10, SequenceBits: 12}
}

// The named layouts (--snowflake-layout). LayoutLeaf is Leaf's 1+41+10+12: 1024 worker
// IDs, 4096 IDs per millisecond per worker, until 2080 with Leaf's epoch. LayoutJS53
// keeps every ID at or below 2^53-1, which a JavaScript Number (a double) holds exactly:
// 41 time bits (69 years from the epoch, so 2080 again), 5 worker bits (32 worker IDs)
// and 7 sequence bits (128 IDs per millisecond per worker).
const (
	LayoutLeaf = "leaf"
	LayoutJS53 = "js53"
)

// NamedLayout returns the layout called name (LayoutLeaf or LayoutJS53) with Leaf's epoch.
func NamedLayout(name string) (Layout, error) {
	switch name {
	case LayoutLeaf:
		return DefaultLayout(), nil
	case LayoutJS53:
		return Layout{Epoch: leafEpoch, TimeBits: 41, WorkerBits: 5, SequenceBits: 7}, nil
	}
	return Layout{}, fmt.Errorf("%w: snowflake layout %q: want %s or %s", ErrInvalidConfig, name, LayoutLeaf, LayoutJS53)
}

// Name is the name of l's bits (LayoutLeaf, LayoutJS53), whatever its epoch, or a
// description of them ("43+8+12") for any other.
func (l Layout) Name() string {
	for _, name := range []string{LayoutLeaf, LayoutJS53} {
		if n, _ := NamedLayout(name); n.TimeBits == l.TimeBits && n.WorkerBits == l.WorkerBits && n.SequenceBits == l.SequenceBits {
			return name
		}
	}
	return fmt.Sprintf("%d+%d+%d", l.TimeBits, l.WorkerBits, l.SequenceBits)
}

// Bits is how many bits an ID of l has: 63, or fewer when the top bits stay 0 (53 for
// LayoutJS53).
func (l Layout) Bits() int { return l.TimeBits + l.WorkerBits + l.SequenceBits }

// MaxID is the largest ID l can encode, 2^Bits()-1.
func (l Layout) MaxID() int64 { return int64(1)<<l.Bits() - 1 }

// Validate reports, wrapping [ErrInvalidConfig], the first thing wrong with l: a part of
// fewer than 1 bit, parts summing to more than 63 bits (an ID must stay a positive int64;
// fewer leave the top bits 0, as LayoutJS53 does), or an epoch before 1970 or so late that
// the last encodable timestamp would not fit in an int64.
func (l Layout) Validate() error {
	for _, f := range []struct {
		name string
		bits int
	}{{"TimeBits", l.TimeBits}, {"WorkerBits", l.WorkerBits}, {"SequenceBits", l.SequenceBits}} {
		if f.bits < 1 {
			return fmt.Errorf("%w: layout %s is %d, must be at least 1", ErrInvalidConfig, f.name, f.bits)
		}
	}
	// Each part is at least 1, so a sum of at most 63 keeps each part at 61 or less and
	// no shift below overflows.
	if sum := l.Bits(); sum > idBits {
		return fmt.Errorf("%w: layout bits sum to %d (TimeBits %d + WorkerBits %d + SequenceBits %d), must be at most %d",
			ErrInvalidConfig, sum, l.TimeBits, l.WorkerBits, l.SequenceBits, idBits)
	}
	if l.Epoch < 0 {
		return fmt.Errorf("%w: layout Epoch is %d, must be at least 0 (Unix ms)", ErrInvalidConfig, l.Epoch)
	}
	if limit := math.MaxInt64 - l.timeMask(); l.Epoch > limit {
		return fmt.Errorf("%w: layout Epoch is %d, must be at most %d with %d time bits",
			ErrInvalidConfig, l.Epoch, limit, l.TimeBits)
	}
	return nil
}

// MaxWorkerID returns the largest worker ID the layout holds (1023 by default).
func (l Layout) MaxWorkerID() int64 { return 1<<l.WorkerBits - 1 }

// MaxSequence returns the largest sequence number within one millisecond (4095 by default).
func (l Layout) MaxSequence() int64 { return 1<<l.SequenceBits - 1 }

// MaxTimestamp returns the last Unix ms the layout can encode (2080-07-10T17:30:30.208Z by
// default). Only meaningful for a layout that passes Validate.
func (l Layout) MaxTimestamp() int64 { return l.Epoch + l.timeMask() }

func (l Layout) timeMask() int64 { return 1<<l.TimeBits - 1 }

// Decode takes id apart. It returns [ErrInvalidID] for id <= 0 or above MaxID, and the
// validation error for an invalid layout; every other ID decodes.
func (l Layout) Decode(id int64) (Decoded, error) {
	if err := l.Validate(); err != nil {
		return Decoded{}, err
	}
	if id <= 0 {
		return Decoded{}, fmt.Errorf("%w: %d is not positive", ErrInvalidID, id)
	}
	if id > l.MaxID() {
		return Decoded{}, fmt.Errorf("%w: %d is above %d, the largest ID of the %s layout", ErrInvalidID, id, l.MaxID(), l.Name())
	}
	return l.Split(id), nil
}

// Split takes any signed 64-bit id apart with the layout's bits and epoch, unchecked, as
// Leaf's decode does: arithmetic shifts, so a negative id has a timestamp before the
// epoch and its low bits as worker and sequence. Decode is Split of a valid ID.
func (l Layout) Split(id int64) Decoded {
	return Decoded{
		ID:        id,
		Timestamp: id>>(l.WorkerBits+l.SequenceBits) + l.Epoch,
		WorkerID:  id >> l.SequenceBits & l.MaxWorkerID(),
		Sequence:  id & l.MaxSequence(),
	}
}

// Time returns d's timestamp as a UTC time.
func (d Decoded) Time() time.Time { return time.UnixMilli(d.Timestamp).UTC() }
