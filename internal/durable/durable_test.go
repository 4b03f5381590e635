package durable

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestWriteFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "marks")
	for _, content := range []string{"first\n", "second, longer\n", ""} {
		if err := WriteFile(path, []byte(content)); err != nil {
			t.Fatalf("WriteFile(%q): %v", content, err)
		}
		if got, err := os.ReadFile(path); err != nil || string(got) != content {
			t.Fatalf("after WriteFile(%q): %q, %v", content, got, err)
		}
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Fatalf("the directory holds %d entries after the writes, want the file alone", len(entries))
	}
	if err := WriteFile(filepath.Join(dir, "missing", "f"), []byte("x")); err == nil {
		t.Fatal("WriteFile into a directory that does not exist: no error")
	}
}

func TestRemoveTemps(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "marks")
	for _, name := range []string{"marks" + TempSuffix + "123", "marks" + TempSuffix + "x", "marks", "other" + TempSuffix + "1"} {
		if err := os.WriteFile(filepath.Join(dir, name), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	RemoveTemps(path)
	entries, _ := os.ReadDir(dir)
	var left []string
	for _, e := range entries {
		left = append(left, e.Name())
	}
	if len(left) != 2 || left[0] != "marks" || left[1] != "other"+TempSuffix+"1" {
		t.Fatalf("left %v, want the file and another file's temp", left)
	}
}

func TestSum(t *testing.T) {
	good := AppendSum([]byte("header v1\norders 3001\n"))
	lines, err := Lines(good)
	if err != nil || len(lines) != 2 || lines[0] != "header v1" || lines[1] != "orders 3001" {
		t.Fatalf("Lines(%q) = %q, %v", good, lines, err)
	}
	if lines, err := Lines(AppendSum(nil)); err != nil || lines != nil {
		t.Fatalf("Lines of a checksum alone = %q, %v; want no lines", lines, err)
	}
	flipped := []byte(strings.Replace(string(good), "3001", "3002", 1))
	for _, tt := range []struct {
		name, data, want string
	}{
		{"Empty", "", "empty"},
		{"CutShort", string(good[:len(good)-1]), "cut short"},
		{"NoSum", "header v1\n", "not the checksum line"},
		{"BadHex", "header v1\ncrc32 zzzzzzzz\n", "not 8 hex digits"},
		{"Flipped", string(flipped), "the checksum of the content"},
	} {
		if _, err := Lines([]byte(tt.data)); err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: Lines = %v, want an error saying %q", tt.name, err, tt.want)
		}
	}
}
