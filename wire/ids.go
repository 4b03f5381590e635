package wire

import (
	"encoding/binary"
	"fmt"
	"math"
	"slices"
	"strconv"
)

// AppendIDs encodes ids in enc onto dst: a reply body of PROTOCOL.md. The caller
// promises the IDs are positive and strictly increasing.
func AppendIDs(dst []byte, ids []int64, enc Encoding) []byte {
	if enc == Binary {
		for _, id := range ids {
			dst = binary.BigEndian.AppendUint64(dst, uint64(id))
		}
		return dst
	}
	// Segment batches are runs of consecutive IDs: the digits of the next one are the
	// previous one's plus one. In a run, a separator and the digits sit in line, raised
	// in place and stored with one fixed-size move, for a fraction of what formatting
	// each number costs. Other IDs are formatted straight into dst.
	var line [24]byte // in a run: '\n' then the current ID's decimal digits
	digits := 0       // how many; 0: not in a run
	last := 0         // where the previous ID's digits start in dst
	for i, id := range ids {
		if i > 0 && id == ids[i-1]+1 {
			if digits == 0 {
				line[0] = '\n'
				digits = copy(line[1:], dst[last:])
			}
			if raise(&line, digits) {
				if cap(dst)-len(dst) < len(line) {
					dst = slices.Grow(dst, len(line)+(len(ids)-i)*(digits+1))
				}
				n := len(dst)
				dst = dst[:n+len(line)]
				*(*[len(line)]byte)(dst[n:]) = line
				dst = dst[:n+1+digits]
				continue
			}
		}
		if i > 0 {
			dst = append(dst, '\n')
		}
		digits, last = 0, len(dst)
		dst = strconv.AppendInt(dst, id, 10)
	}
	return dst
}

// raise adds one to the decimal digits in line[1:1+digits]; false (line spoiled) when
// they are all nines, whose successor has one more digit: the caller formats that anew.
func raise(line *[24]byte, digits int) bool {
	for i := digits; i >= 1; i-- {
		if line[i] != '9' {
			line[i]++
			return true
		}
		line[i] = '0'
	}
	return false
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
