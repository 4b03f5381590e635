package workerid

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/leafbus/leafbus/internal/kvbucket"
	"github.com/leafbus/leafbus/wire"
	"github.com/nats-io/nats.go/jetstream"
)

// ErrNoRecord is returned when a node (or worker ID) has no record yet: a first start.
var ErrNoRecord = errors.New("no record")

// Record is what a node reports every heartbeat, in the forever bucket (PROTOCOL.md) and
// in the cache file: its worker ID and the highest timestamp (Unix ms) it may have
// issued.
//
// Ceiling, when set, is the most the node's generator was allowed to issue on the
// strength of this record (Timestamp + heartbeat interval + that run's borrow-max +
// HeartbeatConfig.CeilingLead; a worker record keeps the highest ever written), so a
// restart with a smaller --borrow-max still waits past everything the previous run may
// have issued. NodeID names the writer in a worker ID's record (key WorkerKey(id)).
//
// Instance and Released make a worker ID's record its fence (fence.go): Instance is the
// run of the dispenser that holds the worker ID (a token per run, since two hosts can be
// given one node ID), and Released says that run stopped cleanly (or lost the ID) and
// issues nothing more with it, so the next holder need not wait to see it is gone.
//
// Every field but the first two is left out of the JSON when empty, so a node's record
// (key: its node ID) keeps PROTOCOL.md's bytes.
type Record = wire.ClockRecord

// WorkerKey is the forever bucket's key of worker ID id's record ("worker-3",
// wire.WorkerKey).
func WorkerKey(id int64) string { return wire.WorkerKey(id) }

// ForeverBucket is the name of the forever bucket for a subject prefix ("leaf_forever").
func ForeverBucket(prefix string) string {
	return wire.Subjects{Prefix: prefix}.Bucket(wire.BucketForever)
}

// Forever is the <prefix>_forever KV bucket: one key per node ID holding that node's last
// Record (Leaf's leaf_forever ZooKeeper node). It is safe for concurrent use.
type Forever struct {
	kv jetstream.KeyValue
}

