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

// Rounds is the number of Feistel rounds (see the package doc for why six).
const Rounds = 6

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
	keys        [Rounds]sipKey
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
		p.keys[i] = newSipKey(binary.LittleEndian.Uint64(sum[0:]), binary.LittleEndian.Uint64(sum[8:]))
	}
	return p, nil
}

// Bits is the range's width.
func (p *Permutation) Bits() int { return int(p.width) }

// Max is the range's largest ID, 2^Bits-1.
func (p *Permutation) Max() int64 { return int64(1)<<p.width - 1 }

// Permute returns the image of x, which must be in [1, Max()] (else ErrInvalid). It
// costs Rounds keyed hashes of 4 bytes, and about one more in 2^Bits of cases.
func (p *Permutation) Permute(x int64) (int64, error) {
	if x < 1 || x > p.Max() {
		return 0, fmt.Errorf("%w: %d is outside the range 1 to %d", ErrInvalid, x, p.Max())
	}
	return int64(p.walk(p.forward(uint64(x)))), nil
}

// PermuteAll replaces every ID of ids, each in [1, Max()], with its image: what Permute
// gives, at a lower cost per ID. Four IDs go through the network side by side, so that
// a core runs their independent hashes together, and IDs that share their upper half
// (consecutive segment numbers do, but every 2^(Bits/2)-th) share the first round's
// hash. When an ID is out of range it returns ErrInvalid and leaves ids unchanged.
func (p *Permutation) PermuteAll(ids []int64) error {
	for _, x := range ids {
		if x < 1 || x > p.Max() {
			return fmt.Errorf("%w: %d is outside the range 1 to %d", ErrInvalid, x, p.Max())
		}
	}
	i := 0
	for ; i+4 <= len(ids); i += 4 {
		q := (*[4]int64)(ids[i : i+4])
		p.forward4(q)
		for j := range q {
			q[j] = int64(p.walk(uint64(q[j])))
		}
	}
	for ; i < len(ids); i++ {
		ids[i] = int64(p.walk(p.forward(uint64(ids[i]))))
	}
	return nil
}

// walk is cycle-walking: 0 is not in the range, so the image of the one ID that the
// network maps to 0 is the next step's.
func (p *Permutation) walk(y uint64) uint64 {
	for y == 0 {
		y = p.forward(y)
	}
	return y
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
		r ^= sip13(&p.keys[i], l) & p.maskR
		l ^= sip13(&p.keys[i+1], r) & p.maskL
	}
	return l<<p.right | r
}

// forward4 is forward on four values at once (see PermuteAll).
func (p *Permutation) forward4(v *[4]int64) {
	mr, ml := p.maskR, p.maskL
	l0, r0 := uint64(v[0])>>p.right, uint64(v[0])&mr
	l1, r1 := uint64(v[1])>>p.right, uint64(v[1])&mr
	l2, r2 := uint64(v[2])>>p.right, uint64(v[2])&mr
	l3, r3 := uint64(v[3])>>p.right, uint64(v[3])&mr
	k := &p.keys[0]
	if l0 == l1 && l0 == l2 && l0 == l3 {
		f := sip13(k, l0) & mr
		r0, r1, r2, r3 = r0^f, r1^f, r2^f, r3^f
	} else {
		r0 ^= sip13(k, l0) & mr
		r1 ^= sip13(k, l1) & mr
		r2 ^= sip13(k, l2) & mr
		r3 ^= sip13(k, l3) & mr
	}
	k = &p.keys[1]
	l0 ^= sip13(k, r0) & ml
	l1 ^= sip13(k, r1) & ml
	l2 ^= sip13(k, r2) & ml
	l3 ^= sip13(k, r3) & ml
	for i := 2; i < Rounds; i += 2 {
		k = &p.keys[i]
		r0 ^= sip13(k, l0) & mr
		r1 ^= sip13(k, l1) & mr
		r2 ^= sip13(k, l2) & mr
		r3 ^= sip13(k, l3) & mr
		k = &p.keys[i+1]
		l0 ^= sip13(k, r0) & ml
		l1 ^= sip13(k, r1) & ml
		l2 ^= sip13(k, r2) & ml
		l3 ^= sip13(k, r3) & ml
	}
	v[0], v[1] = int64(l0<<p.right|r0), int64(l1<<p.right|r1)
	v[2], v[3] = int64(l2<<p.right|r2), int64(l3<<p.right|r3)
}

func (p *Permutation) backward(v uint64) uint64 {
	l, r := v>>p.right, v&p.maskR
	for i := Rounds - 2; i >= 0; i -= 2 {
		l ^= sip13(&p.keys[i+1], r) & p.maskL
		r ^= sip13(&p.keys[i], l) & p.maskR
	}
	return l<<p.right | r
}

// sipKey is one round's SipHash key as the hash's state before its message: the four
// words the key sets, with the part of the first round that depends on the key alone
// (sipRoundKeyHalf) already done. Doing it once per key instead of once per hash
// takes it off the chain of dependent steps a lone ID waits for: 55 ns to 47 per ID
// (BENCHMARKS.md).
type sipKey struct{ v0, v1, v2, v3 uint64 }

func newSipKey(k0, k1 uint64) sipKey {
	v0 := k0 ^ 0x736f6d6570736575
	v1 := k1 ^ 0x646f72616e646f6d
	v0, v1 = sipRoundKeyHalf(v0, v1)
	return sipKey{
		v0: v0,
		v1: v1,
		v2: k0 ^ 0x6c7967656e657261,
		v3: k1 ^ 0x7465646279746573,
	}
}

// sip13 is SipHash-1-3 under key k of the 4-byte message that is h in little-endian
// order (a half is at most 32 bits wide): the message and its length fill SipHash's
// one, final block. Its first round starts at sipRoundRest: the key half is done in k.
func sip13(k *sipKey, h uint64) uint64 {
	b := uint64(4)<<56 | h&0xffffffff
	v0, v1, v2, v3 := sipRoundRest(k.v0, k.v1, k.v2, k.v3^b)
	v0 ^= b
	v2 ^= 0xff
	v0, v1 = sipRoundKeyHalf(v0, v1)
	v0, v1, v2, v3 = sipRoundRest(v0, v1, v2, v3)
	v0, v1 = sipRoundKeyHalf(v0, v1)
	v0, v1, v2, v3 = sipRoundRest(v0, v1, v2, v3)
	v0, v1 = sipRoundKeyHalf(v0, v1)
	v0, v1, v2, v3 = sipRoundRest(v0, v1, v2, v3)
	return v0 ^ v1 ^ v2 ^ v3
}

// A SipHash round is sipRoundKeyHalf, its first four steps (on v0 and v1 alone: in the
// first round a function of the key, which a sipKey holds done), then sipRoundRest.
func sipRoundKeyHalf(v0, v1 uint64) (uint64, uint64) {
	v0 += v1
	v1 = bits.RotateLeft64(v1, 13)
	v1 ^= v0
	return bits.RotateLeft64(v0, 32), v1
}

func sipRoundRest(v0, v1, v2, v3 uint64) (uint64, uint64, uint64, uint64) {
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

// FingerprintLen is the length of a Fingerprint: 24 hex digits (96 bits).
const FingerprintLen = 24

// Fingerprint names a key without revealing it: what a deployment records beside an
// opaque tag's mark, so that a dispenser with another key refuses the tag.
func Fingerprint(key []byte) string {
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte("leafbus opaque key fingerprint v1"))
	return hex.EncodeToString(mac.Sum(nil)[:FingerprintLen/2])
}
