package core

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/leafbus/leafbus/internal/testutil"
	"github.com/leafbus/leafbus/opaque"
	"github.com/leafbus/leafbus/segment"
	"github.com/leafbus/leafbus/wire"
)

var (
	testKey   = []byte("0123456789abcdef0123456789abcdef")
	otherKey  = []byte("another key of sixteen bytes or more")
	testFP    = opaque.Fingerprint(testKey)
	opaque53  = wire.TagRange{Bits: 53, Opaque: true, Key: testFP}
	capped40  = wire.TagRange{Bits: 40}
	opaqueFor = func(key []byte) wire.TagRange {
		return wire.TagRange{Bits: 63, Opaque: true, Key: opaque.Fingerprint(key)}
	}
)

// fakeRanges keeps ranges in memory; refused tags answer their error. It records the
// calls of SetRange, and whether the store held the tag when each came (order).
type fakeRanges struct {
	mu      sync.Mutex
	ranges  map[string]wire.TagRange
	refused map[string]error
	sets    []string
	store   *segment.InmemStore // when set, each SetRange notes whether the tag existed
	existed []bool
	setErr  error
}

func (f *fakeRanges) TagRange(tag string) (wire.TagRange, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err := f.refused[tag]; err != nil {
		return wire.TagRange{}, err
	}
	return f.ranges[tag], nil
}

