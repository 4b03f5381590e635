package workerid

import (
	"errors"
	"strings"
	"testing"
)

func TestCheckNodeID(t *testing.T) {
	tests := []struct {
		name    string
		id      string
		wantErr error
	}{
		{"OK", "node-1_A", nil},
		{"OK64", strings.Repeat("a", 64), nil},
		{"ErrInvalidNodeID/empty", "", ErrInvalidNodeID},
		{"ErrInvalidNodeID/65", strings.Repeat("a", 65), ErrInvalidNodeID},
		{"ErrInvalidNodeID/dot", "a.b", ErrInvalidNodeID},
		{"ErrInvalidNodeID/space", "a b", ErrInvalidNodeID},
		{"ErrInvalidNodeID/wildcard", "a*", ErrInvalidNodeID},
		{"ErrInvalidNodeID/unicode", "nöde", ErrInvalidNodeID},
		{"ErrInvalidNodeID/worker key", "worker-12", ErrInvalidNodeID},
		{"OK/worker-like", "worker-a1", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := CheckNodeID(tt.id)
			if !errors.Is(err, tt.wantErr) || (tt.wantErr == nil) != (err == nil) {
				t.Fatalf("CheckNodeID(%q) = %v, want %v", tt.id, err, tt.wantErr)
			}
		})
	}
}
