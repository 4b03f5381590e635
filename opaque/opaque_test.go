package opaque

import (
	"errors"
	"fmt"
	"testing"
)

var testKey = []byte("0123456789abcdef0123456789abcdef")

func mustNew(tb testing.TB, key []byte, tag string, width int) *Permutation {
	tb.Helper()
	p, err := New(key, tag, width)
	if err != nil {
		tb.Fatal(err)
	}
	return p
}

// TestBijectionExhaustive: on small ranges every ID has exactly one image, inside the
// range, and Reveal takes each back.
func TestBijectionExhaustive(t *testing.T) {
	for _, width := range []int{16, 17, 20} {
		t.Run(fmt.Sprint(width), func(t *testing.T) {
			p := mustNew(t, testKey, "orders", width)
			seen := make([]bool, p.Max()+1)
			for x := int64(1); x <= p.Max(); x++ {
				y, err := p.Permute(x)
				if err != nil {
					t.Fatalf("Permute(%d): %v", x, err)
				}
				if y < 1 || y > p.Max() {
					t.Fatalf("Permute(%d) = %d, outside 1..%d", x, y, p.Max())
				}
				if seen[y] {
					t.Fatalf("Permute(%d) = %d, the image of another ID too", x, y)
				}
				seen[y] = true
				if back, err := p.Reveal(y); err != nil || back != x {
					t.Fatalf("Reveal(Permute(%d)) = %d, %v", x, back, err)
				}
			}
		})
	}
}

// TestNoCollisionsFullRange: millions of consecutive segment numbers of the full ranges
// (63 and 53 bits) have distinct images, each in range, each revealed back.
func TestNoCollisionsFullRange(t *testing.T) {
	n := int64(2_000_000)
	if testing.Short() {
		n = 200_000
	}
	for _, width := range []int{63, 53} {
		p := mustNew(t, testKey, "orders", width)
		seen := make(map[int64]struct{}, n)
		for _, start := range []int64{1, p.Max() - n} {
			for x := start; x < start+n/2; x++ {
				y, err := p.Permute(x)
				if err != nil || y < 1 || y > p.Max() {
					t.Fatalf("width %d: Permute(%d) = %d, %v", width, x, y, err)
				}
				if _, dup := seen[y]; dup {
					t.Fatalf("width %d: Permute(%d) = %d, already an image", width, x, y)
				}
				seen[y] = struct{}{}
				if x%1009 == 0 {
					if back, _ := p.Reveal(y); back != x {
						t.Fatalf("width %d: Reveal(Permute(%d)) = %d", width, x, back)
					}
				}
			}
		}
	}
}

// TestNoVisibleOrder: the images of consecutive segment numbers rise about half the
// time and spread over the whole range, so neither order nor density shows.
func TestNoVisibleOrder(t *testing.T) {
	for _, width := range []int{63, 53} {
		p := mustNew(t, testKey, "orders", width)
		const n = 100_000
		rises, high := 0, 0
		prev, _ := p.Permute(1)
		for x := int64(2); x <= n; x++ {
			y, _ := p.Permute(x)
			if y > prev {
				rises++
			}
			if y > p.Max()/2 {
				high++
			}
			prev = y
		}
		// With independent images the count of rises is about n/2 with a standard
		// deviation of about sqrt(n)/2 = 158: 10 deviations is a bug, not chance.
		if d := rises - n/2; d < -1580 || d > 1580 {
			t.Errorf("width %d: %d of %d consecutive pairs rise, want about half", width, rises, n-1)
		}
		if d := high - n/2; d < -1580 || d > 1580 {
			t.Errorf("width %d: %d of %d images in the upper half of the range, want about half", width, high, n)
		}
	}
}

// TestKeysTagsAndWidthsDiffer: another key, another tag or another width is another
// permutation; the same three are the same one.
func TestKeysTagsAndWidthsDiffer(t *testing.T) {
	base := mustNew(t, testKey, "orders", 53)
	same := mustNew(t, append([]byte(nil), testKey...), "orders", 53)
	other := map[string]*Permutation{
		"key":   mustNew(t, []byte("another key of sixteen bytes or more"), "orders", 53),
		"tag":   mustNew(t, testKey, "orders2", 53),
		"width": mustNew(t, testKey, "orders", 54),
	}
	for x := int64(1); x <= 1000; x++ {
		a, _ := base.Permute(x)
		if b, _ := same.Permute(x); a != b {
			t.Fatalf("the same key, tag and width map %d to %d and %d", x, a, b)
		}
	}
	for what, p := range other {
		equal := 0
		for x := int64(1); x <= 1000; x++ {
			a, _ := base.Permute(x)
			if b, _ := p.Permute(x); a == b {
				equal++
			}
		}
		if equal > 1 {
			t.Errorf("another %s maps %d of 1000 IDs as the first: want an unrelated permutation", what, equal)
		}
	}
	if Fingerprint(testKey) != Fingerprint(append([]byte(nil), testKey...)) || Fingerprint(testKey) == Fingerprint([]byte("another key of sixteen bytes or more")) {
		t.Error("Fingerprint: the same key must give the same, another key another")
	}
}

