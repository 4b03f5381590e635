// Package boundedfile reads the small files an operator names on the command line (a
// --config file, leaf.properties, a key, an NKey seed, a .creds file) with bounds: only
// a regular file (a named pipe would block the start forever, /dev/zero would fill the
// memory), at most a given size, and within a deadline (a file on a hung network
// mount). Every refusal is an error that names the flag and the file.
package boundedfile

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"syscall"
	"time"
)

// Deadline is how long Read waits for a file's bytes.
const Deadline = 10 * time.Second

// ErrNotRegular is returned (wrapped) for a path that is not a regular file.
var ErrNotRegular = errors.New("not a regular file")

// ErrTooLarge is returned (wrapped) for a file above the size given.
var ErrTooLarge = errors.New("file too large")

// Read returns the contents of the regular file at path, of at most limit bytes; the
// errors begin with flag and path ("--config /dev/zero: not a regular file ...").
func Read(flag, path string, limit int64) ([]byte, error) {
	return read(flag, path, limit, Deadline)
}

func read(flag, path string, limit int64, deadline time.Duration) ([]byte, error) {
	fail := func(format string, args ...any) error {
		return fmt.Errorf("%s %s: "+format, append([]any{flag, path}, args...)...)
	}
	// Not opened before it is known to be a regular file: opening a named pipe for
	// reading waits for a writer. O_NONBLOCK covers a file replaced by one in between,
	// and the check is made again on what was opened.
	st, err := os.Stat(path)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", flag, err)
	}
	if !st.Mode().IsRegular() {
		return nil, fail("%w (%s): give the path of a file", ErrNotRegular, kind(st.Mode()))
	}
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", flag, err)
	}
	defer f.Close()
	if st, err = f.Stat(); err != nil {
		return nil, fmt.Errorf("%s: %w", flag, err)
	}
	if !st.Mode().IsRegular() {
		return nil, fail("%w (%s): give the path of a file", ErrNotRegular, kind(st.Mode()))
	}
	if st.Size() > limit {
		return nil, fail("%w: %d bytes, at most %d expected", ErrTooLarge, st.Size(), limit)
	}
	type result struct {
		data []byte
		err  error
	}
	done := make(chan result, 1)
	go func() {
		// One byte more than the limit tells a file that grew past it.
		data, err := io.ReadAll(io.LimitReader(f, limit+1))
		done <- result{data, err}
	}()
	timer := time.NewTimer(deadline)
	defer timer.Stop()
	select {
	case r := <-done:
		switch {
		case r.err != nil:
			return nil, fmt.Errorf("%s: %w", flag, r.err)
		case int64(len(r.data)) > limit:
			return nil, fail("%w: more than %d bytes", ErrTooLarge, limit)
		}
		return r.data, nil
	case <-timer.C:
		// The read goroutine ends when the read returns; closing the file (deferred)
		// lets it.
		return nil, fail("not read within %v", deadline)
	}
}

// kind names a file mode's type for an error.
func kind(m fs.FileMode) string {
	switch {
	case m.IsDir():
		return "a directory"
	case m&fs.ModeNamedPipe != 0:
		return "a named pipe"
	case m&fs.ModeSocket != 0:
		return "a socket"
	case m&fs.ModeCharDevice != 0:
		return "a character device"
	case m&fs.ModeDevice != 0:
		return "a device"
	}
	return "mode " + m.String()
}
