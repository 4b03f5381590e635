package kvbucket

import (
	"context"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// The watcher of a bucket with a TTL can deliver fewer messages than it counted when its
// consumer was created (one expired meanwhile) and then never send its marker: a real
// server does it only by timing (workerid's TestKVRegistryAbandonedLeaseExpires hung
// for its whole minute once), so a watcher that behaves so stands in for it here.
func TestReadInitialWithoutMarker(t *testing.T) {
	for _, tt := range []struct {
		name      string
		want      []string
		delivered []string
		atOnce    bool // ends without the quiet
	}{
		{"every wanted key delivered", []string{"a", "b"}, []string{"a", "b"}, true},
		{"a wanted key expired", []string{"a", "b"}, []string{"a"}, false},
		{"a key written meanwhile, one wanted expired", []string{"a", "b"}, []string{"a", "c"}, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			updates := make(chan jetstream.KeyValueEntry, len(tt.delivered))
			for i, key := range tt.delivered {
				updates <- entry{key: key, rev: uint64(i + 1)}
			}
			kv := &silentKV{w: &silentWatcher{updates: updates}}
			want := map[string]struct{}{}
			for _, key := range tt.want {
				want[key] = struct{}{}
			}
			seen := map[string]jetstream.KeyValueEntry{}
			// A listing that must end at once is given a quiet longer than its context:
			// waiting for the quiet fails it.
			quiet := time.Millisecond
			if tt.atOnce {
				quiet = time.Hour
			}
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			if err := readInitial(ctx, kv, want, seen, quiet); err != nil {
				t.Fatalf("readInitial = %v, want it to end without the marker", err)
			}
			for _, key := range tt.delivered {
				if _, ok := seen[key]; !ok {
					t.Errorf("key %s delivered but not in the listing", key)
				}
			}
		})
	}
}

// silentKV is a bucket whose watch is w; nothing else of it is used.
type silentKV struct {
	jetstream.KeyValue
	w *silentWatcher
}

func (kv *silentKV) Bucket() string { return "leases" }

func (kv *silentKV) WatchAll(context.Context, ...jetstream.WatchOpt) (jetstream.KeyWatcher, error) {
	return kv.w, nil
}

// silentWatcher delivers what its channel holds and never its marker.
type silentWatcher struct {
	updates chan jetstream.KeyValueEntry
}

func (w *silentWatcher) Updates() <-chan jetstream.KeyValueEntry { return w.updates }
func (w *silentWatcher) Stop() error                             { close(w.updates); return nil }

type entry struct {
	jetstream.KeyValueEntry
	key string
	rev uint64
}

func (e entry) Key() string                     { return e.key }
func (e entry) Revision() uint64                { return e.rev }
func (e entry) Operation() jetstream.KeyValueOp { return jetstream.KeyValuePut }
