package workerid

import (
	"errors"
	"fmt"
	"strings"

	"github.com/leafbus/leafbus/wire"
)

// ErrInvalidNodeID is returned when a node ID is not 1 to 64 characters of
// A-Z a-z 0-9 _ - (PROTOCOL.md). Node IDs become KV keys and header values, so nothing
// else is allowed.
var ErrInvalidNodeID = errors.New("invalid node ID")

// CheckNodeID returns an error wrapping ErrInvalidNodeID when id is not a valid node ID
// (wire.CheckNodeID), or when it is a worker ID's key in the forever bucket
// (worker-<digits>, WorkerKey): that node's records would overwrite the worker ID's.
func CheckNodeID(id string) error {
	if err := wire.CheckNodeID(id); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidNodeID, err)
	}
	if digits, ok := strings.CutPrefix(id, "worker-"); ok && digits != "" && strings.Trim(digits, "0123456789") == "" {
		return fmt.Errorf("%w: %q is the forever bucket's key of a worker ID's record (worker-<id>); choose another node ID", ErrInvalidNodeID, id)
	}
	return nil
}
