package cpuprofile

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestStartWritesAProfile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "cpu.out")
	stop, err := Start(path)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := Start(filepath.Join(t.TempDir(), "second.out")); err == nil || !strings.Contains(err.Error(), "--cpuprofile") {
		t.Errorf("a second profile at once = %v, want an error naming --cpuprofile", err)
	}
	if err := stop(); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(b) < 2 || b[0] != 0x1f || b[1] != 0x8b { // pprof writes gzipped protobuf
		t.Fatalf("%s holds %d bytes, not a gzipped pprof profile", path, len(b))
	}
}

func TestStartBadPath(t *testing.T) {
	if _, err := Start(filepath.Join(t.TempDir(), "missing", "cpu.out")); err == nil || !strings.Contains(err.Error(), "--cpuprofile") {
		t.Errorf("Start in a missing directory = %v, want an error naming --cpuprofile", err)
	}
}
