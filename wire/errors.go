package wire

import (
	"errors"
	"fmt"
	"strconv"
)

// The protocol's error classes (PROTOCOL.md "Errors"). A dispenser's error and a
// client's *Error both match them with errors.Is.
var (
	// ErrBadRequest is returned for a malformed request (code 400): bad count, tag, ID or encoding.
	ErrBadRequest = errors.New("bad request")
	// ErrNotFound is returned when a segment tag does not exist (code 404).
	ErrNotFound = errors.New("not found")
	// ErrConflict is returned when a tag to add already exists (code 409).
	ErrConflict = errors.New("conflict")
	// ErrUnavailable is returned when the dispenser cannot dispense safely right now (code 503):
	// starting, segment store unreachable with both buffers spent, clock behind, lease lost.
	ErrUnavailable = errors.New("unavailable")
	// ErrInternal is returned for anything unexpected (code 500).
	ErrInternal = errors.New("internal error")
	// ErrBadReply is returned by DecodeIDs for a reply body that breaks the protocol.
	ErrBadReply = errors.New("bad reply")
	// ErrOutOfOrder is returned by DecodeIDs when every ID of a reply is well formed but
	// they do not strictly increase: a broken promise rather than a malformed body. It
	// also matches ErrBadReply.
	ErrOutOfOrder = fmt.Errorf("%w: IDs not strictly increasing", ErrBadReply)
)

// classes pairs each error class with its code: ClassCode and Error.Is read it (the
// dispenser's own errors reach a class through core.CodeOf, the one table of them).
var classes = []struct {
	err  error
	code int
}{
	{ErrBadRequest, 400},
	{ErrNotFound, 404},
	{ErrConflict, 409},
	{ErrUnavailable, 503},
	{ErrInternal, 500},
}

// ClassCode returns the code of an error class (ErrBadRequest: 400, ...), or 0 when
// err matches none of them.
func ClassCode(err error) int {
	for _, c := range classes {
		if errors.Is(err, c.err) {
			return c.code
		}
	}
	return 0
}

// BadRequest is a 400 whose message names the bad value. Its Error is the message
// alone, so it reads well inside a wrapped error and on the wire.
func BadRequest(format string, args ...any) error {
	return &requestError{msg: fmt.Sprintf(format, args...)}
}

type requestError struct{ msg string }

func (e *requestError) Error() string        { return e.msg }
func (e *requestError) Is(target error) bool { return target == ErrBadRequest }

// Error is an error reply as a caller sees it: the code and reason a dispenser sent (the
// Nats-Service-Error-Code and Nats-Service-Error headers, or an HTTP status and body).
// It matches ErrBadRequest, ErrNotFound, ErrConflict, ErrUnavailable or ErrInternal by
// its code with errors.Is.
type Error struct {
	Code        int
	Description string
}

func (e *Error) Error() string {
	return fmt.Sprintf("leafbus %d: %s", e.Code, e.Description)
}

// Is makes errors.Is(err, wire.ErrUnavailable) and friends work on replies.
func (e *Error) Is(target error) bool {
	for _, c := range classes {
		if c.err == target {
			return e.Code == c.code
		}
	}
	return false
}

// ReplyError reads the service error headers of a reply: nil when code is empty (not an
// error), else an *Error. A code that is not a number counts as 500.
func ReplyError(code, description string) error {
	if code == "" {
		return nil
	}
	n, err := strconv.Atoi(code)
	if err != nil {
		n = 500
	}
	return &Error{Code: n, Description: description}
}
