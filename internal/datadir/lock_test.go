//go:build darwin || dragonfly || freebsd || linux || netbsd || openbsd

package datadir_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/leafbus/leafbus/internal/datadir"
)

// mustAcquire takes the lock on dir and releases it at cleanup.
func mustAcquire(tb testing.TB, dir, nodeID string) *datadir.Lock {
	tb.Helper()
	l, err := datadir.Acquire(dir, nodeID)
	if err != nil {
		tb.Fatalf("Acquire(%s, %q) = %v", dir, nodeID, err)
	}
	tb.Cleanup(func() {
		if err := l.Release(); err != nil {
			tb.Errorf("Release = %v", err)
		}
	})
	return l
}

// readNote decodes the note in dir/LOCK, which must be one line of JSON and nothing else.
func readNote(tb testing.TB, dir string) datadir.Holder {
	tb.Helper()
	b, err := os.ReadFile(filepath.Join(dir, datadir.FileName))
	if err != nil {
		tb.Fatal(err)
	}
	if n := strings.Count(string(b), "\n"); n != 1 || !strings.HasSuffix(string(b), "\n") {
		tb.Fatalf("LOCK = %q, want one line of JSON", b)
	}
	var h datadir.Holder
	if err := json.Unmarshal(b, &h); err != nil {
		tb.Fatalf("LOCK = %q: %v", b, err)
	}
	return h
}

// wantInUse checks that err is a refusal naming dir and a holder with pid and nodeID.
func wantInUse(tb testing.TB, err error, dir string, pid int, nodeID string) {
	tb.Helper()
	if !errors.Is(err, datadir.ErrInUse) {
		tb.Fatalf("Acquire(%s) = %v, want ErrInUse", dir, err)
	}
	var inUse *datadir.InUseError
	if !errors.As(err, &inUse) {
		tb.Fatalf("Acquire(%s) = %T, want *InUseError", dir, err)
	}
	if inUse.Holder.PID != pid || inUse.Holder.NodeID != nodeID {
		tb.Errorf("InUseError.Holder = %+v, want PID %d, node %q", inUse.Holder, pid, nodeID)
	}
	for _, want := range []string{"data dir " + dir + " ", fmt.Sprintf("PID %d", pid), fmt.Sprintf("%q", nodeID), "--data-dir"} {
		if !strings.Contains(err.Error(), want) {
			tb.Errorf("Acquire error %q does not contain %q", err, want)
		}
	}
}

func TestAcquire(t *testing.T) {
	t.Run("OK", func(t *testing.T) {
		dir := filepath.Join(t.TempDir(), "not", "yet", "there")
		before := time.Now()
		l := mustAcquire(t, dir, "host-1")
		after := time.Now()

		fi, err := os.Stat(dir)
		if err != nil || !fi.IsDir() || fi.Mode().Perm()&^0o750 != 0 {
			t.Fatalf("Stat(%s) = %v, %v; want a dir of mode 0750 at most", dir, fi, err)
		}
		host, _ := os.Hostname()
		got := readNote(t, dir)
		if got.PID != os.Getpid() || got.NodeID != "host-1" || got.Host != host {
			t.Errorf("note = %+v, want PID %d, node %q, host %q", got, os.Getpid(), "host-1", host)
		}
		if got.Since.Before(before.Add(-time.Second)) || got.Since.After(after.Add(time.Second)) {
			t.Errorf("note.Since = %v, want between %v and %v", got.Since, before, after)
		}
		if !got.Since.Equal(l.Holder().Since) || got.PID != l.Holder().PID || l.Dir() != dir {
			t.Errorf("Lock.Holder() = %+v, Dir() = %s; want the note %+v and %s", l.Holder(), l.Dir(), got, dir)
		}
	})

	t.Run("ErrInUseSameProcess", func(t *testing.T) {
		dir := t.TempDir()
		first := mustAcquire(t, dir, "first")
		start := time.Now()
		l, err := datadir.Acquire(dir, "second")
		if elapsed := time.Since(start); elapsed > time.Second {
			t.Errorf("refusal took %v, want < 1s", elapsed)
		}
		if err == nil {
			l.Release()
		}
		wantInUse(t, err, dir, os.Getpid(), "first")
		if got := readNote(t, dir); got.NodeID != "first" {
			t.Errorf("note after a refused Acquire = %+v, want the holder's (first)", got)
		}

		if err := first.Release(); err != nil {
			t.Fatalf("Release = %v", err)
		}
		mustAcquire(t, dir, "third")
		if got := readNote(t, dir); got.NodeID != "third" {
			t.Errorf("note = %+v, want node third", got)
		}
	})

	t.Run("ErrInUseThroughSymlink", func(t *testing.T) {
		real := filepath.Join(t.TempDir(), "data")
		link := filepath.Join(t.TempDir(), "link")
		mustAcquire(t, real, "real")
		if err := os.Symlink(real, link); err != nil {
			t.Fatal(err)
		}
		l, err := datadir.Acquire(link, "link")
		if err == nil {
			l.Release()
		}
		wantInUse(t, err, link, os.Getpid(), "real")
	})

	t.Run("StaleNoteOverwritten", func(t *testing.T) {
		// What a holder killed with SIGKILL leaves: its note, and no lock.
		dir := t.TempDir()
		stale := `{"pid":999999,"node_id":"` + strings.Repeat("long-dead-node-", 20) + `","since":"2001-01-01T00:00:00Z"}` + "\n"
		if err := os.WriteFile(filepath.Join(dir, datadir.FileName), []byte(stale), 0o640); err != nil {
			t.Fatal(err)
		}
		mustAcquire(t, dir, "new")
		if got := readNote(t, dir); got.PID != os.Getpid() || got.NodeID != "new" {
			t.Errorf("note = %+v, want this process as node new", got)
		}
	})

	t.Run("GarbageNoteOverwritten", func(t *testing.T) {
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, datadir.FileName), []byte("\x00\x00not json"), 0o640); err != nil {
			t.Fatal(err)
		}
		mustAcquire(t, dir, "new")
		if got := readNote(t, dir); got.NodeID != "new" {
			t.Errorf("note = %+v, want node new", got)
		}
	})
}

