package workerid

import (
	"errors"
	"fmt"

	"github.com/leafbus/leafbus/wire"
)

// ErrInvalidNodeID is returned when a node ID is not 1 to 64 characters of
// A-Z a-z 0-9 _ - (PROTOCOL.md). Node IDs become KV keys and header values, so nothing
// else is allowed.
var ErrInvalidNodeID = errors.New("invalid node ID")

// CheckNodeID returns an error wrapping ErrInvalidNodeID when id is not a valid node ID
// (wire.CheckNodeID).
func CheckNodeID(id string) error {
	if err := wire.CheckNodeID(id); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidNodeID, err)
	}
	return nil
}
