package workerid

import (
	"errors"
	"os"
	"path/filepath"
	"testing"
)

func TestCacheFile(t *testing.T) {
	dir := t.TempDir()
	c := CacheFile{Path: filepath.Join(dir, "sub", "workerid.json")}
	_, err := c.Load()
	wantErrIs(t, "Load of a missing file", err, ErrNoRecord)

	for _, want := range []CacheEntry{
		{NodeID: "n1", WorkerID: 3, Timestamp: 1000},
		{NodeID: "n1", WorkerID: 3, Timestamp: 2000},
	} {
		must(t, "Save", c.Save(want))
		got, err := c.Load()
		must(t, "Load", err)
		if got != want {
			t.Fatalf("Load after Save(%+v) = %+v", want, got)
		}
	}
	entries, err := os.ReadDir(filepath.Dir(c.Path))
	must(t, "ReadDir", err)
	if len(entries) != 1 {
		t.Fatalf("cache directory holds %d files, want 1 (no temporary files left)", len(entries))
	}
	raw, err := os.ReadFile(c.Path)
	must(t, "ReadFile", err)
	if string(raw) != `{"node_id":"n1","worker_id":3,"timestamp":2000}` {
		t.Fatalf("file content = %s", raw)
	}
}

// A corrupt file is not "no record": it might have hidden a higher timestamp.
func TestCacheFileCorrupt(t *testing.T) {
	c := CacheFile{Path: filepath.Join(t.TempDir(), "workerid.json")}
	must(t, "WriteFile", os.WriteFile(c.Path, []byte("{not json"), 0o644))
	_, err := c.Load()
	if err == nil || errors.Is(err, ErrNoRecord) {
		t.Fatalf("Load of a corrupt file = %v, want an error that is not ErrNoRecord", err)
	}
}
