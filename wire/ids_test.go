package wire

import (
	"bytes"
	"encoding/binary"
	"math"
	"math/rand/v2"
	"slices"
	"strconv"
	"testing"
	"time"
)

// batchShapes are batches of 1000 IDs as the dispenser encodes them: consecutive
// segment IDs of 10 digits, and of 7 (a young tag), a snowflake batch taken within one
// millisecond (consecutive, 19 digits), and snowflake IDs a millisecond apart (a gap
// before every ID).
func batchShapes() []struct {
	name string
	ids  []int64
} {
	const n = 1000
	shapes := []struct {
		name string
		ids  []int64
	}{
		{"consecutive", run(1_000_000_000, n)},
		{"small", run(1_000_000, n)},
		{"snowflake-run", run(1_860_000_000_000_000_000, n)},
		{"snowflake-spread", make([]int64, n)},
	}
	for i := range n {
		shapes[3].ids[i] = 1_860_000_000_000_000_000 + int64(i)*4_194_304 + int64(i%7)
	}
	return shapes
}

// encoders are what BenchmarkAppendIDs compares: AppendIDs's text and binary
// encodings, and the text encoder of main at d9fb719 (appendTextBefore).
var encoders = []struct {
	name   string
	encode func([]byte, []int64) []byte
}{
	{"text", func(dst []byte, ids []int64) []byte { return AppendIDs(dst, ids, Text) }},
	{"text-before", appendTextBefore},
	{"binary", func(dst []byte, ids []int64) []byte { return AppendIDs(dst, ids, Binary) }},
}

// BenchmarkAppendIDs measures reply encoding per ID (ns/ID), for each encoder and shape
// of batch.
func BenchmarkAppendIDs(b *testing.B) {
	for _, e := range encoders {
		for _, s := range batchShapes() {
			b.Run(e.name+"/"+s.name, func(b *testing.B) {
				b.ReportAllocs()
				buf := make([]byte, 0, len(s.ids)*MaxTextID)
				for b.Loop() {
					buf = e.encode(buf[:0], s.ids)
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(s.ids)), "ns/ID")
			})
		}
	}
}

// BenchmarkAppendIDsInterleaved encodes each batch with every encoder in turn, timing
// each call, and reports the median time per ID of each: text-ns/ID, text-before-ns/ID,
// binary-ns/ID (ns/op is the three calls and their clock reads together). On a shared
// host the mean of a benchmark moves with whatever else runs, from one sub-benchmark to
// the next; calls taking turns and medians (of the last 2^16 calls) compare the encoders
// under the same conditions.
func BenchmarkAppendIDsInterleaved(b *testing.B) {
	for _, s := range batchShapes() {
		b.Run(s.name, func(b *testing.B) {
			b.ReportAllocs()
			buf := make([]byte, 0, len(s.ids)*MaxTextID)
			took := make([][]time.Duration, len(encoders))
			for k := range took {
				took[k] = make([]time.Duration, 1<<16)
			}
			calls := 0
			for b.Loop() {
				for k, e := range encoders {
					start := time.Now()
					buf = e.encode(buf[:0], s.ids)
					took[k][calls%len(took[k])] = time.Since(start)
				}
				calls++
			}
			for k, e := range encoders {
				d := took[k][:min(calls, len(took[k]))]
				slices.Sort(d)
				b.ReportMetric(float64(d[len(d)/2].Nanoseconds())/float64(len(s.ids)), e.name+"-ns/ID")
			}
		})
	}
}

// formatIDs is the text encoding by definition: each ID as strconv formats it, joined
// by '\n'. AppendIDs must write exactly this for every input.
func formatIDs(dst []byte, ids []int64) []byte {
	for i, id := range ids {
		if i > 0 {
			dst = append(dst, '\n')
		}
		dst = strconv.AppendInt(dst, id, 10)
	}
	return dst
}

// run returns n consecutive IDs from from.
func run(from int64, n int) []int64 {
	ids := make([]int64, n)
	for i := range ids {
		ids[i] = from + int64(i)
	}
	return ids
}

// checkText fails t unless AppendIDs writes ids as formatIDs does, after what dst holds.
func checkText(t *testing.T, name string, dst []byte, ids []int64) {
	t.Helper()
	want := formatIDs([]byte(string(dst)), ids)
	if got := AppendIDs(dst, ids, Text); string(got) != string(want) {
		t.Errorf("%s: AppendIDs(%q, %d IDs from %d) =\n%q\nwant\n%q", name, dst, len(ids), ids[0], got, want)
	}
}

