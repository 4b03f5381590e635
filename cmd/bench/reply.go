package main

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
)

// ErrNoResponders is returned by parseReply for the status NATS sends when no dispenser
// subscribes to the subject.
var ErrNoResponders = errors.New("no responders")

// ErrBadReply is returned by parseReply when a reply breaks PROTOCOL.md: a body that is
// not the requested number of positive int64 IDs in the requested encoding.
var ErrBadReply = errors.New("bad reply")

// ErrOutOfOrder is returned by parseReply when the IDs inside one reply do not strictly
// increase. It is also an ErrBadReply; the bench exits non-zero when it sees one.
var ErrOutOfOrder = fmt.Errorf("%w: IDs not strictly increasing", ErrBadReply)

// ServiceError is a dispenser's error reply: the NATS services convention's headers.
type ServiceError struct {
	Code        string // Nats-Service-Error-Code, e.g. "503"
	Description string // Nats-Service-Error
}

func (e *ServiceError) Error() string {
	return fmt.Sprintf("service error %s: %s", e.Code, e.Description)
}

// Keys of the errors-by-code table besides the service codes themselves.
const (
	errKeyNoResponders = "no_responders"
	errKeyTimeout      = "timeout"
	errKeyBadReply     = "bad_reply"
	errKeySend         = "send"
)

// errKey is the row of the errors-by-code table that err is counted in.
func errKey(err error) string {
	var se *ServiceError
	switch {
	case errors.As(err, &se):
		return se.Code
	case errors.Is(err, ErrNoResponders):
		return errKeyNoResponders
	default:
		return errKeyBadReply
	}
}

// parseReply checks one reply against the wire contract and appends its IDs to dst.
// The parsing allocates nothing beyond dst's growth: it runs once per reply on the hot
// path of the load generator, for the dispenser and the echo baseline alike.
func parseReply(h nats.Header, data []byte, batch int, binaryEnc bool, dst []uint64) ([]uint64, error) {
	if code := h.Get(micro.ErrorCodeHeader); code != "" {
		return dst, &ServiceError{Code: code, Description: h.Get(micro.ErrorHeader)}
	}
	if len(data) == 0 && h.Get("Status") == "503" {
		return dst, ErrNoResponders
	}
	start := len(dst)
	var err error
	if binaryEnc {
		dst, err = parseBinary(data, batch, dst)
	} else {
		dst, err = parseText(data, dst)
	}
	if err != nil {
		return dst[:start], err
	}
	ids := dst[start:]
	if len(ids) != batch {
		return dst[:start], fmt.Errorf("%w: %d IDs, asked for %d", ErrBadReply, len(ids), batch)
	}
	for i, id := range ids {
		if id == 0 || id > math.MaxInt64 {
			return dst[:start], fmt.Errorf("%w: ID %d is not a positive int64", ErrBadReply, id)
		}
		if i > 0 && id <= ids[i-1] {
			return dst[:start], fmt.Errorf("%w: %d follows %d", ErrOutOfOrder, id, ids[i-1])
		}
	}
	return dst, nil
}

// parseText reads decimal IDs separated by single newlines, with no trailing newline.
func parseText(data []byte, dst []uint64) ([]uint64, error) {
	if len(data) == 0 {
		return dst, fmt.Errorf("%w: empty body", ErrBadReply)
	}
	var v uint64
	digits := 0
	for i, c := range data {
		switch {
		case c >= '0' && c <= '9':
			if v > (math.MaxUint64-9)/10 {
				return dst, fmt.Errorf("%w: number too large at byte %d", ErrBadReply, i)
			}
			v = v*10 + uint64(c-'0')
			digits++
		case c == '\n' && digits > 0:
			dst = append(dst, v)
			v, digits = 0, 0
		default:
			return dst, fmt.Errorf("%w: unexpected byte %q at %d", ErrBadReply, c, i)
		}
	}
	if digits == 0 {
		return dst, fmt.Errorf("%w: trailing newline", ErrBadReply)
	}
	return append(dst, v), nil
}

// parseBinary reads exactly batch eight-byte big-endian IDs.
func parseBinary(data []byte, batch int, dst []uint64) ([]uint64, error) {
	if len(data) != 8*batch {
		return dst, fmt.Errorf("%w: %d bytes, want %d for %d binary IDs", ErrBadReply, len(data), 8*batch, batch)
	}
	for i := 0; i < len(data); i += 8 {
		dst = append(dst, binary.BigEndian.Uint64(data[i:]))
	}
	return dst, nil
}
