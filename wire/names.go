package wire

import (
	"fmt"
	"strconv"
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

// CheckTag returns nil when tag is a valid biz tag: 1 to 128 characters of
// A-Z a-z 0-9 _ -. Otherwise a 400 that names the value. It allocates nothing on
// success, so the request path calls it freely.
func CheckTag(tag string) error {
	if len(tag) == 0 || len(tag) > MaxTagLen {
		return BadRequest("tag %s must be 1 to %d characters long", Quote(tag), MaxTagLen)
	}
	if !validName(tag, MaxTagLen) {
		return BadRequest("tag %s may only hold A-Z a-z 0-9 _ -", Quote(tag))
	}
	return nil
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
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-') {
			return false
		}
	}
	return true
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
