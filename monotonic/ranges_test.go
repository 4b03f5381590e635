package monotonic

import (
	"errors"
	"fmt"
	"testing"

	"github.com/leafbus/leafbus/wire"
)

// TestResolveRange goes through every combination of what the three sources can say
// of a tag: no value, an unreadable one, or a readable one with the default, a cap, an
// opaque range or another opaque range; and each of memory and record saying nothing,
// a cap, an opaque range or another. It checks the rules of resolveRange against a
// second statement of them.
func TestResolveRange(t *testing.T) {
	const fpA, fpB = "f412d2d97e6120bb37a45c97", "0123456789abcdef01234567"
	cap53 := wire.TagRange{Bits: 53}
	cap40 := wire.TagRange{Bits: 40}
	opA := wire.TagRange{Bits: 53, Opaque: true, Key: fpA}
	opB := wire.TagRange{Bits: 53, Opaque: true, Key: fpB}
	op63 := wire.TagRange{Bits: 63, Opaque: true, Key: fpA}
	type val struct {
		name string
		v    *optValue
	}
	values := []val{
		{"none", nil},
		{"unreadable", &optValue{}},
		{"default", &optValue{readable: true}},
		{"cap53", &optValue{r: cap53, readable: true}},
		{"cap40", &optValue{r: cap40, readable: true}},
		{"opA", &optValue{r: opA, readable: true}},
		{"opB", &optValue{r: opB, readable: true}},
		{"op63", &optValue{r: op63, readable: true}},
	}
	type word struct {
		name string
		r    *wire.TagRange
	}
	words := []word{{"none", nil}, {"cap53", &cap53}, {"cap40", &cap40}, {"opA", &opA}, {"opB", &opB}, {"op63", &op63}}
	for _, v := range values {
		for _, mem := range words {
			for _, rec := range words {
				name := fmt.Sprintf("value=%s/memory=%s/record=%s", v.name, mem.name, rec.name)
				r, writeBack, err := resolveRange("t", v.v, mem.r, rec.r)
				wantR, wantWB, wantErr := expectRange(v.v, mem.r, rec.r)
				if wantErr {
					if !errors.Is(err, ErrRangeConflict) || !errors.Is(err, wire.ErrUnavailable) {
						t.Errorf("%s: resolveRange = %v, %v, %v; want ErrRangeConflict (a 503)", name, r, writeBack, err)
					}
					continue
				}
				if err != nil || r != wantR || writeBack != wantWB {
					t.Errorf("%s: resolveRange = %v, writeBack %v, %v; want %v, writeBack %v", name, r, writeBack, err, wantR, wantWB)
				}
				if (v.v != nil && v.v.r.Opaque || mem.r != nil && mem.r.Opaque || rec.r != nil && rec.r.Opaque) && !r.Opaque {
					t.Errorf("%s: a tag that any source calls opaque resolved to %v", name, r)
				}
			}
		}
	}
}

// expectRange states resolveRange's rules another way: the opaque words first (all
// must be one range, and every word must be it, except a readable default value,
// which is written back, and an unreadable one); then the caps: the readable value,
// the record, the memory; an unreadable value alone is refused.
func expectRange(v *optValue, mem, rec *wire.TagRange) (wire.TagRange, bool, bool) {
	var named []wire.TagRange
	if v != nil && v.readable && !v.r.IsDefault() {
		named = append(named, v.r)
	}
	for _, w := range []*wire.TagRange{mem, rec} {
		if w != nil {
			named = append(named, *w)
		}
	}
	anyOpaque := false
	for _, r := range named {
		anyOpaque = anyOpaque || r.Opaque
	}
	if anyOpaque {
		for _, r := range named {
			if r != named[0] {
				return wire.TagRange{}, false, true
			}
		}
		return named[0], v == nil || v.readable && v.r.IsDefault(), false
	}
	switch {
	case v != nil && v.readable:
		return v.r, false, false
	case rec != nil:
		return *rec, v == nil, false
	case mem != nil:
		return *mem, v == nil, false
	case v != nil:
		return wire.TagRange{}, false, true
	}
	return wire.TagRange{}, false, false
}

// TestRangeSetLookup: a tag with a range is found by its exact name; any other spelling
// is another tag with the default range (the segment store refuses the spellings its
// collation would take for the row: segment.ErrTagSpelling).
func TestRangeSetLookup(t *testing.T) {
	r := wire.TagRange{Bits: 53}
	s := &rangeSet{exact: map[string]rangeEntry{"Orders": {r: r}}}
	if got, err := s.lookup("Orders"); err != nil || got != r {
		t.Errorf("lookup(Orders) = %v, %v; want %v", got, err, r)
	}
	for _, other := range []string{"ORDERS", "orders", "users"} {
		if got, err := s.lookup(other); err != nil || !got.IsDefault() {
			t.Errorf("lookup(%s) = %v, %v; want the default", other, got, err)
		}
	}
	if testing.AllocsPerRun(100, func() { _, _ = s.lookup("Orders") }) != 0 {
		t.Error("lookup allocates")
	}
}
