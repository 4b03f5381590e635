package opaque

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"math/bits"
)

// Rounds is the number of Feistel rounds. Four rounds of a pseudo-random function make
// a strong pseudo-random permutation (Luby and Rackoff); the extra rounds cover the
// small halves of narrow ranges, where the bounds are loose.
const Rounds = 8

// MinBits and MaxBits bound a range's width: 63 bits is every positive int64; 53 is every
// ID a JavaScript Number holds exactly. Fewer than 16 bits would be a range a visitor
// could walk by hand.
const (
	MinBits = 16
	MaxBits = 63
)

// MinKeyBytes is the shortest key accepted: 128 bits.
const MinKeyBytes = 16

// ErrInvalid is returned for a key or width out of bounds, or an ID outside the range.
var ErrInvalid = errors.New("opaque: invalid")

// Permutation is one tag's keyed bijection of [1, Max()]. It is a value, safe for
// concurrent use.
type Permutation struct {
	width       uint // Bits
	left, right uint // the halves' widths: left+right = width, right-left is 0 or 1
	maskL       uint64
	maskR       uint64
	keys        [Rounds][2]uint64
}

// New returns the permutation of tag's IDs of width bits under key. The same key, tag and
// width always give the same permutation; any other gives an unrelated one.
func New(key []byte, tag string, width int) (*Permutation, error) {
	if len(key) < MinKeyBytes {
		return nil, fmt.Errorf("%w: key of %d bytes, want at least %d", ErrInvalid, len(key), MinKeyBytes)
	}
	if width < MinBits || width > MaxBits {
		return nil, fmt.Errorf("%w: width %d bits, want %d to %d", ErrInvalid, width, MinBits, MaxBits)
	}
	p := &Permutation{width: uint(width), left: uint(width) / 2}
	p.right = p.width - p.left
	p.maskL, p.maskR = 1<<p.left-1, 1<<p.right-1
	for i := range Rounds {
		mac := hmac.New(sha256.New, key)
		fmt.Fprintf(mac, "leafbus opaque v1\x00%s\x00%d\x00%d", tag, width, i)
		sum := mac.Sum(nil)
		p.keys[i] = [2]uint64{binary.LittleEndian.Uint64(sum[0:]), binary.LittleEndian.Uint64(sum[8:])}
	}
	return p, nil
}

// Bits is the range's width.
func (p *Permutation) Bits() int { return int(p.width) }

// Max is the range's largest ID, 2^Bits-1.
func (p *Permutation) Max() int64 { return int64(1)<<p.width - 1 }

// Permute returns the image of x, which must be in [1, Max()] (else ErrInvalid). It
// costs Rounds keyed hashes of 8 bytes, and about one more in 2^Bits of cases.
func (p *Permutation) Permute(x int64) (int64, error) {
	if x < 1 || x > p.Max() {
		return 0, fmt.Errorf("%w: %d is outside the range 1 to %d", ErrInvalid, x, p.Max())
	}
	y := p.forward(uint64(x))
	for y == 0 { // cycle-walking: 0 is not in the range, its image is the next step's
		y = p.forward(y)
	}
	return int64(y), nil
}

// Reveal is Permute reversed: the x whose image is y.
func (p *Permutation) Reveal(y int64) (int64, error) {
	if y < 1 || y > p.Max() {
		return 0, fmt.Errorf("%w: %d is outside the range 1 to %d", ErrInvalid, y, p.Max())
	}
	x := p.backward(uint64(y))
	for x == 0 {
		x = p.backward(x)
	}
	return int64(x), nil
}

// forward is the Feistel network on [0, 2^width): alternately the right half is mixed
// with a function of the left and the left with a function of the right, each round
// undone by the same xor.
func (p *Permutation) forward(v uint64) uint64 {
	l, r := v>>p.right, v&p.maskR
	for i := 0; i < Rounds; i += 2 {
		r ^= sip13(p.keys[i], l) & p.maskR
		l ^= sip13(p.keys[i+1], r) & p.maskL
	}
	return l<<p.right | r
}

func (p *Permutation) backward(v uint64) uint64 {
	l, r := v>>p.right, v&p.maskR
	for i := Rounds - 2; i >= 0; i -= 2 {
		l ^= sip13(p.keys[i+1], r) & p.maskL
		r ^= sip13(p.keys[i], l) & p.maskR
	}
	return l<<p.right | r
}

// sip13 is SipHash-1-3 of the 8 little-endian bytes of m under key k.
func sip13(k [2]uint64, m uint64) uint64 {
	v0 := k[0] ^ 0x736f6d6570736575
	v1 := k[1] ^ 0x646f72616e646f6d
	v2 := k[0] ^ 0x6c7967656e657261
	v3 := k[1] ^ 0x7465646279746573
	v3 ^= m
	v0, v1, v2, v3 = sipRound(v0, v1, v2, v3)
	v0 ^= m
	const last = uint64(8) << 56 // the length block of an 8-byte message
	v3 ^= last
	v0, v1, v2, v3 = sipRound(v0, v1, v2, v3)
	v0 ^= last
	v2 ^= 0xff
	v0, v1, v2, v3 = sipRound(v0, v1, v2, v3)
	v0, v1, v2, v3 = sipRound(v0, v1, v2, v3)
	v0, v1, v2, v3 = sipRound(v0, v1, v2, v3)
	return v0 ^ v1 ^ v2 ^ v3
}

func sipRound(v0, v1, v2, v3 uint64) (uint64, uint64, uint64, uint64) {
	v0 += v1
	v1 = bits.RotateLeft64(v1, 13)
	v1 ^= v0
	v0 = bits.RotateLeft64(v0, 32)
	v2 += v3
	v3 = bits.RotateLeft64(v3, 16)
	v3 ^= v2
	v0 += v3
	v3 = bits.RotateLeft64(v3, 21)
	v3 ^= v0
	v2 += v1
	v1 = bits.RotateLeft64(v1, 17)
	v1 ^= v2
	v2 = bits.RotateLeft64(v2, 32)
	return v0, v1, v2, v3
}

// Fingerprint names a key without revealing it: what a deployment records beside an
// opaque tag's mark, so that a dispenser with another key refuses the tag.
func Fingerprint(key []byte) string {
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte("leafbus opaque key fingerprint v1"))
	return hex.EncodeToString(mac.Sum(nil)[:12])
}
