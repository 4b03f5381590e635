package wire

import (
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"strconv"
)

// AppendIDs encodes ids in enc onto dst: a reply body of PROTOCOL.md. The caller
// promises the IDs are positive and strictly increasing; other IDs are written as
// strconv writes them. A dst with room for len(ids)*MaxTextID more bytes is not grown
// (by positive IDs): a reply buffer of that size is reused without allocating.
func AppendIDs(dst []byte, ids []int64, enc Encoding) []byte {
	if enc == Binary {
		for _, id := range ids {
			dst = binary.BigEndian.AppendUint64(dst, uint64(id))
		}
		return dst
	}
	if len(ids) == 0 {
		return dst
	}
	dst = strconv.AppendInt(dst, ids[0], 10)
	return appendLines(dst, ids[1:])
}

// appendLines writes each ID as a line of text: '\n' and its decimal digits.
//
// Formatting each number costs about 20 ns for a 19-digit ID, and raising the digits of
// a run one by one about 7 ns; a reply of 1000 IDs paid that on every request. Here the
// IDs are taken a hundred at a time: a run of consecutive IDs within one hundred (100 to
// 199, ...) shares all digits but the last two. Those shared digits are turned into
// ASCII once per hundred: the last eight digits by a few multiplications on one word
// (digits8), those above them (id/10^8, which a run keeps for 10^8 IDs and snowflake IDs
// share for about 24 ms) only when they change (lineHead). Each line is then two or
// three unaligned 8-byte stores (short lines two 4-byte ones), the last one carrying the
// last two digits from a table, all ending exactly at the line's end, so dst needs no
// room beyond the reply. The hundred after a whole hundred differs from it in its
// hundreds digit alone (unless that is 0): it is copied and that digit set. A gap ends
// a group of lines early, and so does a new line length. IDs below 100, and numbers
// outside the caller's promise (zero, negative), are formatted by strconv.
func appendLines(dst []byte, ids []int64) []byte {
	var head lineHead
	head.high = math.MaxUint64 // no ID has it: the first one sets the head
	n, b := len(dst), dst[:cap(dst)]
	whole := -1 // where the lines of the last hundred start when it was whole and ends at n
	for i := 0; i < len(ids); {
		id := ids[i]
		if id < 100 {
			dst = strconv.AppendInt(append(b[:n], '\n'), id, 10)
			n, b = len(dst), dst[:cap(dst)]
			whole = -1
			i++
			continue
		}
		v := uint64(id)
		first := v % 100
		// How many IDs from v run on within its hundred (never past 2^63-1).
		run := min(uint64(len(ids)-i), 100-first, math.MaxInt64-v+1)
		m := uint64(1)
		for m < run && uint64(ids[i+int(m)]) == v+m {
			m++
		}
		var l int // line length, '\n' included
		if v >= minWordLine {
			if high := v / 1e8; high != head.high {
				head.set(high)
			}
			l = int(head.length)
		} else {
			l = 1 + shortDigits(v)
		}
		size := l * int(m)
		if len(b)-n < size {
			b = slices.Grow(b[:n], size+(len(ids)-i)*MaxTextID)
			b = b[:cap(b)]
		}
		out := b[n : n+size]
		pairs := twoDigits[2*first : 2*(first+m)]
		switch hundreds := byte(v / 100 % 10); {
		case m == 1 && v >= minWordLine:
			// A gap on either side, as between snowflake IDs of different milliseconds.
			putLine(out, &head, v%1e8)
		case m == 100 && hundreds != 0 && whole >= 0 && ids[i-1] == id-1:
			// The hundred right after the whole one at b[whole:n]: the same lines but
			// for the hundreds digit, third from the end of each.
			copy(out, b[whole:n])
			for o := l - 3; o < len(out); o += l {
				out[o] = '0' + hundreds
			}
		case v >= minWordLine:
			putLines(out, &head, digits8(v%1e8-first)&^(0xffff<<48), pairs)
		default:
			putShortLines(out, l, shortLine(v-first, l), pairs)
		}
		whole = -1
		if m == 100 {
			whole = n
		}
		n += size
		i += int(m)
	}
	return b[:n]
}