// OpenForever creates the bucket (or binds to it when it exists) with replicas replicas,
// 1 to 5. It keeps no history: only the latest record matters.
func OpenForever(ctx context.Context, js jetstream.JetStream, bucket string, replicas int) (*Forever, error) {
	if bucket == "" {
		return nil, invalid("forever bucket", "bucket name is empty, want e.g. %q", ForeverBucket(wire.DefaultPrefix))
	}
	if err := checkReplicas("forever bucket "+bucket, replicas); err != nil {
		return nil, err
	}
	kv, err := kvbucket.Open(ctx, js, jetstream.KeyValueConfig{
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

// GetWorker returns worker ID id's record (key WorkerKey(id)), or an error wrapping
// ErrNoRecord when it has none.
func (f *Forever) GetWorker(ctx context.Context, id int64) (Record, error) {
	r, _, err := f.getRev(ctx, WorkerKey(id))
	return r, err
}

// RaiseWorker raises worker ID id's record to r: it keeps the higher timestamp and the
// higher ceiling of r and the stored record, so a holder that lost the ID and writes
// late cannot lower what the next holder wrote. One exception: the same node's newer
// record replaces its own older one outright, so that a clean stop's record (nothing
// issued past its timestamp: its ceiling is its timestamp) lowers the ceiling of the
// beats before it. Compare-and-set, retried.
func (f *Forever) RaiseWorker(ctx context.Context, id int64, r Record) error {
	key := WorkerKey(id)
	b, err := json.Marshal(r)
	if err != nil {
		return fmt.Errorf("encode forever record: %w", err)
	}
	for attempt := 0; attempt < casAttempts; attempt++ {
		prev, rev, err := f.getRev(ctx, key)
		switch {
		case errors.Is(err, ErrNoRecord):
			_, err = f.kv.Create(ctx, key, b)
		case err != nil:
			return err
		case r.NodeID != "" && r.NodeID == prev.NodeID && r.Timestamp >= prev.Timestamp:
			_, err = f.kv.Update(ctx, key, b, rev)
		case prev.Timestamp >= r.Timestamp && prev.Ceiling >= r.Ceiling:
			return nil
		default:
			if prev.Timestamp > r.Timestamp || prev.Ceiling > r.Ceiling {
				// Keep the higher of each: the record only ever goes up.
				merged := Record{WorkerID: id, Timestamp: max(prev.Timestamp, r.Timestamp), Ceiling: max(prev.Ceiling, r.Ceiling), NodeID: r.NodeID}
				if b, err = json.Marshal(merged); err != nil {
					return fmt.Errorf("encode forever record: %w", err)
				}
			}
			_, err = f.kv.Update(ctx, key, b, rev)
		}
		if errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			continue
		}
		if err != nil {
			return fmt.Errorf("write forever record %s to %s: %w", key, f.kv.Bucket(), err)
		}
		return nil
	}
	return fmt.Errorf("write forever record %s to %s: it kept changing", key, f.kv.Bucket())
}

// getRev reads key's record and its revision.
func (f *Forever) getRev(ctx context.Context, key string) (Record, uint64, error) {
	e, err := f.kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return Record{}, 0, fmt.Errorf("forever record %s in %s: %w", key, f.kv.Bucket(), ErrNoRecord)
	}
	if err != nil {
		return Record{}, 0, fmt.Errorf("read forever record %s from %s: %w", key, f.kv.Bucket(), err)
	}
	var r Record
	if err := json.Unmarshal(e.Value(), &r); err != nil {
		return Record{}, 0, fmt.Errorf("forever record %s in %s is not a record (%q): %w", key, f.kv.Bucket(), e.Value(), err)
	}
	return r, e.Revision(), nil
}

// Bucket is the bucket's name.
func (f *Forever) Bucket() string { return f.kv.Bucket() }

// workerEntry is a worker ID's record as read, with what the fence needs: its revision
// (0: there is none) and the time the server stored it, by the server's clock.
// Unreadable is set (and rec left zero) when the value is not a record: no dispenser
// wrote it, and it names no holder.
type workerEntry struct {
	rec        Record
	rev        uint64
	written    time.Time
	unreadable bool
}

// getWorkerEntry reads worker ID id's record with its revision and write time; a missing
// record is an entry of revision 0, and a value that is not a record an unreadable
// entry, not an error.
func (f *Forever) getWorkerEntry(ctx context.Context, id int64) (workerEntry, error) {
	key := WorkerKey(id)
	e, err := f.kv.Get(ctx, key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return workerEntry{}, nil
	}
	if err != nil {
		return workerEntry{}, fmt.Errorf("read forever record %s from %s: %w", key, f.kv.Bucket(), err)
	}
	var r Record
	if err := json.Unmarshal(e.Value(), &r); err != nil {
		return workerEntry{rev: e.Revision(), written: e.Created(), unreadable: true}, nil
	}
	return workerEntry{rec: r, rev: e.Revision(), written: e.Created()}, nil
}

// nodeRecord is a node's record (key: its node ID) as read by nodeRecordsOf.
type nodeRecord struct {
	nodeID string
	rec    Record
}

// nodeRecordsOf returns the records of the nodes, other than skip, that last named
// worker ID id: every holder writes its node's record, with the ceiling its generator
// was allowed, just before the worker ID's own record (Heartbeat), so they keep each
// holder's ceiling however the worker record is rewritten after it. Keys that hold no
// record are passed over.
func (f *Forever) nodeRecordsOf(ctx context.Context, id int64, skip string) ([]nodeRecord, error) {
	w, err := f.kv.WatchAll(ctx, jetstream.IgnoreDeletes())
	if err != nil {
		return nil, fmt.Errorf("read the node records of %s: %w", f.kv.Bucket(), err)
	}
	defer func() { _ = w.Stop() }()
	var out []nodeRecord
	for {
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("read the node records of %s: %w", f.kv.Bucket(), ctx.Err())
		case e, ok := <-w.Updates():
			if !ok {
				return nil, fmt.Errorf("read the node records of %s: the watch ended", f.kv.Bucket())
			}
			if e == nil { // every current value delivered
				return out, nil
			}
			key := e.Key()
			if key == skip || key == WorkerKey(id) { // the worker record is read on its own
				continue
			}
			var r Record
			if json.Unmarshal(e.Value(), &r) != nil || r.WorkerID != id {
				continue
			}
			out = append(out, nodeRecord{nodeID: key, rec: r})
		}
	}
}

// errRecordMoved is casWorker's error when the record is no longer at the revision the
// writer expected: someone wrote it (or deleted it) since.
var errRecordMoved = errors.New("the worker record changed since this holder's last write")

// casWorker writes r as worker ID id's record if the record is still at revision rev
// (0: absent), and returns the new revision. It fails with errRecordMoved when it is not.
func (f *Forever) casWorker(ctx context.Context, id int64, r Record, rev uint64) (uint64, error) {
	key := WorkerKey(id)
	b, err := json.Marshal(r)
	if err != nil {
		return 0, fmt.Errorf("encode forever record: %w", err)
	}
	var next uint64
	if rev == 0 {
		next, err = f.kv.Create(ctx, key, b)
	} else {
		next, err = f.kv.Update(ctx, key, b, rev)
	}
	if errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		return 0, fmt.Errorf("write forever record %s to %s at revision %d: %w", key, f.kv.Bucket(), rev, errRecordMoved)
	}
	if err != nil {
		return 0, fmt.Errorf("write forever record %s to %s: %w", key, f.kv.Bucket(), err)
	}
	return next, nil
}

// serverTime is the time by the clock of the server that keeps the bucket (the stream
// leader answers its info), the clock its records' write times were read from; zero
// when the server does not say.
func (f *Forever) serverTime(ctx context.Context) (time.Time, error) {
	st, err := f.kv.Status(ctx)
	if err != nil {
		return time.Time{}, fmt.Errorf("read the status of %s: %w", f.kv.Bucket(), err)
	}
	if bs, ok := st.(*jetstream.KeyValueBucketStatus); ok && bs.StreamInfo() != nil {
		return bs.StreamInfo().TimeStamp, nil
	}
	return time.Time{}, nil
}