func TestInvalid(t *testing.T) {
	for _, tt := range []struct {
		name  string
		key   []byte
		width int
	}{
		{"ShortKey", []byte("short"), 53},
		{"Narrow", testKey, MinBits - 1},
		{"Wide", testKey, MaxBits + 1},
	} {
		if _, err := New(tt.key, "t", tt.width); !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: New = %v, want ErrInvalid", tt.name, err)
		}
	}
	p := mustNew(t, testKey, "t", 53)
	for _, x := range []int64{0, -1, p.Max() + 1} {
		if _, err := p.Permute(x); !errors.Is(err, ErrInvalid) {
			t.Errorf("Permute(%d) = %v, want ErrInvalid", x, err)
		}
		if _, err := p.Reveal(x); !errors.Is(err, ErrInvalid) {
			t.Errorf("Reveal(%d) = %v, want ErrInvalid", x, err)
		}
	}
}

func BenchmarkPermute(b *testing.B) {
	for _, width := range []int{63, 53} {
		b.Run(fmt.Sprint(width), func(b *testing.B) {
			p := mustNew(b, testKey, "orders", width)
			b.ReportAllocs()
			var sink int64
			for i := range b.N {
				y, _ := p.Permute(int64(i) + 1)
				sink ^= y
			}
			_ = sink
		})
	}
}

// TestPermuteAllIsPermute: the batch form gives each ID's Permute image, for runs of
// consecutive numbers (whose first round is shared), scattered ones, a run across a
// change of the upper half, and the one ID that cycle-walks.
func TestPermuteAllIsPermute(t *testing.T) {
	for _, width := range []int{16, 17, 53, 63} {
		p := mustNew(t, testKey, "orders", width)
		walker := int64(p.backward(0)) // forward(walker) is 0: its image is walked on
		half := int64(1) << p.right
		inputs := [][]int64{
			{1, 2, 3, 4, 5, 6, 7, 8, 9},
			{p.Max(), 1, p.Max() / 2, 77, 5, p.Max() - 1, 3},
			{half - 2, half - 1, half, half + 1, half + 2},
			{walker, walker, walker, walker, walker},
			{},
		}
		for _, in := range inputs {
			got := append([]int64(nil), in...)
			if err := p.PermuteAll(got); err != nil {
				t.Fatalf("width %d: PermuteAll(%v): %v", width, in, err)
			}
			for i, x := range in {
				if want, _ := p.Permute(x); got[i] != want {
					t.Fatalf("width %d: PermuteAll(%v)[%d] = %d, Permute(%d) = %d", width, in, i, got[i], x, want)
				}
			}
		}
		bad := []int64{1, 2, 0, 4}
		if err := p.PermuteAll(bad); !errors.Is(err, ErrInvalid) || bad[0] != 1 {
			t.Errorf("width %d: PermuteAll with a 0 = %v, %v; want ErrInvalid and ids unchanged", width, err, bad)
		}
	}
}

// TestKnownImages pins the permutation: the same key, tag and width must give these
// images in every version, or an opaque tag's IDs could meet the images an earlier
// version handed out (PROTOCOL.md "Opaque tags" describes how they are computed).
func TestKnownImages(t *testing.T) {
	for _, tt := range []struct {
		width int
		x     []int64
		want  []int64
	}{
		{63, []int64{1, 2, 3, 1 << 40}, []int64{3004394363433864821, 8406721314865402038, 4149434509971116221, 8604873391120521551}},
		{53, []int64{1, 2, 3, 1 << 40}, []int64{7197243652279862, 4488718916132576, 7627816310139680, 7219845642493961}},
		{16, []int64{1, 2, 3, 65535}, []int64{55943, 26070, 53684, 53046}},
	} {
		p := mustNew(t, testKey, "orders", tt.width)
		for i, x := range tt.x {
			if got, err := p.Permute(x); err != nil || got != tt.want[i] {
				t.Errorf("width %d: Permute(%d) = %d, %v; want %d", tt.width, x, got, err, tt.want[i])
			}
		}
	}
	if got, want := Fingerprint(testKey), "f412d2d97e6120bb37a45c97"; got != want {
		t.Errorf("Fingerprint = %s, want %s", got, want)
	}
}

func BenchmarkPermuteAll(b *testing.B) {
	for _, width := range []int{63, 53} {
		b.Run(fmt.Sprint(width), func(b *testing.B) {
			p := mustNew(b, testKey, "orders", width)
			ids := make([]int64, 1000)
			b.ReportAllocs()
			next := int64(1)
			for b.Loop() {
				for i := range ids {
					ids[i] = next + int64(i)
				}
				next += int64(len(ids))
				if err := p.PermuteAll(ids); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(ids)), "ns/id")
		})
	}
}
