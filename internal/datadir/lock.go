package datadir

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"time"
)

// FileName is the name of the lock file inside a data dir.
const FileName = "LOCK"

// ErrInUse is returned (inside an [*InUseError]) by Acquire when another open file
// description, in this process or another, holds the lock on the dir.
var ErrInUse = errors.New("data dir in use")

// Holder is the note a holder writes into LOCK once it holds the lock: one line of JSON.
type Holder struct {
	PID    int       `json:"pid"`
	NodeID string    `json:"node_id"`
	Host   string    `json:"host,omitempty"` // os.Hostname; empty when it failed
	Since  time.Time `json:"since"`          // when Acquire took the lock
}

// InUseError is the error of an Acquire refused because the dir is held. It unwraps to
// ErrInUse.
type InUseError struct {
	Dir string
	// Holder is the holder's note. It is the zero Holder when LOCK held no complete
	// note: the holder took the lock but had not written it yet.
	Holder Holder
}

func (e *InUseError) Error() string {
	h := e.Holder
	if h.PID <= 0 {
		return fmt.Sprintf("data dir %s is in use by another process, which has not recorded itself in %s yet: use another --data-dir or stop that one",
			e.Dir, filepath.Join(e.Dir, FileName))
	}
	host := ""
	if h.Host != "" {
		host = " on " + h.Host
	}
	return fmt.Sprintf("data dir %s is in use by dispenser %q (PID %d%s) since %s: use another --data-dir or stop that one",
		e.Dir, h.NodeID, h.PID, host, h.Since.Format(time.RFC3339))
}

func (e *InUseError) Unwrap() error { return ErrInUse }

// Lock is the exclusive hold of one data dir, from Acquire until Release. Its methods
// may be called from any goroutine.
type Lock struct {
	dir    string
	holder Holder

	mu sync.Mutex
	f  *os.File // nil once released
}

// held keeps every Lock that has not been released reachable. The lock lives as long as
// its *os.File, and an unreachable *os.File is closed by the garbage collector: without
// this, a caller that drops its *Lock would release the dir at some random later moment
// while it still uses it.
var held sync.Map // *Lock -> struct{}

// Acquire creates dir if it is missing (mode 0750), then takes the exclusive lock on
// dir/LOCK without waiting and writes this process's [Holder] note into it, with nodeID
// as the node ID. Call it before anything else opens the dir, and keep the Lock until
// nothing uses the dir any more.
//
// When another open file description holds the lock, in another process or in this one,
// Acquire returns at once an [*InUseError] (errors.Is ErrInUse) that names the holder.
// Any other failure (dir not creatable, not writable, not a dir) is an error naming the
// dir and the cause. A lock left by a process that died is never in the way: the kernel
// released it when the process ended.
func Acquire(dir, nodeID string) (*Lock, error) {
	if dir == "" {
		return nil, errors.New("data dir is empty: it needs a path")
	}
	if err := checkSupported(); err != nil {
		return nil, fmt.Errorf("data dir %s: cannot lock it: %w", dir, err)
	}
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("data dir %s: create it: %w", dir, err)
	}
	path := filepath.Join(dir, FileName)
	// A retry happens only when LOCK was replaced between our open and our flock,
	// which takes someone deleting or renaming it; three tries is plenty.
	for attempt := 0; ; attempt++ {
		f, err := lockFile(dir, path)
		if err != nil {
			return nil, err
		}
		if f == nil {
			if attempt == 2 {
				return nil, fmt.Errorf("data dir %s: %s keeps being replaced while it is locked: is something deleting it?", dir, path)
			}
			continue
		}
		l := &Lock{dir: dir, f: f, holder: Holder{PID: os.Getpid(), NodeID: nodeID, Since: time.Now().Round(0)}}
		l.holder.Host, _ = os.Hostname()
		if err := writeHolder(f, l.holder); err != nil {
			_ = unlock(f)
			_ = f.Close()
			return nil, fmt.Errorf("data dir %s: record the holder in %s: %w", dir, path, err)
		}
		held.Store(l, struct{}{})
		return l, nil
	}
}

