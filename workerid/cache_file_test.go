package workerid

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestCacheFile(t *testing.T) {
	dir := t.TempDir()
	c := CacheFile{Path: filepath.Join(dir, "sub", "workerid.json")}
	_, err := c.Load()
	wantErrIs(t, "Load of a missing file", err, ErrNoRecord)

	for _, want := range []cacheEntry{
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

// A corrupt file is not "no record": it might have hidden a higher timestamp. Load
// names the file, quotes a bounded part of it and wraps ErrCorruptCacheFile, which the
// dispenser's start does not wait out.
func TestCacheFileCorrupt(t *testing.T) {
	tests := []struct{ name, content, wantMsg string }{
		{"NotJSON", "{not json", `holds "{not json": invalid character`},
		{"Empty", "", `holds "": unexpected end of JSON input`},
		{"Null", "null", "no node_id"},
		{"EmptyObject", "{}", "no node_id"},
		{"Array", "[1]", "cannot unmarshal array"},
		{"Trailing", `{"node_id":"n1","worker_id":3,"timestamp":2000}x`, "invalid character 'x' after top-level value"},
		{"NegativeWorkerID", `{"node_id":"n1","worker_id":-1,"timestamp":2000}`, "worker_id -1"},
		{"NoTimestamp", `{"node_id":"n1","worker_id":3}`, "timestamp 0"},
		{"NegativeCeiling", `{"node_id":"n1","worker_id":3,"timestamp":2000,"ceiling":-5}`, "ceiling -5"},
		{"Large", strings.Repeat("\x00", 1<<20), "... (1048576 bytes)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := CacheFile{Path: filepath.Join(t.TempDir(), "workerid.json")}
			must(t, "WriteFile", os.WriteFile(c.Path, []byte(tt.content), 0o644))
			_, err := c.Load()
			wantErrIs(t, "Load of a corrupt file", err, ErrCorruptCacheFile)
			if errors.Is(err, ErrNoRecord) {
				t.Fatalf("Load of a corrupt file = %v, which is ErrNoRecord", err)
			}
			for _, want := range []string{c.Path, tt.wantMsg} {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("Load = %v, want the message to contain %q", err, want)
				}
			}
			if len(err.Error()) > 1024 {
				t.Errorf("Load's message is %d bytes, want the file quoted within bounds", len(err.Error()))
			}
		})
	}
}
