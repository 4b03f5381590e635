package workerid

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/nats-io/nats.go/jetstream"
)

// ErrNoRecord is returned when a node (or worker ID) has no record yet: a first start.
var ErrNoRecord = errors.New("no record")

// Record is what a node reports every heartbeat, in the forever bucket (PROTOCOL.md) and
// in the cache file: its worker ID and the highest timestamp (Unix ms) it may have
// issued.
type Record struct {
	WorkerID  int64 `json:"worker_id"`
	Timestamp int64 `json:"timestamp"`
}

// ForeverBucket is the name of the forever bucket for a subject prefix ("leaf_forever").
func ForeverBucket(prefix string) string { return prefix + "_forever" }

// Forever is the <prefix>_forever KV bucket: one key per node ID holding that node's last
// Record (Leaf's leaf_forever ZooKeeper node). It is safe for concurrent use.
type Forever struct {
	kv jetstream.KeyValue
}

// OpenForever creates the bucket (or binds to it when it exists) with replicas replicas,
// 1 to 5. It keeps no history: only the latest record matters.
func OpenForever(ctx context.Context, js jetstream.JetStream, bucket string, replicas int) (*Forever, error) {
	if bucket == "" {
		return nil, invalid("forever bucket", "bucket name is empty, want e.g. %q", ForeverBucket(DefaultPrefix))
	}
	if err := checkReplicas("forever bucket "+bucket, replicas); err != nil {
		return nil, err
	}
	kv, err := openBucket(ctx, js, jetstream.KeyValueConfig{
		Bucket:      bucket,
		Description: "leafbus: each dispenser's highest issued timestamp, by node ID",
		Replicas:    replicas,
	})
	if err != nil {
		return nil, err
	}
	return &Forever{kv: kv}, nil
}

// Get returns nodeID's record, or an error wrapping ErrNoRecord when it has none. Any
// other error means the bucket could not be read (the caller falls back to the cache
// file).
func (f *Forever) Get(ctx context.Context, nodeID string) (Record, error) {
	e, err := f.kv.Get(ctx, nodeID)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return Record{}, fmt.Errorf("forever record of node %s in %s: %w", nodeID, f.kv.Bucket(), ErrNoRecord)
	}
	if err != nil {
		return Record{}, fmt.Errorf("read forever record of node %s from %s: %w", nodeID, f.kv.Bucket(), err)
	}
	var r Record
	if err := json.Unmarshal(e.Value(), &r); err != nil {
		return Record{}, fmt.Errorf("forever record of node %s in %s is not a record (%q): %w", nodeID, f.kv.Bucket(), e.Value(), err)
	}
	return r, nil
}

// Put replaces nodeID's record. Only the node itself writes its key, and its heartbeat
// never lowers the timestamp, so a plain put is enough.
func (f *Forever) Put(ctx context.Context, nodeID string, r Record) error {
	b, err := json.Marshal(r)
	if err != nil {
		return fmt.Errorf("encode forever record: %w", err)
	}
	if _, err := f.kv.Put(ctx, nodeID, b); err != nil {
		return fmt.Errorf("write forever record of node %s to %s: %w", nodeID, f.kv.Bucket(), err)
	}
	return nil
}

// Bucket is the bucket's name.
func (f *Forever) Bucket() string { return f.kv.Bucket() }

// openBucket creates a KV bucket, or binds to it when another node created it first. A
// bucket that exists with a different configuration is used as it is; callers that
// depend on a setting (the lease TTL) check it themselves.
func openBucket(ctx context.Context, js jetstream.JetStream, cfg jetstream.KeyValueConfig) (jetstream.KeyValue, error) {
	kv, err := js.CreateKeyValue(ctx, cfg)
	if errors.Is(err, jetstream.ErrBucketExists) {
		kv, err = js.KeyValue(ctx, cfg.Bucket)
	}
	if err != nil {
		return nil, fmt.Errorf("open KV bucket %s: %w", cfg.Bucket, err)
	}
	return kv, nil
}