func (f *fakeRanges) SetRange(ctx context.Context, tag string, r wire.TagRange) error {
	existed := false
	if f.store != nil {
		_, err := f.store.Tag(ctx, tag)
		existed = err == nil
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.setErr != nil {
		return f.setErr
	}
	f.sets = append(f.sets, tag+" "+r.String())
	f.existed = append(f.existed, existed)
	if f.ranges == nil {
		f.ranges = map[string]wire.TagRange{}
	}
	f.ranges[tag] = r.Normal()
	return nil
}

func newShaper(t *testing.T, r Ranges, key []byte) *Shaper {
	t.Helper()
	s, err := NewShaper(r, key)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func seq(from int64, n int) []int64 {
	ids := make([]int64, n)
	for i := range ids {
		ids[i] = from + int64(i)
	}
	return ids
}

// TestShape: the default range leaves IDs as they are; a cap refuses a reply that
// reaches past it (a 503 saying why), whole; an opaque tag's reply holds the images of
// its numbers, sorted, strictly increasing; without the key, or with another one, an
// opaque tag is refused (503) naming the flag or both fingerprints.
func TestShape(t *testing.T) {
	ranges := &fakeRanges{ranges: map[string]wire.TagRange{"capped": capped40, "inv": opaque53, "inv63": opaqueFor(testKey)}}
	s := newShaper(t, ranges, testKey)
	perm53, _ := opaque.New(testKey, "inv", 53)

	ids := seq(100, 10)
	if err := s.Shape("orders", ids); err != nil || !slices.Equal(ids, seq(100, 10)) {
		t.Fatalf("Shape of a default tag = %v, %v; want the numbers", ids, err)
	}
	top := capped40.Max()
	ids = seq(top-9, 10)
	if err := s.Shape("capped", ids); err != nil || !slices.Equal(ids, seq(top-9, 10)) {
		t.Fatalf("Shape of a capped tag up to its last ID = %v, %v; want the numbers", ids, err)
	}
	err := s.Shape("capped", seq(top-8, 10))
	if !errors.Is(err, wire.ErrRangeUsedUp) || codeOrZero(err) != 503 || !strings.Contains(err.Error(), "40 bits") {
		t.Fatalf("Shape of a capped tag past its last ID = %v; want ErrRangeUsedUp (503) naming its 40 bits", err)
	}
	for _, tag := range []string{"inv", "inv63"} {
		ids = seq(1, 1000)
		if err := s.Shape(tag, ids); err != nil {
			t.Fatal(err)
		}
		for i := 1; i < len(ids); i++ {
			if ids[i] <= ids[i-1] {
				t.Fatalf("%s: shaped reply not strictly increasing at %d: %d, %d", tag, i, ids[i-1], ids[i])
			}
		}
		if slices.Equal(ids, seq(1, 1000)) {
			t.Fatalf("%s: shaped reply is the numbers themselves", tag)
		}
	}
	want := seq(1, 1000)
	if err := perm53.PermuteAll(want); err != nil {
		t.Fatal(err)
	}
	slices.Sort(want)
	ids = seq(1, 1000)
	if err := s.Shape("inv", ids); err != nil || !slices.Equal(ids, want) {
		t.Fatalf("Shape(inv) is not the sorted images of the numbers under the tag's permutation")
	}
	if err := s.Shape("inv", []int64{opaque53.Max() + 1}); !errors.Is(err, wire.ErrRangeUsedUp) {
		t.Fatalf("Shape(inv) past 53 bits = %v, want ErrRangeUsedUp", err)
	}

	noKey := newShaper(t, ranges, nil)
	if err := noKey.Shape("inv", seq(1, 3)); !errors.Is(err, ErrNoKey) || codeOrZero(err) != 503 || !strings.Contains(err.Error(), "--id-key-file") {
		t.Fatalf("Shape(inv) without a key = %v; want ErrNoKey (503) naming --id-key-file", err)
	}
	if err := noKey.Shape("capped", seq(1, 3)); err != nil {
		t.Fatalf("Shape(capped) without a key = %v; a cap needs none", err)
	}
	other := newShaper(t, ranges, otherKey)
	err = other.Shape("inv", seq(1, 3))
	if !errors.Is(err, ErrOtherKey) || codeOrZero(err) != 503 || !strings.Contains(err.Error(), testFP) || !strings.Contains(err.Error(), other.Fingerprint()) {
		t.Fatalf("Shape(inv) with another key = %v; want ErrOtherKey (503) naming both fingerprints", err)
	}
	ranges.refused = map[string]error{"doubt": fmt.Errorf("%w: in doubt", wire.ErrUnavailable)}
	if err := s.Shape("doubt", seq(1, 3)); codeOrZero(err) != 503 {
		t.Fatalf("Shape of a refused tag = %v, want its 503", err)
	}
	if _, err := NewShaper(ranges, []byte("short")); err == nil {
		t.Fatal("NewShaper with a 5-byte key succeeded")
	}
}

// TestCoreShapesEveryPath: a reply of an opaque tag is shaped whichever way the core
// fills it (Take from the buffers, Wait for a store that loads, a monotonic source,
// and a pool's source through Shaper.Segments), and a cap refuses on each of them.
func TestCoreShapesEveryPath(t *testing.T) {
	ranges := &fakeRanges{ranges: map[string]wire.TagRange{"inv": opaque53, "ordered": {Bits: 16}}}
	s := newShaper(t, ranges, testKey)
	perm, _ := opaque.New(testKey, "inv", 53)
	images := func(from int64, n int) []int64 {
		ids := seq(from, n)
		if err := perm.PermuteAll(ids); err != nil {
			t.Fatal(err)
		}
		slices.Sort(ids)
		return ids
	}
	src := testutil.NewStalledSegments()
	close(src.Release)
	taken := newCore(t, func(cfg *Config) { cfg.Segments, cfg.Shaper, cfg.TagRanges = fixedSegments{}, s, ranges })
	waited := newCore(t, func(cfg *Config) { cfg.Segments, cfg.Shaper, cfg.TagRanges = src, s, ranges })
	if ids, err := get(t, taken, segReq("inv", 5)); err != nil || !slices.Equal(ids, images(100, 5)) {
		t.Fatalf("Take of inv = %v, %v; want the images of 100..104, sorted", ids, err)
	}
	if ids, err := get(t, waited, segReq("inv", 5)); err != nil || !slices.Equal(ids, images(1, 5)) {
		t.Fatalf("Wait of inv = %v, %v; want the images of 1..5, sorted", ids, err)
	}
	mono := &fakeMonotonic{marks: map[string]bool{"ordered": true}, inMemory: true, next: 65530 - 7000}
	withMono := newCore(t, func(cfg *Config) {
		cfg.Segments, cfg.Monotonic, cfg.Shaper, cfg.TagRanges = fixedSegments{}, mono, s, ranges
	})
	if ids, err := get(t, withMono, segReq("ordered", 5)); err != nil || !slices.Equal(ids, seq(65530, 5)) {
		t.Fatalf("a monotonic tag of 16 bits within its range = %v, %v", ids, err)
	}
	if _, err := get(t, withMono, segReq("ordered", 5)); !errors.Is(err, wire.ErrRangeUsedUp) {
		t.Fatalf("a monotonic tag of 16 bits past its range = %v, want ErrRangeUsedUp", err)
	}
	pool := NewOrdinary(fixedSegments{}, mono, s)
	ids := make([]int64, 5)
	if err := pool.Fill(context.Background(), "inv", ids); err != nil || !slices.Equal(ids, images(100, 5)) {
		t.Fatalf("a pool's fill of inv = %v, %v; want the images of 100..104, sorted", ids, err)
	}
	if err := pool.Fill(context.Background(), "ordered", ids); !errors.Is(err, wire.ErrUnavailable) {
		t.Fatalf("a pool's fill of the monotonic tag = %v, want ErrUnavailable: a pool never holds it", err)
	}
	if ex, err := pool.Excluded("ordered"); !ex || err != nil {
		t.Fatalf("Excluded(monotonic tag) = %v, %v; want true: the pool stream purges its batches", ex, err)
	}
	if _, err := New(func() Config { c := DefaultConfig(); c.TagRanges = ranges; return c }()); err == nil {
		t.Fatal("a core with tag ranges and no Shaper was built")
	}
}

// TestRangeAdmin: what the admin calls may and may not do with a tag's range.
func TestRangeAdmin(t *testing.T) {
	ctx := context.Background()
	store := segment.NewInmemStore()
	ranges := &fakeRanges{store: store, ranges: map[string]wire.TagRange{"leftover": opaqueFor(otherKey)}}
	mono := &fakeMonotonic{marks: map[string]bool{}}
	c := newCore(t, func(cfg *Config) {
		cfg.Tags, cfg.Monotonic, cfg.Shaper, cfg.TagRanges = store, mono, newShaper(t, ranges, testKey), ranges
	})
	noKey := newCore(t, func(cfg *Config) {
		cfg.Tags, cfg.Monotonic, cfg.Shaper, cfg.TagRanges = store, mono, newShaper(t, ranges, nil), ranges
	})
	otherKeyed := newCore(t, func(cfg *Config) {
		cfg.Tags, cfg.Monotonic, cfg.Shaper, cfg.TagRanges = store, mono, newShaper(t, ranges, otherKey), ranges
	})
	noRanges := newCore(t, func(cfg *Config) { cfg.Tags, cfg.Monotonic = store, mono })
	n := func(v int64) *int64 { return &v }
	bits := func(v int) *int { return &v }
	flag := func(b bool) *bool { return &b }
	if _, err := store.AddTag(ctx, segment.Tag{Name: "served", Step: 10, MaxID: 1 << 45}); err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct {
		name    string
		call    func() (wire.TagInfo, error)
		want    wire.TagRange // the reply's range
		wantErr int
		msg     string
	}{
		{"AddOpaque", func() (wire.TagInfo, error) {
			return c.AddTag(ctx, wire.AddTagRequest{Tag: "inv", Step: n(10), Opaque: flag(true), Bits: bits(53)})
		}, opaque53, 0, ""},
		{"AddOpaqueDefaultWidth", func() (wire.TagInfo, error) {
			return c.AddTag(ctx, wire.AddTagRequest{Tag: "inv63", Step: n(10), Opaque: flag(true)})
		}, opaqueFor(testKey), 0, ""},
		{"AddCapped", func() (wire.TagInfo, error) {
			return c.AddTag(ctx, wire.AddTagRequest{Tag: "web", Step: n(10), Bits: bits(53)})
		}, wire.TagRange{Bits: 53}, 0, ""},
		{"AddPlain", func() (wire.TagInfo, error) { return c.AddTag(ctx, wire.AddTagRequest{Tag: "plain", Step: n(10)}) }, wire.TagRange{}, 0, ""},
		{"AddErrExists", func() (wire.TagInfo, error) {
			return c.AddTag(ctx, wire.AddTagRequest{Tag: "served", Step: n(10), Opaque: flag(true)})
		}, wire.TagRange{}, 409, "exists"},
		{"AddErrNoKey", func() (wire.TagInfo, error) {
			return noKey.AddTag(ctx, wire.AddTagRequest{Tag: "nokey", Step: n(10), Opaque: flag(true)})
		}, wire.TagRange{}, 503, "--id-key-file"},
		{"AddErrOpaqueMonotonic", func() (wire.TagInfo, error) {
			return c.AddTag(ctx, wire.AddTagRequest{Tag: "om", Step: n(10), Opaque: flag(true), Monotonic: flag(true)})
		}, wire.TagRange{}, 400, "cannot be monotonic"},
		{"AddErrBits", func() (wire.TagInfo, error) {
			return c.AddTag(ctx, wire.AddTagRequest{Tag: "b", Step: n(10), Bits: bits(8)})
		}, wire.TagRange{}, 400, "bits 8"},
		{"AddErrMaxIDBeyond", func() (wire.TagInfo, error) {
			return c.AddTag(ctx, wire.AddTagRequest{Tag: "far", Step: n(10), MaxID: n(1 << 53), Bits: bits(53)})
		}, wire.TagRange{}, 400, "beyond"},
		{"AddErrLeftover", func() (wire.TagInfo, error) {
			return c.AddTag(ctx, wire.AddTagRequest{Tag: "leftover", Step: n(10)})
		}, wire.TagRange{}, 409, "earlier tag"},
		{"AddErrRangesOff", func() (wire.TagInfo, error) {
			return noRanges.AddTag(ctx, wire.AddTagRequest{Tag: "off", Step: n(10), Bits: bits(53)})
		}, wire.TagRange{}, 503, "not configured"},
		{"UpdateCapWidens", func() (wire.TagInfo, error) {
			return c.UpdateTag(ctx, wire.UpdateTagRequest{Tag: "web", Bits: bits(63)})
		}, wire.TagRange{}, 0, ""},
		{"UpdateCapNarrows", func() (wire.TagInfo, error) {
			return c.UpdateTag(ctx, wire.UpdateTagRequest{Tag: "web", Bits: bits(40)})
		}, wire.TagRange{Bits: 40}, 0, ""},
		{"UpdateErrNarrowPastMaxID", func() (wire.TagInfo, error) {
			return c.UpdateTag(ctx, wire.UpdateTagRequest{Tag: "served", Bits: bits(40)})
		}, wire.TagRange{}, 400, "beyond 40 bits"},
		{"UpdateErrMaxIDPastCap", func() (wire.TagInfo, error) {
			return c.UpdateTag(ctx, wire.UpdateTagRequest{Tag: "web", MaxID: n(1 << 41)})
		}, wire.TagRange{}, 400, "beyond 40 bits"},
		{"UpdateRepeatsOpaque", func() (wire.TagInfo, error) {
			return c.UpdateTag(ctx, wire.UpdateTagRequest{Tag: "inv", Opaque: flag(true), Bits: bits(53), Step: n(20)})
		}, opaque53, 0, ""},
		{"UpdateErrToOpaque", func() (wire.TagInfo, error) {
			return c.UpdateTag(ctx, wire.UpdateTagRequest{Tag: "plain", Opaque: flag(true)})
		}, wire.TagRange{}, 400, "fixed when it is added"},
		{"UpdateErrFromOpaque", func() (wire.TagInfo, error) {
			return c.UpdateTag(ctx, wire.UpdateTagRequest{Tag: "inv", Opaque: flag(false)})
		}, wire.TagRange{}, 400, "fixed when it is added"},
		{"UpdateErrOpaqueWidth", func() (wire.TagInfo, error) {
			return c.UpdateTag(ctx, wire.UpdateTagRequest{Tag: "inv", Bits: bits(63)})
		}, wire.TagRange{}, 400, "part of its permutation"},
		{"UpdateErrKeyChange", func() (wire.TagInfo, error) {
			return otherKeyed.UpdateTag(ctx, wire.UpdateTagRequest{Tag: "inv", Opaque: flag(true)})
		}, wire.TagRange{}, 409, "changing the key"},
		{"UpdateErrOpaqueMonotonic", func() (wire.TagInfo, error) {
			return c.UpdateTag(ctx, wire.UpdateTagRequest{Tag: "inv", Monotonic: flag(true)})
		}, wire.TagRange{}, 400, "cannot be monotonic"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			info, err := tt.call()
			if code := codeOrZero(err); code != tt.wantErr || err != nil && !strings.Contains(err.Error(), tt.msg) {
				t.Fatalf("%+v, %v; want code %d saying %q", info, err, tt.wantErr, tt.msg)
			}
			if err == nil && info.Range() != tt.want {
				t.Fatalf("%+v: range %v, want %v", info, info.Range(), tt.want)
			}
		})
	}
	// Every range was set before its tag existed in the store, and only for calls
	// that were answered.
	for i, set := range ranges.sets {
		if ranges.existed[i] && !strings.HasPrefix(set, "web ") {
			t.Errorf("range %q set while its tag existed: an add must set it first", set)
		}
	}
	want := []string{"inv " + opaque53.String(), "inv63 " + opaqueFor(testKey).String(), "web 53 bits", "web 63 bits", "web 40 bits"}
	if !slices.Equal(ranges.sets, want) {
		t.Errorf("ranges set: %q, want %q", ranges.sets, want)
	}
	list, err := c.ListTags(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	for _, info := range list {
		got[info.Tag] = info.Range().String()
	}
	for tag, r := range map[string]wire.TagRange{"inv": opaque53, "web": {Bits: 40}, "plain": {}} {
		if got[tag] != r.String() {
			t.Errorf("list shows %s as %q, want %q", tag, got[tag], r)
		}
	}
	// A SetRange that fails (a dispenser that did not take it in) leaves no tag behind,
	// even when the name carries the range already (a retry after such a failure).
	ranges.setErr = fmt.Errorf("%w: not every dispenser took it in", wire.ErrUnavailable)
	ranges.ranges["late2"] = opaqueFor(testKey)
	for _, tag := range []string{"late", "late2"} {
		if _, err := c.AddTag(ctx, wire.AddTagRequest{Tag: tag, Step: n(10), Opaque: flag(true)}); codeOrZero(err) != 503 {
			t.Fatalf("AddTag(%s) whose range was not set = %v, want a 503", tag, err)
		}
		if _, err := store.Tag(ctx, tag); !errors.Is(err, segment.ErrTagNotFound) {
			t.Fatalf("the tag %s whose range was not set was added: %v", tag, err)
		}
	}
}

// TestSpreadSort: spreadSort sorts whatever it is given, spread or not: images of
// every size a reply may have, at the narrowest width (where there are more IDs than
// buckets), numbers all in one bucket, and repeats; and Shape of a large opaque reply
// equals the images sorted.
func TestSpreadSort(t *testing.T) {
	sc := &sortScratch{}
	p63, _ := opaque.New(testKey, "t", 63)
	p16, _ := opaque.New(testKey, "t", 16)
	for _, tt := range []struct {
		name  string
		ids   []int64
		width uint
	}{
		{"Images63", images(t, p63, 1, 1000), 63},
		{"Images63Large", images(t, p63, 5000, 100_000), 63},
		{"Images16All", images(t, p16, 1, 65535), 16},
		{"OneBucket", seq(1, 500), 63},
		{"Descending", func() []int64 { ids := seq(1, 300); slices.Reverse(ids); return ids }(), 40},
		{"Repeats", []int64{5, 5, 1, 5, 1, 9, 9, 2, 3, 3, 5, 1, 1, 1, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 0}, 16},
	} {
		want := slices.Clone(tt.ids)
		slices.Sort(want)
		got := slices.Clone(tt.ids)
		spreadSort(got, sc, tt.width)
		if !slices.Equal(got, want) {
			t.Errorf("%s: spreadSort did not sort", tt.name)
		}
	}
	ranges := &fakeRanges{ranges: map[string]wire.TagRange{"t": {Bits: 63, Opaque: true, Key: testFP}}}
	s := newShaper(t, ranges, testKey)
	ids := seq(1, 50_000)
	if err := s.Shape("t", ids); err != nil || !slices.Equal(ids, sortedImages(t, p63, 1, 50_000)) {
		t.Fatalf("Shape of 50,000 IDs is not their images sorted: %v", err)
	}
}

func images(t *testing.T, p *opaque.Permutation, from int64, n int) []int64 {
	t.Helper()
	ids := seq(from, n)
	if err := p.PermuteAll(ids); err != nil {
		t.Fatal(err)
	}
	return ids
}

func sortedImages(t *testing.T, p *opaque.Permutation, from int64, n int) []int64 {
	ids := images(t, p, from, n)
	slices.Sort(ids)
	return ids
}

func BenchmarkShape(b *testing.B) {
	for _, tc := range []struct {
		name string
		r    wire.TagRange
	}{{"Default", wire.TagRange{}}, {"Capped53", wire.TagRange{Bits: 53}}, {"Opaque53", wire.TagRange{Bits: 53, Opaque: true, Key: testFP}}} {
		b.Run(tc.name, func(b *testing.B) {
			s, err := NewShaper(&fakeRanges{ranges: map[string]wire.TagRange{"t": tc.r}}, testKey)
			if err != nil {
				b.Fatal(err)
			}
			ids := make([]int64, 1000)
			next := int64(1)
			b.ReportAllocs()
			for b.Loop() {
				for i := range ids {
					ids[i] = next + int64(i)
				}
				next += int64(len(ids))
				if err := s.Shape("t", ids); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(ids)), "ns/id")
		})
	}
}
