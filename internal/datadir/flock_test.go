//go:build darwin || dragonfly || freebsd || linux || netbsd || openbsd

package datadir

import (
	"errors"
	"os"
	"path/filepath"
	"runtime"
	"syscall"
	"testing"
	"time"
)

// TestFlockPerOpenFileDescription pins down the kernel behaviour the package relies on:
// flock belongs to the open file description, so a second open of the same file in the
// same process conflicts (fcntl locks would not), while a dup of the first descriptor
// shares its lock.
func TestFlockPerOpenFileDescription(t *testing.T) {
	path := filepath.Join(t.TempDir(), FileName)
	open := func() *os.File {
		t.Helper()
		f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o640)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		return f
	}
	try := func(name string, f *os.File, want bool) {
		t.Helper()
		got, err := tryLock(f)
		if err != nil || got != want {
			t.Fatalf("tryLock(%s) = %v, %v; want %v, nil", name, got, err, want)
		}
	}
	first, second := open(), open()
	try("first", first, true)
	try("second open, same process", second, false)

	fd, err := syscall.Dup(int(first.Fd()))
	if err != nil {
		t.Fatal(err)
	}
	dup := os.NewFile(uintptr(fd), "dup of first")
	t.Cleanup(func() { dup.Close() })
	try("dup of first (same description)", dup, true)

	if err := unlock(first); err != nil {
		t.Fatalf("unlock(first) = %v", err)
	}
	try("second after first unlocked", second, true)
	try("first while second holds", first, false)
}

// TestDroppedLockStaysHeld: a Lock nobody references any more must not be released by
// the garbage collector closing its file.
func TestDroppedLockStaysHeld(t *testing.T) {
	dir := t.TempDir()
	func() {
		if _, err := Acquire(dir, "dropped"); err != nil {
			t.Fatalf("Acquire = %v", err)
		}
	}()
	t.Cleanup(func() {
		held.Range(func(k, _ any) bool {
			if l := k.(*Lock); l.Dir() == dir {
				_ = l.Release()
			}
			return true
		})
	})
	for i := 0; i < 3; i++ {
		runtime.GC()
		time.Sleep(20 * time.Millisecond) // let finalizers and cleanups run
	}
	if l, err := Acquire(dir, "second"); err == nil {
		l.Release()
		t.Fatal("Acquire after the first Lock was dropped and collected succeeded; want ErrInUse")
	}
}

// TestAcquireWhileNoteUnwritten: a holder that has the lock but has not written its note
// yet. A refused Acquire waits a little for the note, and without one still refuses.
func TestAcquireWhileNoteUnwritten(t *testing.T) {
	lockBare := func(t *testing.T, dir string) *os.File {
		t.Helper()
		f, err := os.OpenFile(filepath.Join(dir, FileName), os.O_RDWR|os.O_CREATE, 0o640)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		if ok, err := tryLock(f); !ok || err != nil {
			t.Fatalf("tryLock = %v, %v", ok, err)
		}
		return f
	}
	acquire := func(t *testing.T, dir string) (*InUseError, time.Duration) {
		t.Helper()
		start := time.Now()
		l, err := Acquire(dir, "second")
		elapsed := time.Since(start)
		if err == nil {
			l.Release()
		}
		var inUse *InUseError
		if !errors.As(err, &inUse) {
			t.Fatalf("Acquire = %v, want *InUseError", err)
		}
		return inUse, elapsed
	}

	t.Run("NeverWritten", func(t *testing.T) {
		dir := t.TempDir()
		lockBare(t, dir)
		inUse, elapsed := acquire(t, dir)
		if inUse.Holder != (Holder{}) || elapsed > time.Second {
			t.Errorf("Acquire = %+v after %v, want no holder within 1s", inUse, elapsed)
		}
	})
	t.Run("WrittenSoon", func(t *testing.T) {
		dir := t.TempDir()
		f := lockBare(t, dir)
		h := Holder{PID: 4242, NodeID: "slow", Since: time.Now().Round(0)}
		go func() {
			time.Sleep(noteWait / 4)
			_ = writeHolder(f, h)
		}()
		inUse, _ := acquire(t, dir)
		if inUse.Holder.PID != h.PID || inUse.Holder.NodeID != h.NodeID {
			t.Errorf("Acquire named %+v, want %+v", inUse.Holder, h)
		}
	})
}
