package workerid

import (
	"context"
	"errors"
	"testing"
)

func TestNewStaticRegistry(t *testing.T) {
	tests := []struct {
		name     string
		workerID int64
		max      int64
		wantErr  error
	}{
		{"OK/zero", 0, 1023, nil},
		{"OK/max", 1023, 1023, nil},
		{"OK/only", 0, 0, nil},
		{"ErrInvalidConfig/negative", -1, 1023, ErrInvalidConfig},
		{"ErrInvalidConfig/above", 1024, 1023, ErrInvalidConfig},
		{"ErrInvalidConfig/negative max", 0, -1, ErrInvalidConfig},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := NewStaticRegistry(tt.workerID, tt.max)
			if tt.wantErr != nil {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("NewStaticRegistry(%d, %d) = %v, want %v", tt.workerID, tt.max, err, tt.wantErr)
				}
				return
			}
			must(t, "NewStaticRegistry", err)
			l, err := r.Acquire(context.Background())
			must(t, "Acquire", err)
			if l.WorkerID() != tt.workerID || l.TTL() != 0 || l.Recorded() != 0 {
				t.Fatalf("lease = (id %d, ttl %s, recorded %d), want (%d, 0, 0)", l.WorkerID(), l.TTL(), l.Recorded(), tt.workerID)
			}
			must(t, "Renew", l.Renew(context.Background(), 123))
			must(t, "Release", l.Release(context.Background(), 124))
		})
	}
}
