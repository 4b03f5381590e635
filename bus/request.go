package bus

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Encoding is how a reply carries its IDs (PROTOCOL.md "Getting IDs").
type Encoding uint8

const (
	// Text is the default: unsigned decimals separated by "\n", no trailing newline.
	Text Encoding = iota
	// Binary is N eight-byte big-endian unsigned integers.
	Binary
)

func (e Encoding) String() string {
	if e == Binary {
		return "binary"
	}
	return "text"
}

// EncodingHeader is the request header that asks for an encoding.
const EncodingHeader = "Leaf-Encoding"

// parseEncoding reads the Leaf-Encoding header value; "" means absent.
func parseEncoding(v string) (Encoding, error) {
	switch v {
	case "", "text":
		return Text, nil
	case "binary":
		return Binary, nil
	}
	return 0, badRequest("encoding %s is not text or binary", quote(v))
}

// parseCount reads a request body: empty or white space for one ID, else a decimal count
// of 1..max. Digits only; leading zeros are fine.
func parseCount(body []byte, max int) (int, error) {
	s := strings.TrimSpace(string(body))
	if s == "" {
		return 1, nil
	}
	n := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c < '0' || c > '9' {
			return 0, badCount(s, max)
		}
		n = n*10 + int(c-'0')
		if n > max {
			return 0, badCount(s, max)
		}
	}
	if n < 1 {
		return 0, badCount(s, max)
	}
	return n, nil
}

func badCount(s string, max int) error {
	return badRequest("count %s is not a whole number between 1 and %d", quote(s), max)
}

// parseID reads the body of a decode request: one decimal ID from 1 to 2^63-1.
func parseID(body []byte) (int64, error) {
	s := strings.TrimSpace(string(body))
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, badRequest("ID %s is not a whole number between 1 and 9223372036854775807", quote(s))
		}
	}
	id, err := strconv.ParseInt(s, 10, 64)
	if err != nil || id < 1 {
		return 0, badRequest("ID %s is not a whole number between 1 and 9223372036854775807", quote(s))
	}
	return id, nil
}

// AppendIDs encodes ids in enc onto dst: the reply body of PROTOCOL.md. Package pools
// uses it to prepare replies ahead of time.
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

// decodeIDs is AppendIDs reversed, for the client: it checks the count and that the IDs
// are positive and strictly increasing, as the protocol promises within a reply.
func decodeIDs(body []byte, enc Encoding, want int, dst []int64) ([]int64, error) {
	dst = dst[:0]
	if enc == Binary {
		if len(body) != 8*want {
			return nil, fmt.Errorf("binary reply of %d bytes, want %d IDs (%d bytes)", len(body), want, 8*want)
		}
		for i := 0; i < len(body); i += 8 {
			dst = append(dst, int64(binary.BigEndian.Uint64(body[i:])))
		}
	} else {
		for len(body) > 0 {
			var field []byte
			if i := bytes.IndexByte(body, '\n'); i >= 0 {
				field, body = body[:i], body[i+1:]
				if len(body) == 0 {
					return nil, fmt.Errorf("text reply ends with a newline")
				}
			} else {
				field, body = body, nil
			}
			id, err := strconv.ParseInt(string(field), 10, 64)
			if err != nil {
				return nil, fmt.Errorf("text reply holds %q, not an ID", field)
			}
			dst = append(dst, id)
		}
		if len(dst) != want {
			return nil, fmt.Errorf("text reply holds %d IDs, want %d", len(dst), want)
		}
	}
	for i, id := range dst {
		if id < 1 || (i > 0 && id <= dst[i-1]) {
			return nil, fmt.Errorf("reply IDs not positive and strictly increasing at position %d (%d)", i, id)
		}
	}
	return dst, nil
}

// quote shows a client's value in an error message: Go-quoted (so control characters
// cannot break the header) and cut short, so a huge body does not become a huge header.
func quote(s string) string {
	const max = 64
	if len(s) > max {
		return strconv.Quote(s[:max]) + "..."
	}
	return strconv.Quote(s)
}
