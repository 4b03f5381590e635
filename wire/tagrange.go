package wire

import (
	"errors"
	"fmt"
	"strconv"
)

// TagRange is the range of a segment tag's IDs (PROTOCOL.md "Opaque tags and widths"):
// its width, and whether the tag is opaque, handing out the images of its segment
// numbers under a keyed permutation of the range instead of the numbers.
//
// The zero value, like Bits 63 without Opaque, is every tag's default: any positive
// int64. A narrower width caps the tag: a segment number above 2^Bits-1 is refused,
// never wrapped (53 bits keeps every ID exactly representable in a JavaScript Number).
// An opaque tag names the key of its permutation by the key's fingerprint
// (opaque.Fingerprint), so that a dispenser with another key refuses it.
type TagRange struct {
	Bits   int    `json:"bits,omitempty"`
	Opaque bool   `json:"opaque,omitempty"`
	Key    string `json:"key,omitempty"` // the key's fingerprint, with Opaque only
}

// Width bounds, and the fingerprint's length in hex digits (opaque.MinBits,
// opaque.MaxBits, opaque.FingerprintLen).
const (
	MinTagBits     = 16
	MaxTagBits     = 63
	KeyFingerprint = 24
)

// ErrRangeUsedUp is returned (as a 503, like a snowflake generator whose timestamp bits
// ran out) for a tag whose next segment number lies beyond its range: every dispenser
// refuses it until an operator gives its IDs another tag.
var ErrRangeUsedUp = fmt.Errorf("%w: range used up", ErrUnavailable)

// Width is the tag's width in bits: Bits, or 63 for the default.
func (r TagRange) Width() int {
	if r.Bits == 0 {
		return MaxTagBits
	}
	return r.Bits
}

// Max is the tag's largest ID, 2^Width-1.
func (r TagRange) Max() int64 { return int64(1)<<r.Width() - 1 }

// IsDefault reports whether r is every tag's default: 63 bits, not opaque.
func (r TagRange) IsDefault() bool { return !r.Opaque && r.Width() == MaxTagBits }

// Normal is r as it is written: the default as the zero value, and Bits given for
// every other range.
func (r TagRange) Normal() TagRange {
	if r.IsDefault() {
		return TagRange{}
	}
	r.Bits = r.Width()
	return r
}

// Validate checks a width of 16 to 63 bits, and a key fingerprint given exactly when
// the tag is opaque.
func (r TagRange) Validate() error {
	var errs []error
	if r.Bits != 0 && (r.Bits < MinTagBits || r.Bits > MaxTagBits) {
		errs = append(errs, fmt.Errorf("bits %d: want %d to %d", r.Bits, MinTagBits, MaxTagBits))
	}
	switch {
	case r.Opaque && !validFingerprint(r.Key):
		errs = append(errs, fmt.Errorf("opaque with key fingerprint %s: want %d hex digits", Quote(r.Key), KeyFingerprint))
	case !r.Opaque && r.Key != "":
		errs = append(errs, fmt.Errorf("key fingerprint %s on a tag that is not opaque", Quote(r.Key)))
	}
	return errors.Join(errs...)
}

func validFingerprint(s string) bool {
	if len(s) != KeyFingerprint {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// String describes r for people: "63 bits", "53 bits", "opaque, 63 bits, key 9f86d0...".
func (r TagRange) String() string {
	s := strconv.Itoa(r.Width()) + " bits"
	if r.Opaque {
		s = "opaque, " + s + ", key " + r.Key
	}
	return s
}
