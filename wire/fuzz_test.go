package wire

import (
	"bytes"
	"errors"
	"math"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode"
	"unicode/utf8"
)

// The fuzz targets check the protocol's parsers against their own promises: never a
// panic, never an answer outside the rule, and what is accepted round-trips. `make test`
// runs each briefly; `make fuzz` runs them longer.

func FuzzParseCount(f *testing.F) {
	for _, s := range []string{"", " ", "1", "10000", "10001", "0007", "-1", "+5", "1e3", "\x00", "99999999999999999999"} {
		f.Add([]byte(s), 10000)
	}
	f.Fuzz(func(t *testing.T, body []byte, max int) {
		if max < 1 || max > MaxBatchLimit {
			return
		}
		n, err := ParseCount(body, max)
		if err != nil {
			if !errors.Is(err, ErrBadRequest) || n != 0 {
				t.Fatalf("ParseCount(%q, %d) = %d, %v: an error must be a 400 with no count", body, max, n, err)
			}
			if len(err.Error()) > 400 {
				t.Fatalf("ParseCount(%q) error of %d bytes: a reason must stay short", body, len(err.Error()))
			}
			return
		}
		if n < 1 || n > max {
			t.Fatalf("ParseCount(%q, %d) = %d, outside 1..%d", body, max, n, max)
		}
		trimmed := strings.TrimLeft(strings.TrimSpace(string(body)), "0")
		if trimmed != "" && trimmed != strconv.Itoa(n) {
			t.Fatalf("ParseCount(%q) = %d, but the body says %q", body, n, trimmed)
		}
	})
}

func FuzzParseID(f *testing.F) {
	for _, s := range []string{"1", " 1860000000000000000\n", "9223372036854775807", "9223372036854775808", "0", "-5", ""} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		id, err := ParseID(body)
		if err != nil {
			if !errors.Is(err, ErrBadRequest) {
				t.Fatalf("ParseID(%q) error %v is not a 400", body, err)
			}
			return
		}
		if id < 1 || strconv.FormatInt(id, 10) != strings.TrimLeft(strings.TrimSpace(string(body)), "0") {
			t.Fatalf("ParseID(%q) = %d", body, id)
		}
	})
}

func FuzzDecodeIDs(f *testing.F) {
	f.Add([]byte("1\n2\n3"), false)
	f.Add([]byte("9223372036854775807"), false)
	f.Add([]byte("\x00\x00\x00\x00\x00\x00\x00\x01"), true)
	f.Add([]byte("1\n\n2"), false)
	f.Fuzz(func(t *testing.T, body []byte, binary bool) {
		enc := Text
		if binary {
			enc = Binary
		}
		ids, err := DecodeIDs(nil, body, enc)
		if err != nil {
			if !errors.Is(err, ErrBadReply) || len(ids) != 0 {
				t.Fatalf("DecodeIDs(%q) = %v, %v: want ErrBadReply and nothing appended", body, ids, err)
			}
			return
		}
		for i, id := range ids {
			if id < 1 || (i > 0 && id <= ids[i-1]) {
				t.Fatalf("DecodeIDs(%q) accepted %v: not positive and strictly increasing", body, ids)
			}
		}
		// Accepted text without leading zeros, and any accepted binary, re-encode to itself.
		again := AppendIDs(nil, ids, enc)
		if enc == Binary && !bytes.Equal(again, body) {
			t.Fatalf("binary %x decodes to %v, which encodes to %x", body, ids, again)
		}
		if enc == Text && !bytes.HasPrefix(body, []byte("0")) && !bytes.Contains(body, []byte("\n0")) && !bytes.Equal(again, body) {
			t.Fatalf("text %q decodes to %v, which encodes to %q", body, ids, again)
		}
	})
}

// FuzzAppendIDs checks the text encoding against strconv for any list of int64s: start,
// then one ID per byte of steps, the next after a byte below 0xc0 (runs, as segment and
// snowflake batches have), a small gap after one below 0xe0, the start of a later
// hundred after one below 0xf0, a jump after the others. The additions wrap, so lists
// past 2^63-1, negative and decreasing ones come too.
func FuzzAppendIDs(f *testing.F) {
	f.Add(int64(99_999_950), bytes.Repeat([]byte{0}, 120))
	f.Add(int64(1_000_001_899), slices.Concat(make([]byte, 100), []byte{0xe3}, make([]byte, 99)))
	f.Add(int64(math.MaxInt64-120), bytes.Repeat([]byte{0}, 130))
	f.Add(int64(9_999_990), []byte{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xc5, 0, 0})
	f.Add(int64(1860000000000000097), []byte{0, 0, 0, 0xf3, 0, 0, 0xf3, 0xc0, 0xef})
	f.Add(int64(-5), []byte{0, 0, 0, 0, 0, 0, 0, 0})
	f.Add(int64(1), []byte{})
	f.Fuzz(func(t *testing.T, start int64, steps []byte) {
		if len(steps) > 5000 {
			return
		}
		ids := make([]int64, 0, 1+len(steps))
		ids = append(ids, start)
		id := start
		for _, c := range steps {
			switch {
			case c < 0xc0:
				id++
			case c < 0xe0:
				id += int64(c-0xbf) * 997
			case c < 0xf0:
				id += 100*int64(c-0xdf) - id%100
			default:
				id += int64(c) << 40
			}
			ids = append(ids, id)
		}
		got := AppendIDs([]byte("x"), ids, Text)
		if want := formatIDs([]byte("x"), ids); !bytes.Equal(got, want) {
			t.Fatalf("AppendIDs(%v) =\n%q\nwant\n%q", ids, got, want)
		}
	})
}

func FuzzNames(f *testing.F) {
	for _, s := range []string{"orders", "a.b", "*", ">", "", "订单", strings.Repeat("a", 129), "leaf_prod-2"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		for _, c := range []struct {
			name  string
			check func(string) error
			max   int
		}{{"CheckPrefix", CheckPrefix, MaxPrefixLen}, {"CheckNodeID", CheckNodeID, MaxNodeIDLen}} {
			err := c.check(s)
			// What a name rule accepts must be safe as one NATS subject token, a KV key
			// and a header value: no dots, wildcards, white space or control bytes.
			if err == nil && (len(s) == 0 || len(s) > c.max || strings.ContainsAny(s, ".*> \t\r\n\x00$") || !isASCII(s)) {
				t.Fatalf("%s(%q) accepted an unsafe name", c.name, s)
			}
			if err != nil && len(err.Error()) > 400 {
				t.Fatalf("%s error of %d bytes: a reason must stay short", c.name, len(err.Error()))
			}
		}
		// A tag is text (its encodings make it safe: FuzzTagEncodings): valid UTF-8 of at
		// most 128 characters and no control character, which could break a log line.
		if err := CheckTag(s); err == nil {
			if !utf8.ValidString(s) || utf8.RuneCountInString(s) > MaxTagLen || s == "" || strings.IndexFunc(s, unicode.IsControl) >= 0 {
				t.Fatalf("CheckTag(%q) accepted a tag that is not 1 to %d characters of text", s, MaxTagLen)
			}
		} else if !errors.Is(err, ErrBadRequest) || len(err.Error()) > 400 {
			t.Fatalf("CheckTag(%q) error %v: want a short 400", s, err)
		}
		sub := Subjects{Prefix: "leaf"}
		if s != "" && (s[0] == '$' || strings.HasPrefix(s, "leaf.")) && sub.ReplyAllowed(s) {
			t.Fatalf("ReplyAllowed(%q) = true", s)
		}
	})
}

func isASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] >= 0x80 {
			return false
		}
	}
	return true
}