// TestAppendIDsText checks the text encoding against formatting every ID with strconv:
// runs across every power of ten (where a line gets longer) and across multiples of
// 10^8 (where the digits shared by a run change), runs up to 2^63-1, gaps, IDs too
// small for the word-at-a-time path, and inputs outside the caller's promise.
func TestAppendIDsText(t *testing.T) {
	cat := func(parts ...[]int64) []int64 { return slices.Concat(parts...) }
	cases := map[string][]int64{
		"one":                 {7},
		"one largest":         {math.MaxInt64},
		"carry 9":             run(1, 25),
		"carry 999":           run(990, 30),
		"small to word lines": run(9_999_900, 300),
		"head 0 to 1":         run(99_999_950, 100),
		"head change":         run(12_399_999_950, 120),
		"largest":             run(math.MaxInt64-250, 251),
		"19 digits":           run(999_999_999_999_999_990, 20),
		"gaps":                {1, 2, 3, 10, 11, 99, 100, 101, 1000, 5000, 5001, 10_000_099, 10_000_100, 10_000_102},
		"snowflake spread":    {1860000000000000000, 1860000000004194304, 1860000000004194305, 1860000000008388608},
		"snowflake ms":        cat(run(1860000000000000097, 30), run(1860000000004194304+42, 100), run(1860000000008388608, 7)),
		"run then gap":        cat(run(8, 5), []int64{20, 21, 22, 40}),
		"gap inside hundred":  cat(run(1_000_000_010, 20), run(1_000_000_031, 20), run(1_000_000_052, 200)),
		"single in hundreds":  {1_000_000_099, 1_000_000_100, 1_000_000_299, 1_000_000_301},
		"whole hundreds":      run(1_000_000_000, 2500),
		// The first ID is written apart: each of these starts with another, so that whole
		// hundreds follow whole hundreds.
		"hundreds apart":      cat([]int64{1}, run(1_000_001_900, 100), run(1_000_002_300, 100), run(1_000_002_500, 100)),
		"hundreds, same head": cat([]int64{1}, run(1_000_001_000, 100), run(1_000_001_200, 100), run(1_000_001_300, 100)),
		"hundreds, new head":  cat([]int64{1}, run(1_099_999_900, 100), run(1_100_000_000, 200), run(1_100_000_300, 100)),
		// Outside the promise (positive, strictly increasing): written as strconv does.
		"zero":             {0, 1, 2},
		"negative":         {-3, -2, -1, 0, 1},
		"minimum":          {math.MinInt64, math.MinInt64 + 1},
		"past the largest": {math.MaxInt64 - 1, math.MaxInt64, math.MinInt64, math.MinInt64 + 1},
		"decreasing":       {1_000_000_005, 1_000_000_004, 1_000_000_006, 1_000_000_006},
	}
	for k := 1; k <= 18; k++ {
		p := int64(math.Pow10(k))
		cases["across 10^"+strconv.Itoa(k)] = run(p-150, 300)
	}
	for name, ids := range cases {
		checkText(t, name, nil, ids)
		checkText(t, name+" after x", []byte("x"), ids)
	}
}

// TestAppendIDsTextLiteral pins a few replies byte for byte.
func TestAppendIDsTextLiteral(t *testing.T) {
	tests := []struct {
		name string
		ids  []int64
		want string
	}{
		{"Run", []int64{99_999_998, 99_999_999, 100_000_000, 100_000_001}, "99999998\n99999999\n100000000\n100000001"},
		{"Largest", []int64{math.MaxInt64 - 1, math.MaxInt64}, "9223372036854775806\n9223372036854775807"},
		{"Gaps", []int64{9_999_999, 10_000_000, 10_000_002, 1_860_000_000_004_194_304}, "9999999\n10000000\n10000002\n1860000000004194304"},
		// Outside the promise: the increment past 2^63-1 wraps to the smallest int64,
		// which is written as a negative number, not as 9223372036854775808.
		{"Wrapped", []int64{math.MaxInt64, math.MinInt64}, "9223372036854775807\n-9223372036854775808"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := string(AppendIDs(nil, tt.ids, Text)); got != tt.want {
				t.Fatalf("AppendIDs(%v, Text) = %q, want %q", tt.ids, got, tt.want)
			}
		})
	}
}

// TestAppendIDsTextEveryOffset writes runs starting at every offset within a hundred,
// of lengths around one and two hundreds, at every line length, each alone and after a
// gap: every way a run can be cut by the hundreds that share their first digits.
func TestAppendIDsTextEveryOffset(t *testing.T) {
	lengths := []int{1, 2, 3, 98, 99, 100, 101, 102, 199, 200, 201}
	for digits := 8; digits <= 19; digits++ {
		base := int64(math.Pow10(digits-1)) + 123_400 // a hundred's start with this many digits
		if digits == 19 {
			base = math.MaxInt64 - 807 - 1000
		}
		for first := range int64(100) {
			for _, n := range lengths {
				ids := run(base+first, n)
				checkText(t, "run", nil, ids)
				checkText(t, "after a gap", nil, append([]int64{base - 1000}, ids...))
			}
		}
	}
}