// minWordLine is the smallest ID whose line ('\n' and eight digits) is longer than a
// word: from there on lines are written by lineHead and putLines, below by putShortLines.
const minWordLine = 1e7

// lineHead is the start of a line shared by the IDs with one value of id/10^8 (the
// high digits): '\n' and those digits (none when the value is 0, for IDs of 8 digits),
// in little-endian words as they are stored, and the line's whole length.
type lineHead struct {
	high   uint64 // id/10^8
	w0, w1 uint64 // bytes 0-7 and 8-15 of the line; those past the head are overwritten
	length uint8  // '\n', the head's digits and 8 more: 9 to 20
}

// set makes h the head of the IDs whose value/10^8 is high (at most 92233720368, 11 digits).
func (h *lineHead) set(high uint64) {
	var buf [16]byte
	buf[0] = '\n'
	n := 1
	if high > 0 {
		n = len(strconv.AppendUint(buf[:1], high, 10))
	}
	h.high = high
	h.w0 = binary.LittleEndian.Uint64(buf[0:])
	h.w1 = binary.LittleEndian.Uint64(buf[8:])
	h.length = uint8(n + 8)
}

// putLines writes a line into out for each pair of digits in pairs, each head.length long:
// the head, then tail with the pair as its last two digits. It is a function of its own
// so that its loop keeps everything in registers: inlined in appendLines, the index and
// the head went to the stack and back for every line, which cost twice as much.
func putLines(out []byte, head *lineHead, tail uint64, pairs string) {
	l, w0, w1 := int(head.length), head.w0, head.w1
	if l < 9 || l > 20 {
		panic("wire: line length out of range") // never: lineHead.set makes 9 to 20
	}
	o := 0
	if l <= 16 {
		for j := 0; j+1 < len(pairs); j += 2 {
			line := out[o : o+l]
			binary.LittleEndian.PutUint64(line, w0)
			binary.LittleEndian.PutUint64(line[l-8:], tail|uint64(pairs[j])<<48|uint64(pairs[j+1])<<56)
			o += l
		}
		return
	}
	for j := 0; j+1 < len(pairs); j += 2 {
		line := out[o : o+l]
		binary.LittleEndian.PutUint64(line, w0)
		binary.LittleEndian.PutUint64(line[8:], w1)
		binary.LittleEndian.PutUint64(line[l-8:], tail|uint64(pairs[j])<<48|uint64(pairs[j+1])<<56)
		o += l
	}
}

// putLine writes the line of one ID into out (head.length long): the head, then low,
// the ID's last eight digits.
func putLine(out []byte, head *lineHead, low uint64) {
	l := len(out)
	binary.LittleEndian.PutUint64(out, head.w0)
	if l > 16 {
		binary.LittleEndian.PutUint64(out[8:], head.w1)
	}
	binary.LittleEndian.PutUint64(out[l-8:], digits8(low))
}

// shortDigits returns how many digits v has, for 100 <= v < minWordLine.
func shortDigits(v uint64) int {
	switch {
	case v < 1e3:
		return 3
	case v < 1e4:
		return 4
	case v < 1e5:
		return 5
	case v < 1e6:
		return 6
	}
	return 7
}

// shortLine returns the line of v < minWordLine, l bytes ('\n' and l-1 digits) in a
// little-endian word, with its last two digits left zero for putShortLines to fill.
func shortLine(v uint64, l int) uint64 {
	line := '\n' | digits8(v)>>(8*(9-l))<<8 // the digits without the leading zeros
	return line &^ (0xffff << (8 * (l - 2)))
}

// putShortLines is putLines for lines of 4 to 8 bytes (IDs of 3 to 7 digits): line, with
// each pair as its last two digits, stored as two 4-byte words.
func putShortLines(out []byte, l int, line uint64, pairs string) {
	if l < 4 || l > 8 {
		panic("wire: short line length out of range") // never: shortDigits gives 3 to 7
	}
	o := 0
	for j := 0; j+1 < len(pairs); j += 2 {
		x := line | (uint64(pairs[j])|uint64(pairs[j+1])<<8)<<(8*(l-2))
		binary.LittleEndian.PutUint32(out[o:o+l], uint32(x))
		binary.LittleEndian.PutUint32(out[o+l-4:o+l], uint32(x>>(8*(l-4))))
		o += l
	}
}

