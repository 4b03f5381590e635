//go:build !(darwin || dragonfly || freebsd || linux || netbsd || openbsd)

package datadir_test

import (
	"errors"
	"testing"

	"github.com/leafbus/leafbus/internal/datadir"
)

func TestAcquireUnsupported(t *testing.T) {
	dir := t.TempDir()
	if l, err := datadir.Acquire(dir, "n"); !errors.Is(err, errors.ErrUnsupported) {
		if err == nil {
			l.Release()
		}
		t.Fatalf("Acquire(%s) = %v, want errors.ErrUnsupported", dir, err)
	}
}
