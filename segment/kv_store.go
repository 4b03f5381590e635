package segment

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/leafbus/leafbus/internal/backoff"
	"github.com/leafbus/leafbus/internal/kvbucket"
	"github.com/leafbus/leafbus/wire"
)

// KVStore is a Store in a JetStream key-value bucket: the embedded default, needing
// nothing but NATS. Each tag is one key (the tag in the KV key encoding, wire.TagKey: a
// tag of A-Z a-z 0-9 _ - is its own key, "com.acme.order" is "com=2Eacme=2Eorder")
// whose value is the leaf_alloc row as JSON:
//
//	{"max_id":3001,"step":1000,"description":"order IDs","update_time":"2026-11-22T06:20:00Z"}
//
// Take reads the key and writes it back with a compare-and-set on the revision it read,
// retrying on a conflict, so any number of dispensers (KVStore values) may share a bucket:
// each write succeeds only over the revision its range was computed from, so no two
// writers can be granted the same range.
type KVStore struct {
	kv jetstream.KeyValue
	js kvbucket.Streams // finds the bucket's stream, against which Tags checks its listing
}

var (
	_ Store      = (*KVStore)(nil)
	_ Identifier = (*KVStore)(nil)
)

// kvRow is the JSON value of one key.
type kvRow = wire.SegmentRow

// Bounds of the compare-and-set loop. Contention only comes from dispensers loading a
// segment of the same tag at the same moment (each loads about once per
// SegmentDuration), so a few rounds settle it; the bound turns a pathological storm into
// an error the generator retries later instead of a goroutine spinning forever.
const (
	kvCASAttempts = 32
)

// kvCASPolicy is the wait between compare-and-set attempts: 2ms, doubling, at most
// 100ms, with full jitter, so that dispensers that collided once do not collide again
// in step.
var kvCASPolicy = backoff.Policy{Min: 2 * time.Millisecond, Max: 100 * time.Millisecond, Jitter: 1}

// OpenKVStore creates the bucket (file storage, replicas copies, history 1) or binds to it
// when it exists, whatever its settings (kvbucket.Open: a server that refuses for a
// moment, electing or still removing a deleted bucket's files, is asked again), and
// returns the store.
func OpenKVStore(ctx context.Context, js jetstream.JetStream, bucket string, replicas int) (*KVStore, error) {
	if replicas < 1 || replicas > 5 {
		return nil, fmt.Errorf("segment: open kv bucket %q: replicas %d must be between 1 and 5", bucket, replicas)
	}
	kv, err := kvbucket.Open(ctx, js, jetstream.KeyValueConfig{
		Bucket:      bucket,
		Description: "leafbus segment store: one key per biz tag (Leaf's leaf_alloc)",
		History:     1,
		Storage:     jetstream.FileStorage,
		Replicas:    replicas,
	})
	if err != nil {
		return nil, fmt.Errorf("segment: open kv bucket %q: %w", bucket, err)
	}
	return &KVStore{kv: kv, js: js}, nil
}

// Identity implements Identifier: the bucket.
func (s *KVStore) Identity() string { return "kv " + s.kv.Bucket() }

// Take implements Store.
func (s *KVStore) Take(ctx context.Context, tag string, step int64) (Tag, error) {
	if err := checkTake(tag, step); err != nil {
		return Tag{}, err
	}
	return s.cas(ctx, "take", tag, func(t Tag) (Tag, error) { return advance(t, step) })
}

// Tag implements Store.
func (s *KVStore) Tag(ctx context.Context, tag string) (Tag, error) {
	if err := CheckTagName(tag); err != nil {
		return Tag{}, err
	}
	t, _, err := s.get(ctx, tag)
	if err != nil {
		return Tag{}, fmt.Errorf("segment: kv tag: %w", err)
	}
	return t, nil
}

// Tags implements Store. It reads every key's latest value through one watcher (a single
// ordered consumer) instead of a Get per key, so listing 10,000 tags is one stream read,
// and checks what it got against the stream's own account of its keys
// (kvbucket.List): a tag the store holds is never missing from the list, which decides
// whether a dispenser starts and which tags it serves. Keys whose value is not a valid
// row are left out (see sortedTags).
func (s *KVStore) Tags(ctx context.Context) ([]Tag, error) {
	entries, err := kvbucket.List(ctx, s.js, s.kv)
	if err != nil {
		return nil, fmt.Errorf("segment: kv list tags: %w", err)
	}
	return sortedTags(entries), nil
}