// twoDigits is 00 to 99, two digits each: the last two digits of a line.
const twoDigits = "00010203040506070809101112131415161718192021222324252627282930313233343536373839404142434445464748495051525354555657585960616263646566676869707172737475767778798081828384858687888990919293949596979899"

// digits8 returns the eight decimal digits of v < 10^8, leading zeros included, as ASCII
// in a little-endian word: its first byte is the most significant digit. The word is cut
// in lanes that are divided in parallel, by multiplying with a reciprocal: two 4-digit
// lanes (v/10^4 and v%10^4) become four of 2 digits, then eight of one.
func digits8(v uint64) uint64 {
	hi := v / 10000
	x := hi | (v-hi*10000)<<32
	// x/100 in each 32-bit lane: (x*10486)>>20 is exact below 10^4 and a lane's product
	// stays under 2^27, so no lane spills into the next.
	y := (x * 10486 >> 20) & 0x0000007f_0000007f
	x = y | (x-y*100)<<16
	// x/10 in each 16-bit lane: (x*103)>>10 is exact below 100 and stays under 2^14.
	y = (x * 103 >> 10) & 0x000f000f_000f000f
	x = y | (x-y*10)<<8
	return x | 0x30303030_30303030
}

// DecodeIDs is AppendIDs reversed: it appends the IDs of a reply body to dst and checks
// what the protocol promises within one reply: at least one ID, every one a positive
// int64, strictly increasing, and in text no empty field or trailing newline. Errors
// wrap ErrBadReply. It allocates nothing beyond dst's growth, since clients and the
// load generator run it once per reply.
func DecodeIDs(dst []int64, body []byte, enc Encoding) ([]int64, error) {
	start := len(dst)
	var err error
	if enc == Binary {
		dst, err = decodeBinary(dst, body)
	} else {
		dst, err = decodeText(dst, body)
	}
	if err != nil {
		return dst[:start], err
	}
	ids := dst[start:]
	// Every ID well formed first, so that ErrOutOfOrder means only the order is wrong.
	for i, id := range ids {
		if id < 1 {
			return dst[:start], fmt.Errorf("%w: ID %d at position %d is not positive", ErrBadReply, uint64(id), i)
		}
	}
	for i := 1; i < len(ids); i++ {
		if ids[i] <= ids[i-1] {
			return dst[:start], fmt.Errorf("%w: %d follows %d", ErrOutOfOrder, ids[i], ids[i-1])
		}
	}
	return dst, nil
}

func decodeText(dst []int64, body []byte) ([]int64, error) {
	if len(body) == 0 {
		return dst, fmt.Errorf("%w: empty body", ErrBadReply)
	}
	var v uint64
	digits := 0
	for i, c := range body {
		switch {
		case c >= '0' && c <= '9':
			// Up to 18 digits cannot pass 2^63-1; only longer numbers pay for the check.
			if digits >= 18 {
				if d := uint64(c - '0'); v > (math.MaxInt64-d)/10 {
					return dst, fmt.Errorf("%w: number at byte %d exceeds 2^63-1", ErrBadReply, i)
				}
			}
			v = v*10 + uint64(c-'0')
			digits++
		case c == '\n' && digits > 0:
			dst = append(dst, int64(v))
			v, digits = 0, 0
		default:
			return dst, fmt.Errorf("%w: unexpected byte %q at %d", ErrBadReply, c, i)
		}
	}
	if digits == 0 {
		return dst, fmt.Errorf("%w: body ends with a newline", ErrBadReply)
	}
	return append(dst, int64(v)), nil
}

func decodeBinary(dst []int64, body []byte) ([]int64, error) {
	if len(body) == 0 || len(body)%8 != 0 {
		return dst, fmt.Errorf("%w: binary body of %d bytes is not a positive multiple of 8", ErrBadReply, len(body))
	}
	for i := 0; i < len(body); i += 8 {
		dst = append(dst, int64(binary.BigEndian.Uint64(body[i:])))
	}
	return dst, nil
}