// TestAppendIDsTextRandom checks batches made of random runs and gaps at random
// magnitudes, as segment batches (runs across segments) and snowflake batches (runs
// within a millisecond, gaps between) are, against strconv, and that they decode back.
func TestAppendIDsTextRandom(t *testing.T) {
	rng := rand.New(rand.NewPCG(22, 1))
	for range 3000 {
		limit := int64(math.MaxInt64) // a first ID of 1 to 19 digits
		if digits := 1 + rng.IntN(19); digits < 19 {
			limit = int64(math.Pow10(digits))
		}
		id := rng.Int64N(limit) + 1
		var ids []int64
	batch:
		for len(ids) < 2000 {
			n := 1 + rng.IntN(300)
			if rng.IntN(3) == 0 {
				n = 1
			}
			for range n {
				ids = append(ids, id)
				if id == math.MaxInt64 {
					break batch
				}
				id++
			}
			gap := rng.Int64N(int64(math.Pow10(rng.IntN(13)))) + 1
			if rng.IntN(4) == 0 { // to the start of a hundred: whole hundreds apart
				gap += 100 - (id+gap)%100
			}
			if id > math.MaxInt64-gap {
				break
			}
			id += gap
		}
		got := AppendIDs(nil, ids, Text)
		if want := formatIDs(nil, ids); string(got) != string(want) {
			t.Fatalf("AppendIDs(%v) =\n%q\nwant\n%q", ids, got, want)
		}
		back, err := DecodeIDs(nil, got, Text)
		if err != nil || !slices.Equal(back, ids) {
			t.Fatalf("DecodeIDs(AppendIDs(%v)) = %v, %v", ids, back, err)
		}
	}
}

// TestAppendIDsGrows checks that AppendIDs grows a dst too small, wherever the room
// runs out: before the first ID, within a run, between word lines and strconv ones.
func TestAppendIDsGrows(t *testing.T) {
	ids := slices.Concat(run(9_999_990, 20), run(math.MaxInt64-350, 300))
	want := formatIDs([]byte("ab"), ids)
	for room := range 64 {
		dst := make([]byte, 2, 2+room)
		copy(dst, "ab")
		if got := AppendIDs(dst, ids, Text); string(got) != string(want) {
			t.Fatalf("AppendIDs into %d bytes of room = %q, want %q", room, got, want)
		}
	}
}

// TestAppendIDsAllocatesNothing: with room for len(ids)*MaxTextID bytes, as the
// service's reply buffers have, encoding allocates nothing, even when every line is
// MaxTextID long (19-digit IDs up to 2^63-1).
func TestAppendIDsAllocatesNothing(t *testing.T) {
	shapes := map[string][]int64{
		"19-digit run":     run(math.MaxInt64-999, 1000),
		"10-digit run":     run(1_000_000_000, 1000),
		"small":            run(1, 1000),
		"snowflake spread": slices.Concat(run(1860000000000000097, 3), []int64{1860000000004194304, 1860000000008388608}),
	}
	for name, ids := range shapes {
		for _, enc := range []Encoding{Text, Binary} {
			buf := make([]byte, 0, len(ids)*MaxTextID) // never replaced by a grown one
			var out []byte
			if allocs := testing.AllocsPerRun(20, func() { out = AppendIDs(buf[:0], ids, enc) }); allocs != 0 {
				t.Errorf("%s, %v: AppendIDs allocated %v times, want 0", name, enc, allocs)
			}
			if want := AppendIDs(nil, ids, enc); !bytes.Equal(out, want) {
				t.Errorf("%s, %v: AppendIDs into the buffer = %q, want %q", name, enc, out, want)
			}
		}
	}
}

// TestDigits8 checks the word-at-a-time conversion against a decimal counter for every
// value it is given: 0 to 10^8-1. The counter is a word too (its last byte the least
// significant digit), raised in registers, so that the race detector has no memory to
// watch and the 10^8 rounds take about a second.
func TestDigits8(t *testing.T) {
	want := uint64(0x30303030_30303030) // "00000000"
	for v := range uint64(1e8) {
		if got := digits8(v); got != want {
			var g, w [8]byte
			binary.LittleEndian.PutUint64(g[:], got)
			binary.LittleEndian.PutUint64(w[:], want)
			t.Fatalf("digits8(%d) = %q, want %q", v, g[:], w[:])
		}
		for shift := 56; shift >= 0; shift -= 8 { // raise the counter
			if want>>shift&0xff != '9' {
				want += 1 << shift
				break
			}
			want = want&^(0xff<<shift) | '0'<<shift
		}
	}
}
