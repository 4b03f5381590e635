package core

import (
	"errors"

	"github.com/leafbus/leafbus/segment"
	"github.com/leafbus/leafbus/snowflake"
	"github.com/leafbus/leafbus/wire"
	"github.com/leafbus/leafbus/workerid"
)

// classes gives the wire class of each of the packages' sentinels, and of the wire
// classes themselves; the codes are package wire's. The first match wins, so an error
// that is both a bad request and, say, unavailable is a 400. This is the one place that
// knows both the packages' errors and the wire.
var classes = []struct{ err, class error }{
	{wire.ErrBadRequest, wire.ErrBadRequest},
	{segment.ErrTagSpelling, wire.ErrBadRequest}, // names the stored tag; also an ErrInvalidTag
	{segment.ErrInvalidTag, wire.ErrBadRequest},
	{snowflake.ErrInvalidID, wire.ErrBadRequest},
	{wire.ErrNotFound, wire.ErrNotFound},
	{segment.ErrTagNotFound, wire.ErrNotFound},
	{wire.ErrConflict, wire.ErrConflict},
	{segment.ErrTagExists, wire.ErrConflict},
	{wire.ErrUnavailable, wire.ErrUnavailable},
	{segment.ErrUnavailable, wire.ErrUnavailable},
	{snowflake.ErrClockBackwards, wire.ErrUnavailable},
	{snowflake.ErrTimestampOverflow, wire.ErrUnavailable},
	{snowflake.ErrCeiling, wire.ErrUnavailable},
	{snowflake.ErrSuspended, wire.ErrUnavailable},
	{workerid.ErrLeaseLost, wire.ErrUnavailable},
}

// CodeOf returns the wire code for err and the description to send. A 500 hides the
// details (the caller logs them instead); every other code names what was wrong.
func CodeOf(err error) (int, string) {
	for _, c := range classes {
		if errors.Is(err, c.err) {
			return wire.ClassCode(c.class), err.Error()
		}
	}
	return 500, "internal error"
}
