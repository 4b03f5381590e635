package workerid

import (
	"errors"
	"fmt"
)

// ErrInvalidNodeID is returned when a node ID is not 1 to 64 characters of
// A-Z a-z 0-9 _ - (PROTOCOL.md). Node IDs become KV keys and header values, so nothing
// else is allowed.
var ErrInvalidNodeID = errors.New("invalid node ID")

// ErrInvalidConfig is returned when a configuration value is out of range or two values
// contradict each other; the message names the fields, values and bounds.
var ErrInvalidConfig = errors.New("invalid configuration")

// maxNodeIDLen is PROTOCOL.md's bound on node IDs.
const maxNodeIDLen = 64

// CheckNodeID returns an error wrapping ErrInvalidNodeID when id is not a valid node ID.
func CheckNodeID(id string) error {
	if len(id) == 0 || len(id) > maxNodeIDLen {
		return fmt.Errorf("%w: %q has %d characters, want 1 to %d", ErrInvalidNodeID, id, len(id), maxNodeIDLen)
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		ok := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '-'
		if !ok {
			return fmt.Errorf("%w: %q has %q at offset %d, want only A-Z a-z 0-9 _ -", ErrInvalidNodeID, id, c, i)
		}
	}
	return nil
}
