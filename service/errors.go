package service

import (
	"errors"

	"github.com/leafbus/leafbus/segment"
	"github.com/leafbus/leafbus/snowflake"
	"github.com/leafbus/leafbus/wire"
	"github.com/leafbus/leafbus/workerid"
)

// codes maps errors to wire codes; the first match wins and anything else is 500. This
// table is the only place that knows both the packages' sentinels and the wire; the
// NATS endpoints and the HTTP face both answer through CodeOf.
var codes = []struct {
	err  error
	code int
}{
	{wire.ErrBadRequest, 400},
	{segment.ErrInvalidTag, 400},
	{snowflake.ErrInvalidID, 400},
	{wire.ErrNotFound, 404},
	{segment.ErrTagNotFound, 404},
	{wire.ErrConflict, 409},
	{segment.ErrTagExists, 409},
	{wire.ErrUnavailable, 503},
	{segment.ErrUnavailable, 503},
	{snowflake.ErrClockBackwards, 503},
	{snowflake.ErrTimestampOverflow, 503},
	{snowflake.ErrCeiling, 503},
	{snowflake.ErrSuspended, 503},
	{workerid.ErrLeaseLost, 503},
}

// CodeOf returns the wire code for err and the description to send. A 500 hides the
// details (the caller logs them instead); every other code names what was wrong.
func CodeOf(err error) (int, string) {
	for _, c := range codes {
		if errors.Is(err, c.err) {
			return c.code, err.Error()
		}
	}
	return 500, "internal error"
}
