package monotonic

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/leafbus/leafbus/internal/durable"
	"github.com/leafbus/leafbus/wire"
)

// TestMemoryKeepsTags: a tag set is in the file when set returns, survives a reopen,
// and leaves it when removed; leftover temp files of a crashed write are removed.
func TestMemoryKeepsTags(t *testing.T) {
	path := filepath.Join(t.TempDir(), "monotonic.tags")
	m, err := openMemory(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(m.all()) != 0 {
		t.Fatalf("a new memory holds %v", m.all())
	}
	for _, tag := range []string{"orders", "payments", "Orders"} {
		if err := m.set(tag, true); err != nil {
			t.Fatal(err)
		}
	}
	if err := m.set("payments", false); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path+durable.TempSuffix+"123", []byte("half a write"), 0o600); err != nil {
		t.Fatal(err)
	}
	again, err := openMemory(path)
	if err != nil {
		t.Fatalf("reopen: %v", err)
	}
	if want := map[string]bool{"orders": true, "Orders": true}; !maps.Equal(again.all(), want) {
		t.Fatalf("after a reopen the memory holds %v, want %v", again.all(), want)
	}
	if _, err := os.Stat(path + durable.TempSuffix + "123"); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("leftover temp file still there after open: %v", err)
	}
}

// TestMemoryCorrupt: a file that does not read back whole is refused, never taken as
// an empty memory (that would serve a remembered tag as an ordinary one).
func TestMemoryCorrupt(t *testing.T) {
	good := string(encodeMemory(map[string]bool{"orders": true}, nil))
	for _, tt := range []struct {
		name, content string
	}{
		{"ErrEmpty", ""},
		{"ErrCutShort", good[:len(good)-3]},
		{"ErrFlippedByte", strings.Replace(good, "orders", "ordert", 1)},
		{"ErrNoHeader", "orders\n"},
		{"ErrBadTag", fixSum("leafbus monotonic tags v1\nor\x01ders\n")},
		{"ErrTwice", fixSum("leafbus monotonic tags v1\norders\norders\n")},
		{"ErrOtherFile", "leafbus segment high-water marks v1\ncrc32 00000000\n"},
		{"ErrV2NoTab", fixSum("leafbus tag options v2\norders\n")},
		{"ErrV2Nothing", fixSum("leafbus tag options v2\norders\t\n")},
		{"ErrV2Space", fixSum("leafbus tag options v2\norders bits=53\n")},
		{"ErrV2Default", fixSum("leafbus tag options v2\norders\tbits=63\n")},
		{"ErrV2Narrow", fixSum("leafbus tag options v2\norders\tbits=8\n")},
		{"ErrV2BitsText", fixSum("leafbus tag options v2\norders\tbits=053\n")},
		{"ErrV2OpaqueNoKey", fixSum("leafbus tag options v2\norders\tbits=53 opaque\n")},
		{"ErrV2BadKey", fixSum("leafbus tag options v2\norders\tbits=53 opaque key=xyz\n")},
		{"ErrV2Order", fixSum("leafbus tag options v2\norders\tbits=53 monotonic\n")},
		{"ErrV2Unknown", fixSum("leafbus tag options v2\norders\tbits=53 salted\n")},
		{"ErrV2Twice", fixSum("leafbus tag options v2\norders\tmonotonic\norders\tbits=53\n")},
	} {
		t.Run(tt.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "monotonic.tags")
			if err := os.WriteFile(path, []byte(tt.content), 0o600); err != nil {
				t.Fatal(err)
			}
			_, err := openMemory(path)
			if !errors.Is(err, ErrCorruptMemory) || !strings.Contains(err.Error(), path) {
				t.Fatalf("openMemory(%q) = %v; want ErrCorruptMemory naming the file", tt.content, err)
			}
		})
	}
	t.Run("OK", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "monotonic.tags")
		if err := os.WriteFile(path, []byte(good), 0o600); err != nil {
			t.Fatal(err)
		}
		if m, err := openMemory(path); err != nil || !m.has("orders") {
			t.Fatalf("openMemory(good file) = %v; want orders remembered", err)
		}
	})
}

