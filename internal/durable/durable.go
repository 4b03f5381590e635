// Package durable writes the small files a dispenser keeps in its data dir (the segment
// high-water marks, the monotonic tags it served, the worker-ID cache file) so that a
// crash or a power loss leaves either the old content or the new one, whole.
package durable

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// TempSuffix marks the temp files WriteFile makes beside a file: <file>.tmp-<random>.
const TempSuffix = ".tmp-"

// WriteFile replaces path with data so that, whatever crashes when, path then holds
// either its old content or data, whole: data goes to a temp file in the same directory
// (a rename is atomic only within one file system), which is fsynced before the rename,
// and the directory is fsynced after it, which makes the rename itself survive a power
// loss. The directory must exist.
func WriteFile(path string, data []byte) error {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, filepath.Base(path)+TempSuffix+"*")
	if err != nil {
		return err
	}
	tmp := f.Name()
	renamed := false
	defer func() {
		if !renamed {
			os.Remove(tmp)
		}
	}()
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	if err := os.Rename(tmp, path); err != nil {
		return err
	}
	renamed = true
	return SyncDir(dir)
}

// SyncDir fsyncs a directory, making the entries created or renamed in it durable.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	if err := d.Sync(); err != nil {
		d.Close()
		return fmt.Errorf("fsync directory %q: %w", dir, err)
	}
	return d.Close()
}

// RemoveTemps deletes the temp files of path that a crash left behind. They are never
// read, so failing to is harmless and errors are ignored.
func RemoveTemps(path string) {
	dir := filepath.Dir(path)
	entries, err := os.ReadDir(dir)
	if err != nil {
		return
	}
	prefix := filepath.Base(path) + TempSuffix
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), prefix) {
			os.Remove(filepath.Join(dir, e.Name()))
		}
	}
}
