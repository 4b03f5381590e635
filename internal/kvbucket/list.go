package kvbucket

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/leafbus/leafbus/wire"
)

// A KV watcher sends its "initial values done" marker (a nil entry) when the pending
// count of its consumer says nothing is left, and that count can be stale on a busy
// server (TESTENV-NOTES.md): the marker can come before every key was delivered. A
// listing that decides whether a dispenser starts, or which tags it serves, cannot end
// there. So a listing first asks the bucket's stream which keys it holds (the server's
// own count, per subject), reads the watcher up to its marker, and then reads each key
// the watcher has not delivered yet, one by one. Keys written while the listing runs may
// or may not be in it; every key that existed before it began is.
//
// The marker can also never come: the watcher counts the messages pending when its
// consumer was created, and in a bucket with a TTL (the worker ID leases) a message that
// expires before it is delivered is never delivered, so the count is never reached and
// no later message says nothing is pending until someone writes. The reading of the
// watcher therefore also ends once every key the stream named was delivered, or once
// it has delivered nothing for initialQuiet: the one-by-one reads cover the rest, and
// read an expired key as gone.

// Streams finds a bucket's stream (jetstream.JetStream does).
type Streams interface {
	Stream(ctx context.Context, name string) (jetstream.Stream, error)
}

// Keys returns the keys for which kv's stream holds a message now: a value, or the
// marker of a delete or purge. It is the server's account of the bucket, against which
// a watch is checked.
func Keys(ctx context.Context, js Streams, kv jetstream.KeyValue) (map[string]struct{}, error) {
	prefix := wire.KVSubjects(kv.Bucket())
	stream, err := js.Stream(ctx, wire.KVStream(kv.Bucket()))
	if err != nil {
		return nil, fmt.Errorf("KV bucket %s: its stream: %w", kv.Bucket(), err)
	}
	info, err := stream.Info(ctx, jetstream.WithSubjectFilter(prefix+">"))
	if err != nil {
		return nil, fmt.Errorf("KV bucket %s: list its keys: %w", kv.Bucket(), err)
	}
	keys := make(map[string]struct{}, len(info.State.Subjects))
	for subject := range info.State.Subjects {
		if key, ok := strings.CutPrefix(subject, prefix); ok {
			keys[key] = struct{}{}
		}
	}
	return keys, nil
}

// List returns the current value of every key of kv, by key: deleted and purged keys
// are left out. It is complete (see above): a watcher whose marker comes early costs a
// read per key it left out, never a missing key.
func List(ctx context.Context, js Streams, kv jetstream.KeyValue) (map[string]jetstream.KeyValueEntry, error) {
	want, err := Keys(ctx, js, kv)
	if err != nil {
		return nil, err
	}
	seen := make(map[string]jetstream.KeyValueEntry, len(want))
	if len(want) > 0 {
		if err := readInitial(ctx, kv, want, seen, initialQuiet); err != nil {
			return nil, err
		}
	}
	missing, err := FillIn(ctx, kv, want, func(key string) bool { _, ok := seen[key]; return ok })
	if err != nil {
		return nil, err
	}
	for _, e := range missing {
		seen[e.Key()] = e
	}
	for key, e := range seen {
		if e.Operation() != jetstream.KeyValuePut {
			delete(seen, key)
		}
	}
	return seen, nil
}

// initialQuiet is how long a listing's watch may deliver nothing before the listing
// reads the keys it has not delivered one by one (see above).
const initialQuiet = time.Second

// readInitial reads a watch of every key into seen, keeping each key's highest revision
// (a key written meanwhile can come twice), up to its marker, until every key of want
// was delivered, or until it is quiet for quiet.
func readInitial(ctx context.Context, kv jetstream.KeyValue, want map[string]struct{}, seen map[string]jetstream.KeyValueEntry, quiet time.Duration) error {
	w, err := kv.WatchAll(ctx)
	if err != nil {
		return fmt.Errorf("KV bucket %s: watch: %w", kv.Bucket(), err)
	}
	defer StopWatcher(w)
	silence := time.NewTimer(quiet)
	defer silence.Stop()
	left := len(want) // keys of want not delivered yet
	for {
		select {
		case e, ok := <-w.Updates():
			if !ok {
				return fmt.Errorf("KV bucket %s: the watch ended before its initial values", kv.Bucket())
			}
			if e == nil {
				return nil
			}
			old, ok := seen[e.Key()]
			if !ok || e.Revision() > old.Revision() {
				seen[e.Key()] = e
			}
			if _, wanted := want[e.Key()]; wanted && !ok {
				if left--; left == 0 {
					return nil
				}
			}
			silence.Reset(quiet)
		case <-silence.C:
			return nil
		case <-ctx.Done():
			return fmt.Errorf("KV bucket %s: watch: %w", kv.Bucket(), ctx.Err())
		}
	}
}

// FillIn reads, one by one, each key of want for which delivered is false: what a
// watcher whose marker came early has not delivered yet. A key deleted, purged or
// expired since want was read is left out. The entries come in no particular order.
func FillIn(ctx context.Context, kv jetstream.KeyValue, want map[string]struct{}, delivered func(key string) bool) ([]jetstream.KeyValueEntry, error) {
	var out []jetstream.KeyValueEntry
	for key := range want {
		if delivered(key) {
			continue
		}
		e, err := kv.Get(ctx, key)
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted):
			continue
		case err != nil:
			return nil, fmt.Errorf("KV bucket %s: read key %q: %w", kv.Bucket(), key, err)
		}
		out = append(out, e)
	}
	return out, nil
}

// stopDrain bounds StopWatcher's drain: a watcher whose connection is gone may never
// close its channel.
const stopDrain = 5 * time.Second

// StopWatcher stops w and drains its channel until it closes (or stopDrain passes): the
// watcher's delivery callback blocks on a full channel while holding the lock that
// closing needs.
func StopWatcher(w jetstream.KeyWatcher) {
	_ = w.Stop() // a connection already closed stops it too
	timeout := time.NewTimer(stopDrain)
	defer timeout.Stop()
	for {
		select {
		case _, ok := <-w.Updates():
			if !ok {
				return
			}
		case <-timeout.C:
			return
		}
	}
}