// sortedTags decodes the entries, sorted by name. A value that does not decode (only a
// hand-written one can) is left out rather than failing the whole list: one bad key
// must not keep every dispenser from starting. Take and Tag on that key still report
// the decode error, so requests for it fail loudly.
func sortedTags(entries map[string]jetstream.KeyValueEntry) []Tag {
	list := make([]Tag, 0, len(entries))
	for key, e := range entries {
		name, err := wire.ParseTagKey(key)
		if err != nil {
			continue // not written by a KVStore: no request can name it
		}
		if t, err := decodeRow(name, e.Value()); err == nil {
			list = append(list, t)
		}
	}
	slices.SortFunc(list, func(a, b Tag) int { return strings.Compare(a.Name, b.Name) })
	return list
}

// AddTag implements Store.
func (s *KVStore) AddTag(ctx context.Context, t Tag) (Tag, error) {
	if t.MaxID == 0 {
		t.MaxID = 1
	}
	if err := t.Validate(); err != nil {
		return Tag{}, err
	}
	t.UpdateTime = storeNow()
	value, err := encodeRow(t)
	if err != nil {
		return Tag{}, err
	}
	if _, err := s.kv.Create(ctx, wire.TagKey(t.Name), value); err != nil {
		if errors.Is(err, jetstream.ErrKeyExists) {
			return Tag{}, fmt.Errorf("segment: kv add %q: %w", t.Name, ErrTagExists)
		}
		return Tag{}, fmt.Errorf("segment: kv add %q: %w", t.Name, err)
	}
	return t, nil
}

// UpdateTag implements Store.
func (s *KVStore) UpdateTag(ctx context.Context, u TagUpdate) (Tag, error) {
	if err := u.Validate(); err != nil {
		return Tag{}, err
	}
	// The max_id check runs on the revision the compare-and-set writes over, so a
	// concurrent Take cannot slip in between the check and the write.
	return s.cas(ctx, "update", u.Name, u.apply)
}

// cas reads tag, applies change and writes the result over the revision it read,
// starting again when another writer got in between.
func (s *KVStore) cas(ctx context.Context, op, tag string, change func(Tag) (Tag, error)) (Tag, error) {
	bo := backoff.New(kvCASPolicy)
	for attempt := 1; ; attempt++ {
		t, rev, err := s.get(ctx, tag)
		if err != nil {
			return Tag{}, fmt.Errorf("segment: kv %s: %w", op, err)
		}
		if t, err = change(t); err != nil {
			return Tag{}, fmt.Errorf("segment: kv %s: %w", op, err)
		}
		t.UpdateTime = storeNow()
		value, err := encodeRow(t)
		if err != nil {
			return Tag{}, err
		}
		_, err = s.kv.Update(ctx, wire.TagKey(tag), value, rev)
		if err == nil {
			return t, nil
		}
		if !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			return Tag{}, fmt.Errorf("segment: kv %s %q: %w", op, tag, err)
		}
		if attempt == kvCASAttempts {
			return Tag{}, fmt.Errorf("segment: kv %s %q: %d writers in a row got in first: %w", op, tag, attempt, ErrUnavailable)
		}
		if !bo.Wait(ctx) {
			return Tag{}, fmt.Errorf("segment: kv %s %q: %w", op, tag, ctx.Err())
		}
	}
}

// get reads one key and its revision.
func (s *KVStore) get(ctx context.Context, tag string) (Tag, uint64, error) {
	e, err := s.kv.Get(ctx, wire.TagKey(tag))
	if err != nil {
		if errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted) {
			return Tag{}, 0, fmt.Errorf("tag %q: %w", tag, ErrTagNotFound)
		}
		return Tag{}, 0, fmt.Errorf("read tag %q: %w", tag, err)
	}
	t, err := decodeRow(tag, e.Value())
	return t, e.Revision(), err
}

func encodeRow(t Tag) ([]byte, error) {
	b, err := json.Marshal(kvRow{
		MaxID:       t.MaxID,
		Step:        t.Step,
		Description: t.Description,
		UpdateTime:  t.UpdateTime.UTC().Format(time.RFC3339),
	})
	if err != nil {
		return nil, fmt.Errorf("segment: encode tag %q: %w", t.Name, err)
	}
	return b, nil
}

func decodeRow(name string, value []byte) (Tag, error) {
	var r kvRow
	if err := json.Unmarshal(value, &r); err != nil {
		return Tag{}, fmt.Errorf("tag %q: decode %q: %w", name, value, err)
	}
	t := Tag{Name: name, MaxID: r.MaxID, Step: r.Step, Description: r.Description}
	if r.UpdateTime != "" {
		ut, err := time.Parse(time.RFC3339, r.UpdateTime)
		if err != nil {
			return Tag{}, fmt.Errorf("tag %q: update_time: %w", name, err)
		}
		t.UpdateTime = ut.UTC()
	}
	return t, nil
}