// lockFile opens path and takes the lock on it. It returns the locked file; nil and no
// error when path no longer names the file it locked (replaced meanwhile: try again);
// an *InUseError when the lock is held.
func lockFile(dir, path string) (*os.File, error) {
	// os.OpenFile sets O_CLOEXEC: a child process must not inherit the lock.
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o640)
	if err != nil {
		return nil, fmt.Errorf("data dir %s: open the lock file: %w", dir, err)
	}
	ok, err := tryLock(f)
	if err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("data dir %s: flock %s: %w", dir, path, err)
	}
	if !ok {
		h := readHolder(f)
		_ = f.Close()
		return nil, &InUseError{Dir: dir, Holder: h}
	}
	opened, err := f.Stat()
	if err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("data dir %s: stat the lock file: %w", dir, err)
	}
	named, err := os.Stat(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		_ = f.Close()
		return nil, fmt.Errorf("data dir %s: stat the lock file: %w", dir, err)
	}
	if err != nil || !os.SameFile(opened, named) {
		_ = f.Close()
		return nil, nil
	}
	return f, nil
}

// writeHolder replaces the contents of f with h's note and syncs it.
func writeHolder(f *os.File, h Holder) error {
	b, err := json.Marshal(h)
	if err != nil {
		return err
	}
	if err := f.Truncate(0); err != nil {
		return err
	}
	if _, err := f.WriteAt(append(b, '\n'), 0); err != nil {
		return err
	}
	return f.Sync()
}

// Reading the holder's note waits this long at most for a holder that has the lock but
// has not written its note yet (it does so right after taking the lock).
const (
	noteWait  = 100 * time.Millisecond
	notePause = 5 * time.Millisecond
	noteMax   = 4 << 10 // a note is about 100 bytes; LOCK is never read further
)

// readHolder reads the note in f, whose lock someone else holds. It returns the zero
// Holder if no complete note appears within noteWait.
func readHolder(f *os.File) Holder {
	deadline := time.Now().Add(noteWait)
	for {
		if h, ok := parseHolder(f); ok || time.Now().After(deadline) {
			return h
		}
		time.Sleep(notePause)
	}
}

func parseHolder(f *os.File) (Holder, bool) {
	buf := make([]byte, noteMax)
	n, err := f.ReadAt(buf, 0)
	if err != nil && !errors.Is(err, io.EOF) {
		return Holder{}, false
	}
	line, _, complete := bytes.Cut(buf[:n], []byte{'\n'})
	var h Holder
	if !complete || json.Unmarshal(line, &h) != nil || h.PID <= 0 {
		return Holder{}, false
	}
	return h, true
}

// Dir returns the dir as given to Acquire.
func (l *Lock) Dir() string { return l.dir }

// Holder returns the note this Lock wrote into LOCK.
func (l *Lock) Holder() Holder { return l.holder }

// Release clears the note in LOCK and releases the lock; the file stays (see the package
// doc). Call it last, once nothing uses the dir any more. Releasing twice is a no-op.
// The lock is released even when clearing the note fails; that error is returned.
func (l *Lock) Release() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.f == nil {
		return nil
	}
	f := l.f
	l.f = nil
	held.Delete(l)
	var errs []error
	if err := f.Truncate(0); err != nil {
		errs = append(errs, fmt.Errorf("clear the note: %w", err))
	}
	if err := unlock(f); err != nil {
		errs = append(errs, fmt.Errorf("unlock: %w", err))
	}
	// Closing the last descriptor releases the lock even if the unlock above failed.
	if err := f.Close(); err != nil {
		errs = append(errs, fmt.Errorf("close: %w", err))
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("data dir %s: release: %w", l.dir, err)
	}
	return nil
}
