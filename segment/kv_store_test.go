package segment

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leafbus/leafbus/testenv"
	"github.com/nats-io/nats.go/jetstream"
)

// kvUnderTest is a KVStore that can open a peer: another KVStore, on its own connection,
// over the same bucket, as another dispenser would.
type kvUnderTest struct {
	*KVStore
	srv    *testenv.NATS
	bucket string
}

func (k *kvUnderTest) peer(t *testing.T) Store {
	return openKV(t, k.srv, k.bucket)
}

func openKV(tb testing.TB, srv *testenv.NATS, bucket string) *kvUnderTest {
	tb.Helper()
	js, err := jetstream.New(srv.Connect(tb))
	if err != nil {
		tb.Fatalf("jetstream.New: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s, err := OpenKVStore(ctx, js, bucket, 1)
	if err != nil {
		tb.Fatalf("OpenKVStore(%q): %v", bucket, err)
	}
	return &kvUnderTest{KVStore: s, srv: srv, bucket: bucket}
}

func TestKVStore(t *testing.T) {
	srv := testenv.StartNATS(t)
	var buckets atomic.Int64
	testStore(t, func(t *testing.T) Store {
		return openKV(t, srv, fmt.Sprintf("leaf_segments_%d", buckets.Add(1)))
	})
}

func TestOpenKVStore(t *testing.T) {
	srv := testenv.StartNATS(t)
	js, err := jetstream.New(srv.Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()

	t.Run("BadReplicas", func(t *testing.T) {
		for _, r := range []int{0, 6} {
			if _, err := OpenKVStore(ctx, js, "leaf_segments", r); err == nil {
				t.Errorf("OpenKVStore(replicas %d) succeeded, want an error", r)
			}
		}
	})
	t.Run("BindsExisting", func(t *testing.T) {
		first, err := OpenKVStore(ctx, js, "leaf_segments", 1)
		if err != nil {
			t.Fatalf("OpenKVStore: %v", err)
		}
		mustAdd(t, first, Tag{Name: "orders", Step: 10})
		if _, err := first.Take(ctx, "orders", 0); err != nil {
			t.Fatalf("Take: %v", err)
		}
		again, err := OpenKVStore(ctx, js, "leaf_segments", 1)
		if err != nil {
			t.Fatalf("OpenKVStore on an existing bucket: %v", err)
		}
		got, err := again.Tag(ctx, "orders")
		if err != nil || got.MaxID != 11 {
			t.Fatalf("Tag through the second store = %+v, %v; want max_id 11", got, err)
		}
	})
	t.Run("CorruptValue", func(t *testing.T) {
		s, err := OpenKVStore(ctx, js, "leaf_corrupt", 1)
		if err != nil {
			t.Fatalf("OpenKVStore: %v", err)
		}
		mustAdd(t, s, Tag{Name: "good", Step: 10})
		kv, err := js.KeyValue(ctx, "leaf_corrupt")
		if err != nil {
			t.Fatal(err)
		}
		for key, value := range map[string]string{"bad": "not json", "bad.key": `{"max_id":1,"step":1}`} {
			if _, err := kv.Put(ctx, key, []byte(value)); err != nil {
				t.Fatal(err)
			}
		}
		list, err := s.Tags(ctx)
		if err != nil || len(list) != 1 || list[0].Name != "good" {
			t.Fatalf("Tags = %+v, %v; want only the good tag", list, err)
		}
		if _, err := s.Take(ctx, "bad", 0); err == nil || errors.Is(err, ErrTagNotFound) {
			t.Fatalf("Take(corrupt) err = %v, want a decode error", err)
		}
	})
	t.Run("ValueFormat", func(t *testing.T) {
		s, err := OpenKVStore(ctx, js, "leaf_format", 1)
		if err != nil {
			t.Fatalf("OpenKVStore: %v", err)
		}
		mustAdd(t, s, Tag{Name: "orders", Step: 1000, MaxID: 3001, Description: "order IDs"})
		kv, err := js.KeyValue(ctx, "leaf_format")
		if err != nil {
			t.Fatal(err)
		}
		e, err := kv.Get(ctx, "orders")
		if err != nil {
			t.Fatal(err)
		}
		var row map[string]any
		if err := json.Unmarshal(e.Value(), &row); err != nil {
			t.Fatalf("value %s is not JSON: %v", e.Value(), err)
		}
		if row["max_id"] != float64(3001) || row["step"] != float64(1000) || row["description"] != "order IDs" {
			t.Fatalf("value = %s", e.Value())
		}
		if _, err := time.Parse(time.RFC3339, fmt.Sprint(row["update_time"])); err != nil {
			t.Fatalf("update_time in %s is not RFC 3339: %v", e.Value(), err)
		}
	})
}

// TestKVStoreDispensersContend has many stores (each its own connection) take from one
// tag at once: every range is granted once, and together they cover 1..max_id.
func TestKVStoreDispensersContend(t *testing.T) {
	srv := testenv.StartNATS(t)
	const stores, takes = 6, 30
	var all []*kvUnderTest
	for range stores {
		all = append(all, openKV(t, srv, "leaf_segments"))
	}
	mustAdd(t, all[0], Tag{Name: "hot", Step: 3})
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var mu sync.Mutex
	owner := make(map[int64]int) // ID -> store that was granted it
	var wg sync.WaitGroup
	for i, s := range all {
		wg.Go(func() {
			for range takes {
				got, err := s.Take(ctx, "hot", 0)
				if err != nil {
					t.Errorf("store %d Take: %v", i, err)
					return
				}
				mu.Lock()
				for id := got.MaxID - got.Step; id < got.MaxID; id++ {
					if prev, dup := owner[id]; dup {
						t.Errorf("ID %d granted to store %d and store %d", id, prev, i)
					}
					owner[id] = i
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if want := stores * takes * 3; len(owner) != want {
		t.Fatalf("%d IDs granted, want %d", len(owner), want)
	}
	for id := int64(1); id <= int64(len(owner)); id++ {
		if _, ok := owner[id]; !ok {
			t.Fatalf("ID %d never granted: the ranges leave a hole", id)
		}
	}
}

// TestKVGeneratorDispensersAndRestart runs two generators (two dispensers) over one KV
// bucket, restarts the NATS server under them and replaces one generator with a new one:
// no ID is ever seen twice.
func TestKVGeneratorDispensersAndRestart(t *testing.T) {
	srv := testenv.StartNATS(t)
	admin := openKV(t, srv, "leaf_segments")
	mustAdd(t, admin, Tag{Name: "orders", Step: 20}, Tag{Name: "users", Step: 7})

	seen := make(map[string]map[int64]bool)
	record := func(tag string, ids []int64) {
		t.Helper()
		if seen[tag] == nil {
			seen[tag] = make(map[int64]bool)
		}
		for i, id := range ids {
			if id < 1 || (i > 0 && id <= ids[i-1]) {
				t.Fatalf("%s batch %v is not positive and strictly increasing", tag, ids)
			}
			if seen[tag][id] {
				t.Fatalf("%s ID %d handed out twice", tag, id)
			}
			seen[tag][id] = true
		}
	}
	newGen := func() (*Generator, func()) {
		cfg := testConfig(t, openKV(t, srv, "leaf_segments"))
		cfg.MaxStep = 50
		cfg.WaitMax = 10 * time.Second
		return startGenerator(t, cfg)
	}
	a, stopA := newGen()
	b, _ := newGen()
	round := func() {
		for i := range 40 {
			for _, g := range []*Generator{a, b} {
				record("orders", fill(t, g, "orders", 1+i%9))
				record("users", fill(t, g, "users", 1+i%4))
			}
		}
	}
	round()
	srv.Restart()
	round()
	stopA()
	a, _ = newGen()
	round()
	if st := a.Stats(); st.Loads == 0 || st.Tags != 2 {
		t.Fatalf("new generator stats %+v: want loads and 2 tags", st)
	}
}

// TestKVStoreTakeCancelled: a cancelled context ends Take with the context's error.
func TestKVStoreTakeCancelled(t *testing.T) {
	srv := testenv.StartNATS(t)
	s := openKV(t, srv, "leaf_segments")
	mustAdd(t, s, Tag{Name: "a", Step: 1})
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := s.Take(ctx, "a", 0); !errors.Is(err, context.Canceled) {
		t.Fatalf("Take(cancelled) err = %v, want context.Canceled", err)
	}
}

// racingKV lets another writer update a key between a KVStore's read and its
// compare-and-set, the first `times` times.
type racingKV struct {
	jetstream.KeyValue
	rival Store
	times int
	raced int
}

func (r *racingKV) Update(ctx context.Context, key string, value []byte, revision uint64) (uint64, error) {
	if r.raced < r.times {
		r.raced++
		if _, err := r.rival.Take(ctx, key, 1000); err != nil {
			return 0, fmt.Errorf("rival Take: %w", err)
		}
	}
	return r.KeyValue.Update(ctx, key, value, revision)
}

// TestKVStoreTakeConflict: a Take that loses the compare-and-set reads again and takes
// the range after the winner's; one that keeps losing gives up with ErrUnavailable
// instead of spinning.
func TestKVStoreTakeConflict(t *testing.T) {
	srv := testenv.StartNATS(t)
	rival := openKV(t, srv, "leaf_segments")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, tc := range []struct {
		name    string
		races   int
		wantMax int64
		wantErr error
	}{
		{"OK", 3, 1 + 3*1000 + 10, nil},
		{"ErrUnavailable", kvCASAttempts, 0, ErrUnavailable},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mustAdd(t, rival, Tag{Name: tc.name, Step: 10})
			s := &KVStore{kv: &racingKV{KeyValue: rival.kv, rival: rival, times: tc.races}}
			got, err := s.Take(ctx, tc.name, 0)
			if !errors.Is(err, tc.wantErr) || (tc.wantErr == nil && err != nil) {
				t.Fatalf("Take = %+v, %v; want error %v", got, err, tc.wantErr)
			}
			if tc.wantErr == nil && got.MaxID != tc.wantMax {
				t.Fatalf("Take after %d lost races = max_id %d, want %d (the range after the rival's)", tc.races, got.MaxID, tc.wantMax)
			}
		})
	}
}

// TestKVStoreRaiseMaxIDConflict: a Take that lands between UpdateTag's read and its
// compare-and-set moves max_id past the requested value; the update reads again and
// refuses, rather than writing the lower max_id it checked against the old revision.
func TestKVStoreRaiseMaxIDConflict(t *testing.T) {
	srv := testenv.StartNATS(t)
	rival := openKV(t, srv, "leaf_segments")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	mustAdd(t, rival, Tag{Name: "a", Step: 10})
	s := &KVStore{kv: &racingKV{KeyValue: rival.kv, rival: rival, times: 1}}
	target := int64(500)
	if got, err := s.UpdateTag(ctx, TagUpdate{Name: "a", MaxID: &target}); !errors.Is(err, ErrInvalidTag) {
		t.Fatalf("UpdateTag(max_id 500) with a Take of 1000 in between = %+v, %v; want ErrInvalidTag", got, err)
	}
	if got, err := rival.Tag(ctx, "a"); err != nil || got.MaxID != 1001 {
		t.Fatalf("Tag = %+v, %v; want max_id 1001, the rival's", got, err)
	}
}

// TestKVStoreLostBucketMarks: the KV bucket is lost while a dispenser is down and comes
// back empty, then with the tag created again at 1 (as a start on an empty store would).
// The start-up check names the tag both times; a generator started anyway refuses it
// and serves the others; the KV store's UpdateTag raises max_id, and the tag is served
// again, from above every ID served before the loss.
func TestKVStoreLostBucketMarks(t *testing.T) {
	srv := testenv.StartNATS(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	path := filepath.Join(t.TempDir(), "segment.marks")
	store := openKV(t, srv, "leaf_segments")
	mustAdd(t, store, Tag{Name: "orders", Step: 10})
	var seen idSet
	first, stop := startMarked(t, marksConfig(t, store, mustOpenMarks(t, path)))
	for range 25 {
		seen.add(t, "orders", fill(t, first, "orders", 1))
	}
	stop()

	js, err := jetstream.New(srv.Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := js.DeleteKeyValue(ctx, "leaf_segments"); err != nil {
		t.Fatalf("DeleteKeyValue: %v", err)
	}
	store = openKV(t, srv, "leaf_segments") // created again, empty
	marks := mustOpenMarks(t, path)
	mark := marks.Mark("orders")
	if mark <= seen.max("orders") {
		t.Fatalf("mark %d does not cover the IDs served (up to %d)", mark, seen.max("orders"))
	}
	err = CheckStoreAgainstMarks(ctx, store, marks)
	if want := fmt.Sprintf("orders (mark %d)", mark); !errors.Is(err, ErrStoreWentBack) || !strings.Contains(err.Error(), want) {
		t.Fatalf("CheckStoreAgainstMarks(empty bucket) = %v, want ErrStoreWentBack naming %q", err, want)
	}
	mustAdd(t, store, Tag{Name: "orders", Step: 10}, Tag{Name: "fresh", Step: 5})
	err = CheckStoreAgainstMarks(ctx, store, marks)
	if want := fmt.Sprintf("orders (max_id 1, mark %d)", mark); !errors.Is(err, ErrStoreWentBack) || !strings.Contains(err.Error(), want) {
		t.Fatalf("CheckStoreAgainstMarks(orders at 1) = %v, want ErrStoreWentBack naming %q", err, want)
	}

	second, _ := startMarked(t, marksConfig(t, store, marks))
	fillUntilRefused(t, second, &seen, "orders", 1)
	seen.add(t, "fresh", fill(t, second, "fresh", 7))
	if _, err := store.UpdateTag(ctx, TagUpdate{Name: "orders", MaxID: &mark}); err != nil {
		t.Fatalf("UpdateTag(max_id %d): %v", mark, err)
	}
	dst := make([]int64, 5)
	waitFor(t, "orders to serve again", func() bool { return second.Fill(ctx, "orders", dst) == nil })
	seen.add(t, "orders", dst)
	if dst[0] != mark {
		t.Fatalf("first IDs after the repair = %v, want them to start at the mark %d", dst, mark)
	}
	if err := CheckStoreAgainstMarks(ctx, store, marks); err != nil {
		t.Fatalf("CheckStoreAgainstMarks after the repair = %v", err)
	}
}
