package wire

import (
	"fmt"
	"strconv"
	"strings"
)

// Batch limits: a request asks for 1 to max_batch IDs; max_batch defaults to
// DefaultMaxBatch and may be configured up to MaxBatchLimit (10^6 IDs as text stay under
// 20 MB, which a NATS server's max_payload must allow).
const (
	DefaultMaxBatch = 10000
	MaxBatchLimit   = 1_000_000
	// MaxTextID is the longest decimal ID plus its separator: a text reply of n IDs never
	// exceeds n*MaxTextID bytes.
	MaxTextID = 20
)

// CheckMaxBatch is the rule for a dispenser's max_batch (--max-batch): 1 to
// MaxBatchLimit. Every part that takes it checks it here.
func CheckMaxBatch(n int) error {
	if n < 1 || n > MaxBatchLimit {
		return fmt.Errorf("--max-batch %d: want 1 to %d", n, MaxBatchLimit)
	}
	return nil
}

// ParseCount reads a request body: empty or white space for one ID, else a decimal count
// of 1..max. Digits only (no sign, no decimal point); leading zeros are fine.
func ParseCount(body []byte, max int) (int, error) {
	// Trim by hand: strings.TrimSpace(string(body)) would copy every body.
	lo, hi := 0, len(body)
	for lo < hi && isSpace(body[lo]) {
		lo++
	}
	for hi > lo && isSpace(body[hi-1]) {
		hi--
	}
	if lo == hi {
		return 1, nil
	}
	n := 0
	for _, c := range body[lo:hi] {
		if c < '0' || c > '9' {
			return 0, badCount(body[lo:hi], max)
		}
		n = n*10 + int(c-'0')
		if n > max {
			return 0, badCount(body[lo:hi], max)
		}
	}
	if n < 1 {
		return 0, badCount(body[lo:hi], max)
	}
	return n, nil
}

// isSpace is the ASCII white space strings.TrimSpace removes; a body is ASCII.
func isSpace(c byte) bool {
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'
}

func badCount(s []byte, max int) error {
	return BadRequest("count %s is not a whole number between 1 and %d", Quote(string(s)), max)
}

// ParseID reads the body of a decode request: one decimal ID from 1 to 2^63-1, white
// space around it ignored.
func ParseID(body []byte) (int64, error) {
	s := strings.TrimSpace(string(body))
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, badID(s)
		}
	}
	id, err := strconv.ParseInt(s, 10, 64)
	if err != nil || id < 1 {
		return 0, badID(s)
	}
	return id, nil
}

func badID(s string) error {
	return BadRequest("ID %s is not a whole number between 1 and 9223372036854775807", Quote(s))
}