// fixSum appends the checksum line to body, so that a test row can hold a file whose
// only fault is its content.
func fixSum(body string) string {
	b := []byte(body)
	return string(durable.AppendSum(b))
}

// TestMemoryGroupCommit: many tags set at once cost far fewer file writes than tags,
// and every one of them is in the file once its set returned.
func TestMemoryGroupCommit(t *testing.T) {
	path := filepath.Join(t.TempDir(), "monotonic.tags")
	m, err := openMemory(path)
	if err != nil {
		t.Fatal(err)
	}
	const n = 200
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := m.set(fmt.Sprintf("t%03d", i), true); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	again, err := openMemory(path)
	if err != nil {
		t.Fatal(err)
	}
	if got := len(again.all()); got != n {
		t.Fatalf("file holds %d tags after %d sets returned", got, n)
	}
	writes := m.file.Writes()
	t.Logf("%d tags in %d file writes", n, writes)
	if writes >= n {
		t.Fatalf("%d writes for %d tags: no group commit", writes, n)
	}
}

// TestMemoryUnwritable: a file that cannot be written fails at open, not at the first
// monotonic tag.
func TestMemoryUnwritable(t *testing.T) {
	if _, err := openMemory(filepath.Join(t.TempDir(), "missing", "monotonic.tags")); err == nil {
		t.Fatal("openMemory in a dir that does not exist succeeded")
	}
	if _, err := openMemory(""); err == nil {
		t.Fatal("openMemory without a path succeeded")
	}
}

// TestMemoryKeepsRanges: ranges are remembered beside the monotonic tags, in a version-2
// file that a reopen reads back whole; a file without ranges stays version 1 (which a
// dispenser of an earlier version reads), and one with them is version 2 (which it
// refuses rather than forget them).
func TestMemoryKeepsRanges(t *testing.T) {
	const fp = "f412d2d97e6120bb37a45c97"
	path := filepath.Join(t.TempDir(), "monotonic.tags")
	m, err := openMemory(path)
	if err != nil {
		t.Fatal(err)
	}
	if err := m.set("orders", true); err != nil {
		t.Fatal(err)
	}
	if data, _ := os.ReadFile(path); !strings.HasPrefix(string(data), memoryHeader+"\n") {
		t.Fatalf("a memory without ranges is\n%s\nwant version 1", data)
	}
	opaque := wire.TagRange{Bits: 53, Opaque: true, Key: fp}
	for tag, r := range map[string]wire.TagRange{"invoices": opaque, "web": {Bits: 53}, "orders": {Bits: 40}, "gone": {Bits: 20}} {
		if err := m.setRange(tag, r); err != nil {
			t.Fatal(err)
		}
	}
	if err := m.setRange("gone", wire.TagRange{}); err != nil { // the default: forgotten
		t.Fatal(err)
	}
	data, _ := os.ReadFile(path)
	want := "leafbus tag options v2\ninvoices\tbits=53 opaque key=" + fp + "\norders\tmonotonic bits=40\nweb\tbits=53\n"
	if !strings.HasPrefix(string(data), want) {
		t.Fatalf("the file is\n%s\nwant it to start\n%s", data, want)
	}
	again, err := openMemory(path)
	if err != nil {
		t.Fatalf("reopen: %v", err)
	}
	wantRanges := map[string]wire.TagRange{"invoices": opaque, "web": {Bits: 53}, "orders": {Bits: 40}}
	if got := again.allRanges(); !maps.Equal(got, wantRanges) {
		t.Fatalf("after a reopen the ranges are %v, want %v", got, wantRanges)
	}
	if !maps.Equal(again.all(), map[string]bool{"orders": true}) {
		t.Fatalf("after a reopen the monotonic tags are %v, want orders", again.all())
	}
	for tag := range wantRanges {
		if err := again.setRange(tag, wire.TagRange{Bits: 63}); err != nil {
			t.Fatal(err)
		}
	}
	if data, _ := os.ReadFile(path); !strings.HasPrefix(string(data), memoryHeader+"\norders\n") {
		t.Fatalf("with every range forgotten the file is\n%s\nwant version 1 again", data)
	}
}
