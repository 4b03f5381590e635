package durable

import (
	"bytes"
	"errors"
	"fmt"
	"hash/crc32"
	"strconv"
	"strings"
)

// The data dir's small files are lines of text whose last line is a checksum of every
// byte before it, "crc32 1b2c3d4e" (CRC-32 IEEE, 8 hex digits): a flipped digit, which
// would still parse, is then an error, never a wrong value.

// sumPrefix begins the checksum line.
const sumPrefix = "crc32 "

// AppendSum appends to b the checksum line of b.
func AppendSum(b []byte) []byte {
	return fmt.Appendf(b, "%s%08x\n", sumPrefix, crc32.ChecksumIEEE(b))
}

// Lines checks that data ends with the checksum line of everything before it (as
// AppendSum wrote it) and returns the lines before it, without their newlines; none
// when there are none. An error says what is wrong, for a message that names the file.
func Lines(data []byte) ([]string, error) {
	if len(data) == 0 {
		return nil, errors.New("the file is empty")
	}
	if data[len(data)-1] != '\n' {
		return nil, errors.New("the last line is cut short")
	}
	cut := bytes.LastIndexByte(data[:len(data)-1], '\n') + 1
	body, last := data[:cut], string(data[cut:len(data)-1])
	hex, ok := strings.CutPrefix(last, sumPrefix)
	if !ok || len(hex) != 8 {
		return nil, fmt.Errorf("the last line %s is not the checksum line", strconv.Quote(truncate(last)))
	}
	want, err := strconv.ParseUint(hex, 16, 32)
	if err != nil {
		return nil, fmt.Errorf("the checksum %s is not 8 hex digits", strconv.Quote(hex))
	}
	if got := crc32.ChecksumIEEE(body); uint32(want) != got {
		return nil, fmt.Errorf("the checksum of the content is %08x, the file says %s", got, hex)
	}
	if len(body) == 0 {
		return nil, nil
	}
	return strings.Split(strings.TrimSuffix(string(body), "\n"), "\n"), nil
}

// truncate keeps a quoted line of a damaged file short.
func truncate(s string) string {
	const max = 64
	if len(s) > max {
		return s[:max] + "..."
	}
	return s
}
