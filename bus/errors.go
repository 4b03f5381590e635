package bus

import (
	"errors"
	"fmt"
	"strconv"

	"github.com/leafbus/leafbus/segment"
	"github.com/leafbus/leafbus/snowflake"
	"github.com/leafbus/leafbus/workerid"
)

// The wire's error classes (PROTOCOL.md "Errors"). A dispenser's reply error and a
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
)

// codes maps errors to wire codes; the first match wins and anything else is 500. This
// table is the only place that knows both the packages' sentinels and the wire.
var codes = []struct {
	err  error
	code int
}{
	{ErrBadRequest, 400},
	{segment.ErrInvalidTag, 400},
	{snowflake.ErrInvalidID, 400},
	{ErrNotFound, 404},
	{segment.ErrTagNotFound, 404},
	{ErrConflict, 409},
	{segment.ErrTagExists, 409},
	{ErrUnavailable, 503},
	{segment.ErrUnavailable, 503},
	{snowflake.ErrClockBackwards, 503},
	{snowflake.ErrTimestampOverflow, 503},
	{snowflake.ErrCeiling, 503},
	{snowflake.ErrSuspended, 503},
	{workerid.ErrLeaseLost, 503},
}

// codeOf returns the wire code for err and the description to send. A 500 hides the
// details (they are logged instead); every other code names what was wrong.
func codeOf(err error) (int, string) {
	for _, c := range codes {
		if errors.Is(err, c.err) {
			return c.code, err.Error()
		}
	}
	return 500, "internal error"
}

// badRequest is a 400 whose message names the bad value.
func badRequest(format string, args ...any) error {
	return &requestError{msg: fmt.Sprintf(format, args...)}
}

type requestError struct{ msg string }

func (e *requestError) Error() string        { return e.msg }
func (e *requestError) Is(target error) bool { return target == ErrBadRequest }

// Error is an error reply as a client sees it: the Nats-Service-Error-Code and
// Nats-Service-Error headers. It matches ErrBadRequest, ErrNotFound, ErrConflict,
// ErrUnavailable or ErrInternal by its code.
type Error struct {
	Code        int
	Description string
}

func (e *Error) Error() string {
	return fmt.Sprintf("leafbus %d: %s", e.Code, e.Description)
}

// Is makes errors.Is(err, bus.ErrUnavailable) and friends work on replies.
func (e *Error) Is(target error) bool {
	switch target {
	case ErrBadRequest:
		return e.Code == 400
	case ErrNotFound:
		return e.Code == 404
	case ErrConflict:
		return e.Code == 409
	case ErrUnavailable:
		return e.Code == 503
	case ErrInternal:
		return e.Code == 500
	}
	return false
}

// replyError reads the service error headers of a reply; nil when it is not an error.
func replyError(code, description string) error {
	if code == "" {
		return nil
	}
	n, err := strconv.Atoi(code)
	if err != nil {
		n = 500
	}
	return &Error{Code: n, Description: description}
}
