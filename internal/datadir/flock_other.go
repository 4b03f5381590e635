//go:build !(darwin || dragonfly || freebsd || linux || netbsd || openbsd)

package datadir

import (
	"errors"
	"fmt"
	"os"
	"runtime"
)

// checkSupported refuses: without flock this package cannot guarantee one process per
// dir, and running unguarded is how IDs get handed out twice.
func checkSupported() error {
	return fmt.Errorf("flock(2) is not available on %s: %w", runtime.GOOS, errors.ErrUnsupported)
}

func tryLock(*os.File) (bool, error) { return false, checkSupported() }

func unlock(*os.File) error { return checkSupported() }