func TestRelease(t *testing.T) {
	dir := t.TempDir()
	l, err := datadir.Acquire(dir, "n")
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Release(); err != nil {
		t.Fatalf("Release = %v", err)
	}
	if err := l.Release(); err != nil {
		t.Fatalf("second Release = %v, want nil", err)
	}
	b, err := os.ReadFile(filepath.Join(dir, datadir.FileName))
	if err != nil || len(b) != 0 {
		t.Fatalf("LOCK after Release = %q, %v; want an empty file that still exists", b, err)
	}
}

func TestAcquireUnusableDir(t *testing.T) {
	tests := []struct {
		name    string
		setup   func(t *testing.T) string // returns the dir to lock
		wantMsg string
	}{
		{"Empty", func(*testing.T) string { return "" }, "data dir is empty"},
		{"DirIsAFile", func(t *testing.T) string {
			return writeFile(t, filepath.Join(t.TempDir(), "file"))
		}, "not a directory"},
		{"ParentIsAFile", func(t *testing.T) string {
			return filepath.Join(writeFile(t, filepath.Join(t.TempDir(), "file")), "data")
		}, "not a directory"},
		{"LockIsADir", func(t *testing.T) string {
			dir := t.TempDir()
			if err := os.Mkdir(filepath.Join(dir, datadir.FileName), 0o750); err != nil {
				t.Fatal(err)
			}
			return dir
		}, "is a directory"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := tt.setup(t)
			l, err := datadir.Acquire(dir, "n")
			if err == nil {
				l.Release()
				t.Fatalf("Acquire(%q) succeeded, want an error", dir)
			}
			if errors.Is(err, datadir.ErrInUse) {
				t.Errorf("Acquire(%q) = %v, which is ErrInUse; want another error", dir, err)
			}
			if !strings.Contains(err.Error(), "data dir "+dir) || !strings.Contains(err.Error(), tt.wantMsg) {
				t.Errorf("Acquire(%q) = %q, want it to name the dir and say %q", dir, err, tt.wantMsg)
			}
		})
	}
}

func writeFile(tb testing.TB, path string) string {
	tb.Helper()
	if err := os.WriteFile(path, nil, 0o640); err != nil {
		tb.Fatal(err)
	}
	return path
}

func TestInUseErrorMessage(t *testing.T) {
	since := time.Date(2026, 11, 23, 11, 0, 0, 0, time.UTC)
	tests := []struct {
		name string
		err  *datadir.InUseError
		want string
	}{
		{"Holder", &datadir.InUseError{Dir: "./leafbus-data", Holder: datadir.Holder{PID: 1234, NodeID: "host-1", Host: "box", Since: since}},
			`data dir ./leafbus-data is in use by dispenser "host-1" (PID 1234 on box) since 2026-11-23T11:00:00Z: use another --data-dir or stop that one`},
		{"NoHost", &datadir.InUseError{Dir: "/d", Holder: datadir.Holder{PID: 7, NodeID: "n", Since: since}},
			`data dir /d is in use by dispenser "n" (PID 7) since 2026-11-23T11:00:00Z: use another --data-dir or stop that one`},
		{"NoNoteYet", &datadir.InUseError{Dir: "/d"},
			`data dir /d is in use by another process, which has not recorded itself in /d/LOCK yet: use another --data-dir or stop that one`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.err.Error(); got != tt.want {
				t.Errorf("Error() = %q\nwant      %q", got, tt.want)
			}
			if !errors.Is(tt.err, datadir.ErrInUse) {
				t.Errorf("errors.Is(%v, ErrInUse) = false", tt.err)
			}
		})
	}
}
