package segment

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/leafbus/leafbus/internal/durable"
)

// testMarks is the Marks conformance suite; open returns empty marks each call.
func testMarks(t *testing.T, open func(t *testing.T) Marks) {
	t.Run("RaiseOnlyRises", func(t *testing.T) {
		m := open(t)
		if got := m.Mark("a"); got != 0 {
			t.Fatalf("Mark(never raised) = %d, want 0", got)
		}
		for _, tc := range []struct {
			tag   string
			maxID int64
			want  int64
		}{
			{"a", 100, 100}, {"a", 50, 100}, {"a", 100, 100}, {"a", 101, 101}, {"b", 1, 1},
		} {
			if err := m.Raise(tc.tag, tc.maxID); err != nil {
				t.Fatalf("Raise(%q, %d): %v", tc.tag, tc.maxID, err)
			}
			if got := m.Mark(tc.tag); got != tc.want {
				t.Fatalf("Mark(%q) after Raise(%d) = %d, want %d", tc.tag, tc.maxID, got, tc.want)
			}
		}
		if got, want := m.All(), map[string]int64{"a": 101, "b": 1}; !maps.Equal(got, want) {
			t.Fatalf("All() = %v, want %v", got, want)
		}
		all := m.All()
		all["a"] = 1 // a copy: changing it changes no mark
		if got := m.Mark("a"); got != 101 {
			t.Fatalf("Mark(a) = %d after changing All's map, want 101", got)
		}
	})
	t.Run("ErrInvalidTag", func(t *testing.T) {
		m := open(t)
		for _, tc := range []struct {
			tag   string
			maxID int64
		}{{"", 5}, {"a\x00b", 5}, {"a\n", 5}, {"a", 0}, {"a", -5}} {
			if err := m.Raise(tc.tag, tc.maxID); !errors.Is(err, ErrInvalidTag) {
				t.Errorf("Raise(%q, %d) = %v, want ErrInvalidTag", tc.tag, tc.maxID, err)
			}
		}
		if all := m.All(); len(all) != 0 {
			t.Fatalf("All() after refused raises = %v, want none", all)
		}
	})
	t.Run("Concurrent", func(t *testing.T) {
		m := open(t)
		var wg sync.WaitGroup
		for w := range 16 {
			wg.Go(func() {
				for i := range 50 {
					tag := fmt.Sprintf("t%d", (w+i)%5)
					if err := m.Raise(tag, int64(1+w*100+i)); err != nil {
						t.Errorf("Raise: %v", err)
						return
					}
				}
			})
		}
		wg.Wait()
		for i := range 5 {
			// The highest raise of tag ti comes from the worker w=15 at the largest i
			// with (15+i)%5 == ti.
			want := int64(0)
			for w := range 16 {
				for j := range 50 {
					if (w+j)%5 == i {
						want = max(want, int64(1+w*100+j))
					}
				}
			}
			if got := m.Mark(fmt.Sprintf("t%d", i)); got != want {
				t.Errorf("Mark(t%d) = %d, want %d", i, got, want)
			}
		}
	})
}

func TestInmemMarks(t *testing.T) {
	testMarks(t, func(t *testing.T) Marks { return NewInmemMarks() })
}

func TestFileMarks(t *testing.T) {
	testMarks(t, func(t *testing.T) Marks { return mustOpenMarks(t, filepath.Join(t.TempDir(), "marks")) })
}

// mustOpenMarks opens the marks file at path or fails the test.
func mustOpenMarks(tb testing.TB, path string) *FileMarks {
	tb.Helper()
	m, err := OpenFileMarks(path)
	if err != nil {
		tb.Fatalf("OpenFileMarks(%q): %v", path, err)
	}
	return m
}

// readMarks decodes the file as it is on disk now, independently of any FileMarks.
func readMarks(tb testing.TB, path string) map[string]int64 {
	tb.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		tb.Fatalf("read marks file: %v", err)
	}
	marks, _, err := decodeMarks(data)
	if err != nil {
		tb.Fatalf("decode marks file %q: %v", data, err)
	}
	return marks
}

