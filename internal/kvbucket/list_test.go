package kvbucket_test

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/leafbus/leafbus/internal/kvbucket"
	"github.com/leafbus/leafbus/testenv"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// earlyMarkerKV is a real bucket whose watchers send their "initial values done" marker
// after the first `after` entries, as a nats.go watcher does on a busy server when its
// consumer's pending count is stale; the entries it held back still come, later.
type earlyMarkerKV struct {
	jetstream.KeyValue
	after int
}

func (kv earlyMarkerKV) WatchAll(ctx context.Context, opts ...jetstream.WatchOpt) (jetstream.KeyWatcher, error) {
	w, err := kv.KeyValue.WatchAll(ctx, opts...)
	if err != nil {
		return nil, err
	}
	ew := &earlyWatcher{KeyWatcher: w, out: make(chan jetstream.KeyValueEntry, 64)}
	go ew.relay(kv.after) // ends when w's channel closes (Stop)
	return ew, nil
}

type earlyWatcher struct {
	jetstream.KeyWatcher
	out chan jetstream.KeyValueEntry
}

func (w *earlyWatcher) Updates() <-chan jetstream.KeyValueEntry { return w.out }

func (w *earlyWatcher) relay(after int) {
	defer close(w.out)
	n := 0
	for e := range w.KeyWatcher.Updates() {
		if e == nil {
			continue // the real marker: this watcher already sent its own
		}
		w.out <- e
		if n++; n == after {
			w.out <- nil
		}
	}
}

func openBucket(t *testing.T, history uint8) (jetstream.JetStream, jetstream.KeyValue) {
	t.Helper()
	srv := testenv.StartNATS(t)
	js, err := jetstream.New(srv.Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	kv, err := kvbucket.Open(ctx, js, jetstream.KeyValueConfig{Bucket: "list_test", History: history})
	if err != nil {
		t.Fatal(err)
	}
	return js, kv
}

// fillBucket writes n keys, rewrites every third once more and deletes every fifth;
// it returns the keys that hold a value with that value.
func fillBucket(t *testing.T, kv jetstream.KeyValue, n int) map[string]string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	want := map[string]string{}
	for i := range n {
		key, val := fmt.Sprintf("k%04d", i), fmt.Sprintf("v%d", i)
		if _, err := kv.PutString(ctx, key, val); err != nil {
			t.Fatal(err)
		}
		want[key] = val
		if i%3 == 0 {
			val += "-again"
			if _, err := kv.PutString(ctx, key, val); err != nil {
				t.Fatal(err)
			}
			want[key] = val
		}
		if i%5 == 0 {
			if err := kv.Delete(ctx, key); err != nil {
				t.Fatal(err)
			}
			delete(want, key)
		}
	}
	return want
}

func values(entries map[string]jetstream.KeyValueEntry) map[string]string {
	out := make(map[string]string, len(entries))
	for k, e := range entries {
		out[k] = string(e.Value())
	}
	return out
}

func TestListComplete(t *testing.T) {
	js, kv := openBucket(t, 3)
	want := fillBucket(t, kv, 500)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for _, tc := range []struct {
		name string
		kv   jetstream.KeyValue
	}{
		{"OK", kv},
		{"MarkerAfterFirstEntry", earlyMarkerKV{kv, 1}},
		{"MarkerAfterTenEntries", earlyMarkerKV{kv, 10}},
		{"MarkerBeforeLastEntry", earlyMarkerKV{kv, 399}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := kvbucket.List(ctx, js, tc.kv)
			if err != nil {
				t.Fatalf("List: %v", err)
			}
			if g := values(got); !maps.Equal(g, want) {
				missing := []string{}
				for k := range want {
					if _, ok := g[k]; !ok {
						missing = append(missing, k)
					}
				}
				slices.Sort(missing)
				t.Fatalf("List: %d keys, want %d; missing %v (or values differ)", len(g), len(want), missing[:min(len(missing), 10)])
			}
		})
	}
}

func TestListEmptyBucket(t *testing.T) {
	js, kv := openBucket(t, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	got, err := kvbucket.List(ctx, js, kv)
	if err != nil || len(got) != 0 {
		t.Fatalf("List(empty) = %v, %v; want no entries", got, err)
	}
}

// TestListWhileWriting lists a bucket while other keys are written and the listed ones
// rewritten: every key that existed before the listing began is in it, at a value it
// had.
func TestListWhileWriting(t *testing.T) {
	js, kv := openBucket(t, 1)
	const before = 300
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	for i := range before {
		if _, err := kv.PutString(ctx, fmt.Sprintf("old%04d", i), "0"); err != nil {
			t.Fatal(err)
		}
	}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			_, _ = kv.PutString(ctx, fmt.Sprintf("new%06d", i), "x")
			_, _ = kv.PutString(ctx, fmt.Sprintf("old%04d", i%before), "1")
		}
	}()
	defer func() { close(stop); wg.Wait() }()
	for round := range 5 {
		got, err := kvbucket.List(ctx, js, earlyMarkerKV{kv, 7 + round*50})
		if err != nil {
			t.Fatalf("List: %v", err)
		}
		for i := range before {
			key := fmt.Sprintf("old%04d", i)
			e, ok := got[key]
			if !ok {
				t.Fatalf("round %d: List left out %s, which existed before it began", round, key)
			}
			if v := string(e.Value()); v != "0" && v != "1" {
				t.Fatalf("round %d: %s = %q, a value it never had", round, key, v)
			}
		}
	}
}

// TestListBucketGone: a listing of a deleted bucket fails, saying so, rather than
// returning nothing (which would read as "no tags").
func TestListBucketGone(t *testing.T) {
	js, kv := openBucket(t, 1)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := kv.PutString(ctx, "a", "1"); err != nil {
		t.Fatal(err)
	}
	if err := js.DeleteKeyValue(ctx, kv.Bucket()); err != nil {
		t.Fatal(err)
	}
	if got, err := kvbucket.List(ctx, js, kv); err == nil {
		t.Fatalf("List(deleted bucket) = %v, nil; want an error", got)
	}
}
