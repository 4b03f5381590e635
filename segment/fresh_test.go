package segment

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestTakeSegment takes ranges past the buffers while the buffers serve the same tag:
// every range lies above everything taken before it, buffer loads included, and its end
// is the tag's mark before it is returned.
func TestTakeSegment(t *testing.T) {
	store := NewInmemStore()
	mustAdd(t, store, Tag{Name: "orders", Step: 10, MaxID: 1})
	marks := NewInmemMarks()
	cfg := testConfig(t, store)
	cfg.Marks = marks
	g, _ := startGenerator(t, cfg)
	ctx := context.Background()

	var highest int64
	for i := range 20 {
		for _, id := range fill(t, g, "orders", 3) {
			highest = max(highest, id)
		}
		r, err := g.TakeSegment(ctx, "orders", int64(i%3))
		if err != nil {
			t.Fatalf("TakeSegment: %v", err)
		}
		want := int64(10)
		if i%3 != 0 {
			want = int64(i % 3)
		}
		switch {
		case r.First <= highest:
			t.Fatalf("TakeSegment = %+v, not above the %d the buffers served", r, highest)
		case r.End-r.First != want || r.Step != want || r.StoredStep != 10:
			t.Fatalf("TakeSegment(step %d) = %+v, want %d IDs of stored step 10", i%3, r, want)
		case marks.Mark("orders") < r.End:
			t.Fatalf("mark %d after TakeSegment = %+v, want at least %d", marks.Mark("orders"), r, r.End)
		}
		highest = r.End - 1
	}
}

func TestTakeSegmentErrors(t *testing.T) {
	store := NewInmemStore()
	mustAdd(t, store, Tag{Name: "orders", Step: 10, MaxID: 1})
	marks := NewInmemMarks()
	if err := marks.Raise("orders", 1000); err != nil {
		t.Fatal(err)
	}
	cfg := testConfig(t, store)
	cfg.Marks = marks
	g, err := New(cfg) // no Run: TakeSegment does not need it
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	tests := []struct {
		name, tag string
		wantErr   error
	}{
		{"ErrInvalidTag", "no\x00nul", ErrInvalidTag},
		{"ErrTagNotFound", "missing", ErrTagNotFound},
		{"ErrStoreWentBack", "orders", ErrStoreWentBack},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := g.TakeSegment(ctx, tt.tag, 0)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("TakeSegment(%q) = %+v, %v; want %v", tt.tag, r, err, tt.wantErr)
			}
		})
	}
}