// TestFileMarksDurable: a Raise has reached the file when it returns, the file is
// created at open (so a directory that cannot be written fails at start), and a reopen
// reads every mark back.
func TestFileMarksDurable(t *testing.T) {
	path := filepath.Join(t.TempDir(), "segment.marks")
	m := mustOpenMarks(t, path)
	if got := readMarks(t, path); len(got) != 0 {
		t.Fatalf("a new marks file holds %v, want no marks", got)
	}
	for i, tag := range []string{"orders", "users", "a-b_C9", "com.acme.order", "订单 1"} {
		if err := m.Raise(tag, int64(1000*(i+1))); err != nil {
			t.Fatalf("Raise: %v", err)
		}
		if got := readMarks(t, path)[tag]; got != int64(1000*(i+1)) {
			t.Fatalf("file after Raise(%q, %d) holds %d", tag, 1000*(i+1), got)
		}
	}
	if err := m.Raise("orders", 1); err != nil {
		t.Fatalf("Raise(lower): %v", err)
	}
	want := map[string]int64{"orders": 1000, "users": 2000, "a-b_C9": 3000, "com.acme.order": 4000, "订单 1": 5000}
	if got := mustOpenMarks(t, path).All(); !maps.Equal(got, want) {
		t.Fatalf("reopened marks = %v, want %v", got, want)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	// The format, as an operator reading the file sees it: tags as their subject tokens,
	// so a line still splits at its one space.
	body := marksHeader + "\na-b_C9 3000\ncom%2Eacme%2Eorder 4000\norders 1000\nusers 2000\n%E8%AE%A2%E5%8D%95%201 5000\n"
	if wantData := fmt.Sprintf("%scrc32 %08x\n", body, crc32.ChecksumIEEE([]byte(body))); string(data) != wantData {
		t.Fatalf("marks file =\n%s\nwant\n%s", data, wantData)
	}
	assertNoTempFiles(t, path)
}

// assertNoTempFiles fails when a temp file of path is left in its directory.
func assertNoTempFiles(tb testing.TB, path string) {
	tb.Helper()
	entries, err := os.ReadDir(filepath.Dir(path))
	if err != nil {
		tb.Fatal(err)
	}
	for _, e := range entries {
		if strings.Contains(e.Name(), durable.TempSuffix) {
			tb.Fatalf("temp file %s left behind", e.Name())
		}
	}
}

// withSum is a marks file of body with a correct checksum line: content a checksum
// cannot catch, because something wrote it on purpose.
func withSum(body string) string {
	return fmt.Sprintf("%scrc32 %08x\n", body, crc32.ChecksumIEEE([]byte(body)))
}

// TestFileMarksCorrupt: every way a marks file can be damaged or wrong is an error
// wrapping ErrCorruptMarks that names the file, never an empty start.
func TestFileMarksCorrupt(t *testing.T) {
	good := withSum(marksHeader + "\norders 3001\nusers 20\n")
	for _, tc := range []struct {
		name string
		data string
	}{
		{"Empty", ""},
		{"OnlyNewline", "\n"},
		{"Truncated", good[:len(good)-5]},
		{"TruncatedToHeader", marksHeader + "\n"},
		{"CutBeforeChecksum", good[:strings.Index(good, "crc32")]},
		{"FlippedDigit", strings.Replace(good, "3001", "3000", 1)},
		{"DroppedLine", strings.Replace(good, "users 20\n", "", 1)},
		{"BadChecksumHex", strings.Replace(good, "crc32 ", "crc32 zz", 1)},
		{"NotAMarksFile", "{\"orders\":3001}\n"},
		{"Zeros", strings.Repeat("\x00", 64)},
		{"WrongHeader", withSum("leafbus segment high-water marks v3\norders 5\n")},
		{"FencedWithoutFence", withSum(marksHeaderFenced + "\norders 5\n")},
		{"FencedOnlyHeader", withSum(marksHeaderFenced + "\n")},
		{"FenceNotANumber", withSum(marksHeaderFenced + "\nfenced 17x margin 5\norders 5\n")},
		{"FenceZeroMargin", withSum(marksHeaderFenced + "\nfenced 1763790000123 margin 0\norders 5\n")},
		{"FenceExtraField", withSum(marksHeaderFenced + "\nfenced 1763790000123 margin 5 x\n")},
		{"FenceInV1", withSum(marksHeader + "\nfenced 1763790000123 margin 5\n")},
		{"NoSpace", withSum(marksHeader + "\norders5\n")},
		{"BadNumber", withSum(marksHeader + "\norders 5x\n")},
		{"ZeroMark", withSum(marksHeader + "\norders 0\n")},
		{"NegativeMark", withSum(marksHeader + "\norders -7\n")},
		{"BadTag", withSum(marksHeader + "\nor.ders 7\n")},
		{"BadTagEscape", withSum(marksHeader + "\nor%2ders 7\n")},
		{"TwoSpaces", withSum(marksHeader + "\norders  7\n")},
		{"Duplicate", withSum(marksHeader + "\norders 7\norders 9\n")},
		{"EmptyLine", withSum(marksHeader + "\n\norders 7\n")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "segment.marks")
			if err := os.WriteFile(path, []byte(tc.data), 0o600); err != nil {
				t.Fatal(err)
			}
			m, err := OpenFileMarks(path)
			if !errors.Is(err, ErrCorruptMarks) || !strings.Contains(err.Error(), path) {
				t.Fatalf("OpenFileMarks(%q) = %v, %v; want ErrCorruptMarks naming the file", tc.data, m, err)
			}
			if data, _ := os.ReadFile(path); string(data) != tc.data {
				t.Fatalf("OpenFileMarks changed the corrupt file to %q", data)
			}
		})
	}
	t.Run("OK", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "segment.marks")
		if err := os.WriteFile(path, []byte(good), 0o600); err != nil {
			t.Fatal(err)
		}
		if got := mustOpenMarks(t, path).All(); !maps.Equal(got, map[string]int64{"orders": 3001, "users": 20}) {
			t.Fatalf("All() = %v", got)
		}
	})
}

