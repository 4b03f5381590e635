//go:build darwin || dragonfly || freebsd || linux || netbsd || openbsd

package datadir

import (
	"errors"
	"os"
	"syscall"
)

// The package uses syscall rather than golang.org/x/sys/unix: flock is all it needs, and
// syscall has it on every system in the build constraint without making x/sys a direct dependency.

func checkSupported() error { return nil }

// tryLock takes an exclusive flock on f without waiting. It reports false, and no error,
// when someone else holds it.
func tryLock(f *os.File) (bool, error) {
	err := flock(f, syscall.LOCK_EX|syscall.LOCK_NB)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, syscall.EWOULDBLOCK):
		return false, nil
	}
	return false, err
}

func unlock(f *os.File) error { return flock(f, syscall.LOCK_UN) }

// flock calls flock(2) on f's descriptor, again when a signal interrupts it.
func flock(f *os.File, how int) error {
	rc, err := f.SyscallConn()
	if err != nil {
		return err
	}
	var ferr error
	if err := rc.Control(func(fd uintptr) {
		for {
			ferr = syscall.Flock(int(fd), how)
			if !errors.Is(ferr, syscall.EINTR) {
				return
			}
		}
	}); err != nil {
		return err
	}
	return ferr
}
