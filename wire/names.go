package wire

import (
	"fmt"
	"strconv"
	"unicode"
	"unicode/utf8"
)

// Name bounds (PROTOCOL.md). A prefix also names the service, the queue group, the KV
// buckets and the pool stream, so it is limited to what all of those accept.
const (
	MaxPrefixLen = 32
	MaxTagLen    = 128 // Leaf's biz_tag varchar(128)
	MaxNodeIDLen = 64
)

// CheckPrefix returns nil when p is a valid subject prefix: 1 to 32 characters of
// A-Z a-z 0-9 _ -. The error names the flag operators set it with.
func CheckPrefix(p string) error {
	if !validName(p, MaxPrefixLen) {
		return fmt.Errorf("--prefix %s: want 1 to %d characters of A-Z a-z 0-9 _ -", Quote(p), MaxPrefixLen)
	}
	return nil
}

// CheckTag returns nil when tag is a valid biz tag: what Leaf's biz_tag varchar(128)
// holds, 1 to 128 characters of UTF-8 text with no control characters (U+0000-U+001F,
// U+007F-U+009F). Otherwise a 400 that names the value. It allocates nothing on
// success, so the request path calls it freely. A tag travels in a subject token and a
// KV key in the encodings of tags.go.
func CheckTag(tag string) error {
	if len(tag) == 0 {
		return BadRequest("tag %s must be 1 to %d characters long", Quote(tag), MaxTagLen)
	}
	if IsPlainTag(tag) {
		if len(tag) > MaxTagLen {
			return BadRequest("tag %s must be 1 to %d characters long", Quote(tag), MaxTagLen)
		}
		return nil
	}
	n := 0
	for i := 0; i < len(tag); n++ {
		r, size := utf8.DecodeRuneInString(tag[i:])
		switch {
		case r == utf8.RuneError && size == 1:
			return BadRequest("tag %s is not valid UTF-8", Quote(tag))
		case unicode.IsControl(r):
			return BadRequest("tag %s holds the control character %U", Quote(tag), r)
		}
		i += size
	}
	if n > MaxTagLen {
		return BadRequest("tag %s has %d characters, more than %d", Quote(tag), n, MaxTagLen)
	}
	return nil
}

// IsPlainTag reports whether tag is made only of A-Z a-z 0-9 _ - (protocol v1's tag
// rule): such a tag is its own subject token and KV key. It says nothing of the length.
func IsPlainTag(tag string) bool {
	for i := 0; i < len(tag); i++ {
		if !isPlainByte(tag[i]) {
			return false
		}
	}
	return true
}

// isPlainByte reports whether c is one of A-Z a-z 0-9 _ -: the one name rule's
// characters, which the tag encodings leave as they are.
func isPlainByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-'
}

// CheckNodeID returns nil when id is a valid node ID: 1 to 64 characters of
// A-Z a-z 0-9 _ -. Node IDs become KV keys and header values, so nothing else is allowed.
func CheckNodeID(id string) error {
	if len(id) == 0 || len(id) > MaxNodeIDLen {
		return fmt.Errorf("node ID %s has %d characters, want 1 to %d", Quote(id), len(id), MaxNodeIDLen)
	}
	if !validName(id, MaxNodeIDLen) {
		return fmt.Errorf("node ID %s may only hold A-Z a-z 0-9 _ -", Quote(id))
	}
	return nil
}

// validName is the one name rule: 1 to max characters of A-Z a-z 0-9 _ -.
func validName(s string, max int) bool {
	if len(s) == 0 || len(s) > max {
		return false
	}
	return IsPlainTag(s)
}

// Quote shows a caller's value in an error message: Go-quoted (so control characters
// cannot break a header or a log line) and cut short, so a huge body does not become a
// huge header.
func Quote(s string) string {
	const max = 64
	if len(s) > max {
		return strconv.Quote(s[:max]) + "..."
	}
	return strconv.Quote(s)
}