// TestFileMarksOpenErrors: a path that cannot be read or created fails at open, naming it.
func TestFileMarksOpenErrors(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		name string
		path string
	}{
		{"NoDirectory", filepath.Join(dir, "missing", "segment.marks")},
		{"PathIsADirectory", dir},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := OpenFileMarks(tc.path); err == nil || !strings.Contains(err.Error(), tc.path) {
				t.Fatalf("OpenFileMarks(%q) = %v, want an error naming the path", tc.path, err)
			}
		})
	}
	if _, err := OpenFileMarks(""); err == nil {
		t.Fatal("OpenFileMarks(\"\") succeeded")
	}
}

// TestFileMarksWriteFails: a Raise whose write fails returns the error (so its segment
// is not served) and leaves the file as it was; the next Raise, of any value, writes
// the mark once the disk is back.
func TestFileMarksWriteFails(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "segment.marks")
	m := mustOpenMarks(t, path)
	if err := m.Raise("a", 10); err != nil {
		t.Fatal(err)
	}
	// The directory gone is a write failure even for root, whom permissions don't stop.
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	err := m.Raise("a", 20)
	if err == nil || !strings.Contains(err.Error(), path) {
		t.Fatalf("Raise with the directory gone = %v, want an error naming the file", err)
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	// The same value again: the mark is already 20 in memory, but not yet durable.
	if err := m.Raise("a", 20); err != nil {
		t.Fatalf("Raise after the directory came back: %v", err)
	}
	if got := readMarks(t, path); got["a"] != 20 {
		t.Fatalf("file holds %v, want a: 20", got)
	}
}

// TestFileMarksLeftoverTemp: a crash between writing the temp file and the rename
// leaves the old file whole and a temp file, which open ignores and removes.
func TestFileMarksLeftoverTemp(t *testing.T) {
	path := filepath.Join(t.TempDir(), "seg[1].marks") // a name Glob would misread
	m := mustOpenMarks(t, path)
	if err := m.Raise("a", 10); err != nil {
		t.Fatal(err)
	}
	tmp := path + durable.TempSuffix + "12345"
	if err := os.WriteFile(tmp, []byte(marksHeader+"\na 9"), 0o600); err != nil {
		t.Fatal(err)
	}
	if got := mustOpenMarks(t, path).Mark("a"); got != 10 {
		t.Fatalf("Mark(a) after a crashed write = %d, want 10", got)
	}
	assertNoTempFiles(t, path)
}

