package snowflake

import "errors"

var (
	// ErrClockBackwards is returned when the clock reads earlier than it did before by more
	// than the generator waits out, or is still behind after the wait; the message names the
	// offset. It is also returned while the clock has not passed the Floor (or the layout's
	// epoch), since issuing then could repeat a timestamp an earlier holder of the worker ID
	// used. The condition clears by itself once the clock catches up.
	ErrClockBackwards = errors.New("snowflake: clock moved backwards")

	// ErrTimestampOverflow is returned when the timestamp to issue is past the last one the
	// layout's time bits can hold ([Layout.MaxTimestamp]). The generator refuses instead of
	// wrapping into negative or repeated IDs; the only fix is a new layout or epoch.
	ErrTimestampOverflow = errors.New("snowflake: timestamp overflows the layout")

	// ErrCeiling is returned when issuing would need a timestamp past the ceiling set with
	// [Generator.SetCeiling]: the heartbeat record that vouches for this worker ID is behind.
	// It clears when the ceiling is raised or removed.
	ErrCeiling = errors.New("snowflake: timestamp past the ceiling")

	// ErrSuspended is returned (wrapping the reason given to [Generator.Suspend]) while the
	// generator is suspended, e.g. because its worker-ID lease was lost.
	ErrSuspended = errors.New("snowflake: generator suspended")

	// ErrInvalidID is returned by [Layout.Decode] for an ID that no generator issues: zero or
	// negative.
	ErrInvalidID = errors.New("snowflake: invalid ID")

	// ErrInvalidConfig is returned (wrapped, naming the field, its value and the bound) by
	// [Layout.Validate], [Layout.Decode] and [New] when a setting is out of range.
	ErrInvalidConfig = errors.New("snowflake: invalid config")
)
