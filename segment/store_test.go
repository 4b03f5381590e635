package segment

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// peerStore is implemented by a store under test that can open another instance over the
// same data, as a second dispenser would (a second KV connection, a second *sql.DB).
// testStore then spreads its concurrency subtest over several instances.
type peerStore interface {
	Store
	peer(t *testing.T) Store
}

// testStore runs the Store conformance suite. open must return a store over fresh, empty
// data each time it is called (every subtest calls it once); a store that implements
// peerStore is also tested as several instances sharing that data. Every implementation
// runs this suite, so the fakes cannot drift from the real stores.
func testStore(t *testing.T, open func(t *testing.T) Store) {
	ctx := func(t *testing.T) context.Context {
		c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		t.Cleanup(cancel)
		return c
	}

	t.Run("Take/ErrTagNotFound", func(t *testing.T) {
		s := open(t)
		if _, err := s.Take(ctx(t), "nope", 0); !errors.Is(err, ErrTagNotFound) {
			t.Fatalf("Take(unknown) err = %v, want ErrTagNotFound", err)
		}
	})

	t.Run("Take/StoredStep", func(t *testing.T) {
		s := open(t)
		mustAdd(t, s, Tag{Name: "orders", Step: 100})
		got, err := s.Take(ctx(t), "orders", 0)
		if err != nil {
			t.Fatalf("Take: %v", err)
		}
		if got.Name != "orders" || got.MaxID != 101 || got.Step != 100 {
			t.Fatalf("Take(step 0) = %+v, want orders max_id 101 step 100", got)
		}
	})

	t.Run("Take/CustomStep", func(t *testing.T) {
		s := open(t)
		mustAdd(t, s, Tag{Name: "orders", Step: 100, MaxID: 1000})
		got, err := s.Take(ctx(t), "orders", 250)
		if err != nil {
			t.Fatalf("Take: %v", err)
		}
		// The row keeps its stored step: a custom step only moves max_id.
		if got.MaxID != 1250 || got.Step != 100 {
			t.Fatalf("Take(step 250) = %+v, want max_id 1250 step 100", got)
		}
		if got, err = s.Tag(ctx(t), "orders"); err != nil || got.MaxID != 1250 {
			t.Fatalf("Tag after Take = %+v, %v; want max_id 1250", got, err)
		}
	})

	t.Run("Take/Adjacent", func(t *testing.T) {
		s := open(t)
		mustAdd(t, s, Tag{Name: "a", Step: 10})
		end := int64(1)
		for i, step := range []int64{0, 5, 0, 1000, 1, MaxStoredStep} {
			got, err := s.Take(ctx(t), "a", step)
			if err != nil {
				t.Fatalf("Take #%d: %v", i, err)
			}
			if step == 0 {
				step = got.Step
			}
			if start := got.MaxID - step; start != end {
				t.Fatalf("Take #%d (step %d) granted [%d, %d), want it to start at %d", i, step, start, got.MaxID, end)
			}
			end = got.MaxID
		}
	})

	t.Run("Take/ErrInvalidTag", func(t *testing.T) {
		s := open(t)
		mustAdd(t, s, Tag{Name: "a", Step: 10})
		for _, tc := range []struct {
			name string
			step int64
		}{{"a", -1}, {"a", MaxStoredStep + 1}, {"a\nb", 0}, {"", 0}, {"a\xff", 0}} {
			if _, err := s.Take(ctx(t), tc.name, tc.step); !errors.Is(err, ErrInvalidTag) {
				t.Errorf("Take(%q, %d) err = %v, want ErrInvalidTag", tc.name, tc.step, err)
			}
		}
		if got, err := s.Tag(ctx(t), "a"); err != nil || got.MaxID != 1 {
			t.Fatalf("Tag after refused Takes = %+v, %v; want max_id 1", got, err)
		}
	})

	t.Run("Take/ErrMaxIDOverflow", func(t *testing.T) {
		s := open(t)
		const top = 1<<63 - 1
		mustAdd(t, s, Tag{Name: "full", Step: 10, MaxID: top - 5})
		if _, err := s.Take(ctx(t), "full", 0); !errors.Is(err, ErrMaxIDOverflow) {
			t.Fatalf("Take past int64 err = %v, want ErrMaxIDOverflow", err)
		}
		if got, err := s.Tag(ctx(t), "full"); err != nil || got.MaxID != top-5 {
			t.Fatalf("Tag after refused Take = %+v, %v; want max_id unchanged", got, err)
		}
		got, err := s.Take(ctx(t), "full", 5)
		if err != nil || got.MaxID != top {
			t.Fatalf("Take(step 5) = %+v, %v; want max_id %d", got, err, int64(top))
		}
	})

	t.Run("Take/ConcurrentDisjoint", func(t *testing.T) {
		s := open(t)
		mustAdd(t, s, Tag{Name: "hot", Step: 7})
		instances := []Store{s}
		if p, ok := s.(peerStore); ok {
			for range 3 {
				instances = append(instances, p.peer(t))
			}
		}
		const workers, perWorker = 8, 25
		type grant struct{ start, end int64 }
		var mu sync.Mutex
		var grants []grant
		var wg sync.WaitGroup
		for w := range workers {
			wg.Go(func() {
				st := instances[w%len(instances)]
				for i := range perWorker {
					step := int64(0)
					if i%3 == 1 {
						step = int64(1 + w) // custom steps interleaved with stored ones
					}
					got, err := st.Take(ctx(t), "hot", step)
					if err != nil {
						t.Errorf("worker %d Take: %v", w, err)
						return
					}
					if step == 0 {
						step = got.Step
					}
					mu.Lock()
					grants = append(grants, grant{got.MaxID - step, got.MaxID})
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		if t.Failed() {
			return
		}
		slices.SortFunc(grants, func(a, b grant) int { return cmp.Compare(a.start, b.start) })
		next := int64(1)
		for _, g := range grants {
			if g.start != next {
				t.Fatalf("ranges overlap or leave a hole: [%d, %d) follows %d", g.start, g.end, next)
			}
			next = g.end
		}
		if got, err := s.Tag(ctx(t), "hot"); err != nil || got.MaxID != next {
			t.Fatalf("Tag after %d Takes = %+v, %v; want max_id %d", len(grants), got, err, next)
		}
	})

	t.Run("AddTag/ErrTagExists", func(t *testing.T) {
		s := open(t)
		mustAdd(t, s, Tag{Name: "a", Step: 10})
		if _, err := s.AddTag(ctx(t), Tag{Name: "a", Step: 20}); !errors.Is(err, ErrTagExists) {
			t.Fatalf("AddTag(existing) err = %v, want ErrTagExists", err)
		}
		if got, _ := s.Tag(ctx(t), "a"); got.Step != 10 {
			t.Fatalf("existing tag changed to %+v", got)
		}
	})

	t.Run("AddTag/ErrInvalidTag", func(t *testing.T) {
		s := open(t)
		for _, tc := range []struct {
			name string
			tag  Tag
		}{
			{"EmptyName", Tag{Name: "", Step: 1}},
			{"BadName", Tag{Name: "a\tb", Step: 1}},
			{"LongName", Tag{Name: strings.Repeat("a", 129), Step: 1}},
			{"LongChineseName", Tag{Name: strings.Repeat("订", 129), Step: 1}},
			{"StepZero", Tag{Name: "a", Step: 0}},
			{"StepTooBig", Tag{Name: "a", Step: MaxStoredStep + 1}},
			{"NegativeMaxID", Tag{Name: "a", Step: 1, MaxID: -1}},
			{"LongDescription", Tag{Name: "a", Step: 1, Description: strings.Repeat("é", 257)}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				if _, err := s.AddTag(ctx(t), tc.tag); !errors.Is(err, ErrInvalidTag) {
					t.Fatalf("AddTag(%+v) err = %v, want ErrInvalidTag", tc.tag, err)
				}
			})
		}
		if list, err := s.Tags(ctx(t)); err != nil || len(list) != 0 {
			t.Fatalf("Tags after refused adds = %+v, %v; want none", list, err)
		}
	})

	t.Run("AddTag/OK", func(t *testing.T) {
		s := open(t)
		before := time.Now().Add(-2 * time.Second)
		desc := strings.Repeat("é", 256)
		added, err := s.AddTag(ctx(t), Tag{Name: "orders", Step: 1000, Description: desc})
		if err != nil {
			t.Fatalf("AddTag: %v", err)
		}
		if added.MaxID != 1 || added.Step != 1000 || added.Description != desc {
			t.Fatalf("AddTag = %+v, want max_id 1 (the default), step 1000, the description", added)
		}
		if added.UpdateTime.Before(before) || added.UpdateTime.After(time.Now().Add(2*time.Second)) {
			t.Fatalf("AddTag update_time = %v, want about now", added.UpdateTime)
		}
		got, err := s.Tag(ctx(t), "orders")
		if err != nil {
			t.Fatalf("Tag: %v", err)
		}
		if !sameTag(got, added) {
			t.Fatalf("Tag = %+v, want what AddTag returned, %+v", got, added)
		}
		withMax, err := s.AddTag(ctx(t), Tag{Name: "legacy", Step: 5, MaxID: 70000})
		if err != nil || withMax.MaxID != 70000 {
			t.Fatalf("AddTag(max_id 70000) = %+v, %v", withMax, err)
		}
	})

	t.Run("UpdateTag/ErrTagNotFound", func(t *testing.T) {
		s := open(t)
		step := int64(5)
		if _, err := s.UpdateTag(ctx(t), TagUpdate{Name: "nope", Step: &step}); !errors.Is(err, ErrTagNotFound) {
			t.Fatalf("UpdateTag(unknown) err = %v, want ErrTagNotFound", err)
		}
	})

	t.Run("UpdateTag/OK", func(t *testing.T) {
		s := open(t)
		mustAdd(t, s, Tag{Name: "a", Step: 10, Description: "old"})
		if _, err := s.Take(ctx(t), "a", 0); err != nil {
			t.Fatalf("Take: %v", err)
		}
		step, desc := int64(500), "new"
		for _, tc := range []struct {
			name     string
			update   TagUpdate
			wantStep int64
			wantDesc string
		}{
			{"Step", TagUpdate{Name: "a", Step: &step}, 500, "old"},
			{"Description", TagUpdate{Name: "a", Description: &desc}, 500, "new"},
			{"Nothing", TagUpdate{Name: "a"}, 500, "new"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				got, err := s.UpdateTag(ctx(t), tc.update)
				if err != nil {
					t.Fatalf("UpdateTag: %v", err)
				}
				if got.Step != tc.wantStep || got.Description != tc.wantDesc || got.MaxID != 11 {
					t.Fatalf("UpdateTag = %+v, want step %d, description %q, max_id 11 unchanged", got, tc.wantStep, tc.wantDesc)
				}
				if stored, err := s.Tag(ctx(t), "a"); err != nil || !sameTag(stored, got) {
					t.Fatalf("Tag = %+v, %v; want what UpdateTag returned, %+v", stored, err, got)
				}
			})
		}
		got, err := s.Take(ctx(t), "a", 0)
		if err != nil || got.MaxID != 511 {
			t.Fatalf("Take after the step update = %+v, %v; want max_id 511", got, err)
		}
	})

	t.Run("UpdateTag/ErrInvalidTag", func(t *testing.T) {
		s := open(t)
		mustAdd(t, s, Tag{Name: "a", Step: 10})
		zero, huge, long := int64(0), int64(MaxStoredStep+1), strings.Repeat("x", 257)
		for _, u := range []TagUpdate{{Name: "a", Step: &zero}, {Name: "a", Step: &huge}, {Name: "a", Description: &long}, {Name: "a", MaxID: &zero}} {
			if _, err := s.UpdateTag(ctx(t), u); !errors.Is(err, ErrInvalidTag) {
				t.Errorf("UpdateTag(%+v) err = %v, want ErrInvalidTag", u, err)
			}
		}
		if got, _ := s.Tag(ctx(t), "a"); got.Step != 10 {
			t.Fatalf("tag changed by refused updates: %+v", got)
		}
	})

	t.Run("UpdateTag/MaxID", func(t *testing.T) {
		s := open(t)
		mustAdd(t, s, Tag{Name: "a", Step: 10})
		if _, err := s.Take(ctx(t), "a", 0); err != nil {
			t.Fatalf("Take: %v", err)
		}
		ptr := func(v int64) *int64 { return &v }
		for _, tc := range []struct {
			name    string
			update  TagUpdate
			wantMax int64
			wantErr error
		}{
			{"OK", TagUpdate{Name: "a", MaxID: ptr(5000)}, 5000, nil},
			{"OK/Unchanged", TagUpdate{Name: "a", MaxID: ptr(5000)}, 5000, nil},
			{"ErrInvalidTag/Lower", TagUpdate{Name: "a", MaxID: ptr(4999)}, 5000, ErrInvalidTag},
			{"ErrInvalidTag/LowerWithStep", TagUpdate{Name: "a", MaxID: ptr(1), Step: ptr(77)}, 5000, ErrInvalidTag},
			{"ErrInvalidTag/Zero", TagUpdate{Name: "a", MaxID: ptr(0)}, 5000, ErrInvalidTag},
			{"ErrInvalidTag/Negative", TagUpdate{Name: "a", MaxID: ptr(-9000)}, 5000, ErrInvalidTag},
			{"ErrTagNotFound", TagUpdate{Name: "nope", MaxID: ptr(9000)}, 5000, ErrTagNotFound},
		} {
			t.Run(tc.name, func(t *testing.T) {
				got, err := s.UpdateTag(ctx(t), tc.update)
				if !errors.Is(err, tc.wantErr) || (tc.wantErr == nil && err != nil) {
					t.Fatalf("UpdateTag(max_id %d) = %+v, %v; want error %v", *tc.update.MaxID, got, err, tc.wantErr)
				}
				if tc.wantErr == nil && got.MaxID != tc.wantMax {
					t.Fatalf("UpdateTag(max_id %d) = %+v, want max_id %d", *tc.update.MaxID, got, tc.wantMax)
				}
				stored, err := s.Tag(ctx(t), "a")
				if err != nil || stored.MaxID != tc.wantMax || stored.Step != 10 {
					t.Fatalf("Tag after UpdateTag = %+v, %v; want max_id %d, step 10 (a refused update changes nothing)", stored, err, tc.wantMax)
				}
			})
		}
		got, err := s.UpdateTag(ctx(t), TagUpdate{Name: "a", MaxID: ptr(7000), Step: ptr(20)})
		if err != nil || got.MaxID != 7000 || got.Step != 20 {
			t.Fatalf("UpdateTag(max_id 7000, step 20) = %+v, %v; want both applied", got, err)
		}
		// The next segment starts at the new max_id.
		if got, err = s.Take(ctx(t), "a", 0); err != nil || got.MaxID != 7020 {
			t.Fatalf("Take after raising max_id = %+v, %v; want max_id 7020", got, err)
		}
	})

	t.Run("UpdateTag/MaxIDConcurrentTakes", func(t *testing.T) {
		// An operator raising max_id while dispensers take: no range is granted twice
		// (raising leaves a hole, never an overlap), and a raise never lowers max_id
		// below what a Take already granted.
		s := open(t)
		mustAdd(t, s, Tag{Name: "hot", Step: 5})
		instances := []Store{s}
		if p, ok := s.(peerStore); ok {
			for range 2 {
				instances = append(instances, p.peer(t))
			}
		}
		type grant struct{ start, end int64 }
		var mu sync.Mutex
		var grants []grant
		var wg sync.WaitGroup
		for w := range 4 {
			wg.Go(func() {
				st := instances[w%len(instances)]
				for range 25 {
					got, err := st.Take(ctx(t), "hot", 0)
					if err != nil {
						t.Errorf("worker %d Take: %v", w, err)
						return
					}
					mu.Lock()
					grants = append(grants, grant{got.MaxID - got.Step, got.MaxID})
					mu.Unlock()
				}
			})
		}
		wg.Go(func() {
			for i := range 10 {
				target := int64(100 * (i + 1))
				cur, err := s.Tag(ctx(t), "hot")
				if err != nil {
					t.Errorf("Tag: %v", err)
					return
				}
				got, err := s.UpdateTag(ctx(t), TagUpdate{Name: "hot", MaxID: &target})
				switch {
				case err == nil && cur.MaxID > target:
					t.Errorf("UpdateTag(max_id %d) lowered max_id from %d", target, cur.MaxID)
				case err == nil && got.MaxID != target:
					t.Errorf("UpdateTag(max_id %d) = %+v", target, got)
				case err != nil && !errors.Is(err, ErrInvalidTag):
					t.Errorf("UpdateTag(max_id %d): %v", target, err)
				case err != nil && cur.MaxID <= target:
					// Takes may have passed target since we read; the refusal must
					// then come from a max_id above it, which the next read shows.
					if now, _ := s.Tag(ctx(t), "hot"); now.MaxID <= target {
						t.Errorf("UpdateTag(max_id %d) refused while max_id is %d: %v", target, now.MaxID, err)
					}
				}
			}
		})
		wg.Wait()
		if t.Failed() {
			return
		}
		slices.SortFunc(grants, func(a, b grant) int { return cmp.Compare(a.start, b.start) })
		for i := 1; i < len(grants); i++ {
			if grants[i].start < grants[i-1].end {
				t.Fatalf("ranges overlap: [%d, %d) and [%d, %d)", grants[i-1].start, grants[i-1].end, grants[i].start, grants[i].end)
			}
		}
		if got, err := s.Tag(ctx(t), "hot"); err != nil || got.MaxID < grants[len(grants)-1].end {
			t.Fatalf("Tag = %+v, %v; want max_id at least the last grant's end %d", got, err, grants[len(grants)-1].end)
		}
	})

	t.Run("Tags/Sorted", func(t *testing.T) {
		s := open(t)
		list, err := s.Tags(ctx(t))
		if err != nil || len(list) != 0 {
			t.Fatalf("Tags of an empty store = %+v, %v; want none and no error", list, err)
		}
		var want []string
		for i := range 30 {
			want = append(want, fmt.Sprintf("t%02d", (i*7)%30))
		}
		for _, name := range want {
			mustAdd(t, s, Tag{Name: name, Step: 3})
		}
		if _, err := s.Take(ctx(t), "t05", 0); err != nil {
			t.Fatalf("Take: %v", err)
		}
		list, err = s.Tags(ctx(t))
		if err != nil {
			t.Fatalf("Tags: %v", err)
		}
		slices.Sort(want)
		var got []string
		for _, tag := range list {
			got = append(got, tag.Name)
			if tag.Step != 3 || (tag.Name == "t05") != (tag.MaxID == 4) {
				t.Errorf("Tags holds %+v", tag)
			}
		}
		if !slices.Equal(got, want) {
			t.Fatalf("Tags names = %v, want %v", got, want)
		}
	})

	// Every row Leaf serves is a tag: dotted, colon, space, Chinese, and names holding the
	// escape characters of the tag encodings, each its own row under its own name.
	t.Run("Tags/LeafNames", func(t *testing.T) {
		s := open(t)
		names := []string{"com.acme.order", "order:create", "order create", "订单", "%41", "=41", "A", strings.Repeat("订", 128)}
		for i, name := range names {
			mustAdd(t, s, Tag{Name: name, Step: 10, MaxID: int64(1 + 1000*i)})
		}
		for i, name := range names {
			got, err := s.Take(ctx(t), name, 0)
			if err != nil || got.Name != name || got.MaxID != int64(11+1000*i) {
				t.Fatalf("Take(%q) = %+v, %v; want max_id %d", name, got, err, 11+1000*i)
			}
		}
		list, err := s.Tags(ctx(t))
		if err != nil {
			t.Fatalf("Tags: %v", err)
		}
		var got []string
		for _, tag := range list {
			got = append(got, tag.Name)
		}
		want := slices.Sorted(slices.Values(names))
		if !slices.Equal(got, want) {
			t.Fatalf("Tags names = %q, want %q", got, want)
		}
	})

	t.Run("Tag/ErrTagNotFound", func(t *testing.T) {
		s := open(t)
		mustAdd(t, s, Tag{Name: "a", Step: 10})
		if _, err := s.Tag(ctx(t), "b"); !errors.Is(err, ErrTagNotFound) {
			t.Fatalf("Tag(missing) err = %v, want ErrTagNotFound", err)
		}
	})
}

// sameTag compares tags field by field, times with Equal.
func sameTag(a, b Tag) bool {
	return a.Name == b.Name && a.MaxID == b.MaxID && a.Step == b.Step &&
		a.Description == b.Description && a.UpdateTime.Equal(b.UpdateTime)
}

func TestInmemStore(t *testing.T) {
	testStore(t, func(t *testing.T) Store { return NewInmemStore() })
}