// TestFileMarksGroupCommit: raises of many tags at once all reach the file, in far
// fewer writes than raises: those that arrive during a write share the next one.
func TestFileMarksGroupCommit(t *testing.T) {
	path := filepath.Join(t.TempDir(), "segment.marks")
	m := mustOpenMarks(t, path)
	const tags = 500
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range tags {
		wg.Go(func() {
			<-start
			if err := m.Raise(fmt.Sprintf("t%03d", i), int64(i+1)); err != nil {
				t.Errorf("Raise: %v", err)
			}
		})
	}
	close(start)
	wg.Wait()
	got := readMarks(t, path)
	for i := range tags {
		if tag := fmt.Sprintf("t%03d", i); got[tag] != int64(i+1) {
			t.Fatalf("file: %s = %d, want %d", tag, got[tag], i+1)
		}
	}
	writes := m.file.Writes()
	t.Logf("%d raises, %d writes", tags, writes)
	if writes > tags/4 {
		t.Fatalf("%d raises took %d writes, want them grouped into at most %d", tags, writes, tags/4)
	}
}

func TestCheckStoreAgainstMarks(t *testing.T) {
	ctx := context.Background()
	newStore := func(t *testing.T, tags ...Tag) *hookStore {
		s := newHookStore()
		for _, tag := range tags {
			s.inner.put(tag)
		}
		return s
	}
	marks := func(kv map[string]int64) Marks {
		m := NewInmemMarks()
		for tag, maxID := range kv {
			if err := m.Raise(tag, maxID); err != nil {
				t.Fatal(err)
			}
		}
		return m
	}
	for _, tc := range []struct {
		name     string
		store    []Tag
		marks    map[string]int64
		wantErr  bool
		mentions []string
		omits    []string
	}{
		{"OK/NoMarks", nil, nil, false, nil, nil},
		{"OK/AtOrAbove", []Tag{{Name: "a", MaxID: 100, Step: 1}, {Name: "b", MaxID: 500, Step: 1}, {Name: "new", MaxID: 1, Step: 1}},
			map[string]int64{"a": 100, "b": 300}, false, nil, nil},
		{"ErrStoreWentBack/Missing", []Tag{{Name: "a", MaxID: 100, Step: 1}},
			map[string]int64{"a": 100, "lost": 7000}, true,
			[]string{"lost (mark 7000)", "missing", "dispenser tag add"}, []string{"a ("}},
		{"ErrStoreWentBack/Behind", []Tag{{Name: "a", MaxID: 99, Step: 1}, {Name: "b", MaxID: 5000, Step: 1}},
			map[string]int64{"a": 100, "b": 300}, true,
			[]string{"a (max_id 99, mark 100)", "dispenser tag update --tag T --max-id N", "at least the mark"}, []string{"b ("}},
		{"ErrStoreWentBack/Both", []Tag{{Name: "a", MaxID: 1, Step: 1}},
			map[string]int64{"a": 100, "gone": 5}, true,
			[]string{"a (max_id 1, mark 100)", "gone (mark 5)"}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := CheckStoreAgainstMarks(ctx, newStore(t, tc.store...), marks(tc.marks))
			if !tc.wantErr {
				if err != nil {
					t.Fatalf("CheckStoreAgainstMarks = %v, want nil", err)
				}
				return
			}
			if !errors.Is(err, ErrStoreWentBack) || !errors.Is(err, ErrUnavailable) {
				t.Fatalf("CheckStoreAgainstMarks = %v, want ErrStoreWentBack (and ErrUnavailable)", err)
			}
			for _, s := range tc.mentions {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("error %q does not mention %q", err, s)
				}
			}
			for _, s := range tc.omits {
				if strings.Contains(err.Error(), s) {
					t.Errorf("error %q names %q, which the store has at or above its mark", err, s)
				}
			}
		})
	}
	t.Run("ManyTags", func(t *testing.T) {
		kv := make(map[string]int64)
		for i := range 1000 {
			kv[fmt.Sprintf("t%04d", i)] = 10
		}
		err := CheckStoreAgainstMarks(ctx, newStore(t), marks(kv))
		if !errors.Is(err, ErrStoreWentBack) || !strings.Contains(err.Error(), "1000 tags") || !strings.Contains(err.Error(), "and 980 more") || len(err.Error()) > 2000 {
			t.Fatalf("CheckStoreAgainstMarks(1000 lost tags) = %v; want the count, 20 names and \"and 980 more\"", err)
		}
	})
	t.Run("StoreError", func(t *testing.T) {
		s := newStore(t)
		s.TagsFn = func(ctx context.Context) ([]Tag, error) { return nil, errBoom }
		err := CheckStoreAgainstMarks(ctx, s, marks(map[string]int64{"a": 5}))
		if !errors.Is(err, errBoom) || errors.Is(err, ErrStoreWentBack) {
			t.Fatalf("CheckStoreAgainstMarks(store down) = %v, want the store's error, not ErrStoreWentBack", err)
		}
	})
}

