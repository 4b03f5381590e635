package boundedfile

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// TestRead: a regular file within the limit is read; a directory, /dev/zero, a named
// pipe (which would block an open) and a file above the limit are refused at once,
// naming the flag and the path.
func TestRead(t *testing.T) {
	dir := t.TempDir()
	small := filepath.Join(dir, "small")
	if err := os.WriteFile(small, []byte("0123456789"), 0o600); err != nil {
		t.Fatal(err)
	}
	got, err := Read("--config", small, 10)
	if err != nil || string(got) != "0123456789" {
		t.Fatalf("Read(small) = %q, %v", got, err)
	}
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		path  string
		limit int64
		want  error
		text  string
	}{
		{small, 9, ErrTooLarge, "--config " + small + ": file too large: 10 bytes, at most 9"},
		{dir, 1 << 20, ErrNotRegular, "--config " + dir + ": not a regular file (a directory)"},
		{"/dev/zero", 1 << 20, ErrNotRegular, "--config /dev/zero: not a regular file (a character device)"},
		{fifo, 1 << 20, ErrNotRegular, "--config " + fifo + ": not a regular file (a named pipe)"},
		{filepath.Join(dir, "missing"), 1 << 20, os.ErrNotExist, "--config: stat " + filepath.Join(dir, "missing")},
	} {
		_, err := Read("--config", tt.path, tt.limit)
		if !errors.Is(err, tt.want) || !strings.HasPrefix(err.Error(), tt.text) {
			t.Errorf("Read(%s, %d) = %v, want %v starting %q", tt.path, tt.limit, err, tt.want, tt.text)
		}
	}
}