// TestFileMarksFence: RecordFence raises the marks it is given (never lowers one),
// records the fence in a version 2 file that reads back, and a file never fenced stays
// version 1, which earlier dispensers read.
func TestFileMarksFence(t *testing.T) {
	path := filepath.Join(t.TempDir(), "segment.marks")
	m := mustOpenMarks(t, path)
	if err := m.Raise("orders", 3001); err != nil {
		t.Fatal(err)
	}
	if err := m.Raise("users", 20); err != nil {
		t.Fatal(err)
	}
	if f := m.Fence(); f != (Fence{}) {
		t.Fatalf("Fence() of a new file = %+v, want none", f)
	}
	if data, _ := os.ReadFile(path); !strings.HasPrefix(string(data), marksHeader+"\n") {
		t.Fatalf("a file never fenced is not version 1:\n%s", data)
	}
	fence := Fence{At: 1763790000123, Margin: 10_000_000_000}
	if err := m.RecordFence(fence, map[string]int64{"orders": 10_000_003_001, "users": 5, "lost": 10_000_000_007}); err != nil {
		t.Fatalf("RecordFence: %v", err)
	}
	want := map[string]int64{"orders": 10_000_003_001, "users": 20, "lost": 10_000_000_007}
	if got := m.All(); !maps.Equal(got, want) {
		t.Fatalf("marks after the fence = %v, want %v", got, want)
	}
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	body := marksHeaderFenced + "\nfenced 1763790000123 margin 10000000000\nlost 10000000007\norders 10000003001\nusers 20\n"
	if string(data) != withSum(body) {
		t.Fatalf("marks file =\n%s\nwant\n%s", data, withSum(body))
	}
	reopened := mustOpenMarks(t, path)
	if got := reopened.All(); !maps.Equal(got, want) || reopened.Fence() != fence {
		t.Fatalf("reopened: marks %v fence %+v, want %v and %+v", got, reopened.Fence(), want, fence)
	}
	// A later rise keeps the fence.
	if err := reopened.Raise("orders", 10_000_005_001); err != nil {
		t.Fatal(err)
	}
	if f := mustOpenMarks(t, path).Fence(); f != fence {
		t.Fatalf("fence after a Raise = %+v, want %+v", f, fence)
	}
	for _, bad := range []struct {
		f      Fence
		raised map[string]int64
	}{
		{Fence{At: 0, Margin: 5}, nil},
		{Fence{At: 5, Margin: 0}, nil},
		{Fence{At: 5, Margin: 5}, map[string]int64{"bad\x01tag": 7}},
		{Fence{At: 5, Margin: 5}, map[string]int64{"orders": 0}},
	} {
		if err := reopened.RecordFence(bad.f, bad.raised); err == nil {
			t.Errorf("RecordFence(%+v, %v): no error", bad.f, bad.raised)
		}
	}
}
