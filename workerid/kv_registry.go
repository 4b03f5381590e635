package workerid

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/leafbus/leafbus/internal/kvbucket"
	"github.com/leafbus/leafbus/wire"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// KV registry defaults.
const (
	DefaultMaxWorkerID = 1023 // 10 worker bits, Leaf's layout
	DefaultLeaseTTL    = 30 * time.Second
)

// casAttempts bounds the read-compare-write loops on the workers bucket. Only a holder
// and at most a few nodes racing for the same ID ever write one key, so a handful of
// attempts is plenty; running out means something is badly wrong.
const casAttempts = 16

// KVRegistryConfig configures a KVRegistry. Start from DefaultKVRegistryConfig.
type KVRegistryConfig struct {
	// Prefix names the buckets <Prefix>_leases and <Prefix>_workers ("leaf").
	Prefix string
	// NodeID is written into the lease so operators can see who holds an ID. Required.
	NodeID string
	// MinWorkerID and MaxWorkerID bound the IDs handed out (--worker-id-min,
	// --worker-id-max): 0 and the snowflake layout's MaxWorkerID() (1023) by default, a
	// range of its own for each datacenter (worker_range.go).
	MinWorkerID int64
	MaxWorkerID int64
	// TTL is how long an ID stays leased without a Renew (30 s). It is the bucket's TTL,
	// so every node of a deployment must use the same value (OpenKVRegistry checks).
	TTL time.Duration
	// RenewInterval is the heartbeat interval (3 s). TTL must be at least 4 of them: the
	// heartbeat suspends the generator after TTL/2 without a renewal, so TTL/2 must span
	// two failed beats.
	RenewInterval time.Duration
	// Replicas of both buckets, 1 to 5 (1).
	Replicas int
	// Logger; nil discards.
	Logger *slog.Logger
}

// DefaultKVRegistryConfig returns the defaults: prefix "leaf", worker IDs 0..1023,
// leases of 30 s renewed every 3 s, one replica. NodeID is left for the caller.
func DefaultKVRegistryConfig() KVRegistryConfig {
	return KVRegistryConfig{
		Prefix:        wire.DefaultPrefix,
		MaxWorkerID:   DefaultMaxWorkerID,
		TTL:           DefaultLeaseTTL,
		RenewInterval: wire.HeartbeatInterval,
		Replicas:      1,
	}
}

// Validate reports the first setting that is missing or out of range, naming the field,
// its value and the bound; errors wrap ErrInvalidConfig or ErrInvalidNodeID.
func (c KVRegistryConfig) Validate() error {
	const component = "KV registry"
	if c.Prefix == "" {
		return invalid(component, "Prefix is empty, want the prefix that names the buckets (%q by default)", wire.DefaultPrefix)
	}
	if err := CheckNodeID(c.NodeID); err != nil {
		return fmt.Errorf("%s: NodeID: %w", component, err)
	}
	if err := c.workerRange().check(component); err != nil {
		return err
	}
	if err := checkPositive(component, duration{"TTL", c.TTL}, duration{"RenewInterval", c.RenewInterval}); err != nil {
		return err
	}
	if err := CheckLeaseTTL(c.TTL, c.RenewInterval); err != nil {
		return invalid(component, "%v", err)
	}
	return checkReplicas(component, c.Replicas)
}

// workerRange is MinWorkerID..MaxWorkerID.
func (c KVRegistryConfig) workerRange() Range { return Range{Min: c.MinWorkerID, Max: c.MaxWorkerID} }

// KVRegistry leases worker IDs from JetStream KV, for deployments without ZooKeeper.
//
// Two buckets:
//   - <prefix>_leases: key = worker ID, value = the holder. The bucket's TTL is the lease
//     TTL, so every write resets a key's age and an abandoned key vanishes TTL after its
//     last renewal. (A per-key TTL would not do: kv.Update drops it, TESTENV-NOTES.md.)
//     Acquire is a create-only write, so two nodes never hold one ID.
//   - <prefix>_workers: durable, key = worker ID, value = the highest timestamp any holder
//     recorded and the token of the holder that wrote it last. A new holder starts past
//     that timestamp (Lease.Recorded), and a holder whose token has been replaced knows
//     someone else held the ID since (ErrLeaseLost).
//
// Each holder writes its timestamp to the workers bucket before it extends its lease, so
// any later holder reads a record at least as high as the base of the last ceiling the
// earlier holder was given.
//
// Each lease is a leaseWatcher (kv_watch.go): its holder watches its key and stops at
// once when anyone else deletes, purges or rewrites it.
type KVRegistry struct {
	cfg     KVRegistryConfig
	nc      *nats.Conn // the JetStream's: its state tells the lease watch what it missed
	js      jetstream.JetStream
	leases  jetstream.KeyValue
	workers jetstream.KeyValue
}

var (
	_ Registry   = (*KVRegistry)(nil)
	_ Identifier = (*KVRegistry)(nil)
)

// Identity is "kv <leases bucket>" ("kv leaf_leases"): the bucket that decides who holds
// which worker ID.
func (r *KVRegistry) Identity() string { return "kv " + r.leases.Bucket() }

// OpenKVRegistry validates cfg and opens (creating when missing) the two buckets. It fails
// with ErrInvalidConfig when the leases bucket exists with a different TTL.
func OpenKVRegistry(ctx context.Context, js jetstream.JetStream, cfg KVRegistryConfig) (*KVRegistry, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	leases, err := kvbucket.Open(ctx, js, jetstream.KeyValueConfig{
		Bucket:      wire.Subjects{Prefix: cfg.Prefix}.Bucket(wire.BucketLeases),
		Description: "leafbus: snowflake worker ID leases, by worker ID",
		TTL:         cfg.TTL,
		Replicas:    cfg.Replicas,
	})
	if err != nil {
		return nil, err
	}
	st, err := leases.Status(ctx)
	if err != nil {
		return nil, fmt.Errorf("read status of KV bucket %s: %w", leases.Bucket(), err)
	}
	if st.TTL() != cfg.TTL {
		return nil, fmt.Errorf("%w: KV bucket %s keeps leases for %s, but this node is configured with lease TTL %s: every node must use the same TTL",
			ErrInvalidConfig, leases.Bucket(), st.TTL(), cfg.TTL)
	}
	workers, err := kvbucket.Open(ctx, js, jetstream.KeyValueConfig{
		Bucket:      wire.Subjects{Prefix: cfg.Prefix}.Bucket(wire.BucketWorkers),
		Description: "leafbus: highest timestamp recorded per snowflake worker ID",
		Replicas:    cfg.Replicas,
	})
	if err != nil {
		return nil, err
	}
	return &KVRegistry{cfg: cfg, nc: js.Conn(), js: js, leases: leases, workers: workers}, nil
}

// leaseValue is the content of a lease key (wire.KVLease).
type leaseValue = wire.KVLease

// workerValue is the content of a workers key (wire.KVWorker).
type workerValue = wire.KVWorker

// Acquire leases the lowest free worker ID of the range. It lists the leased IDs and
// tries create-only writes on the free ones from the lowest up; losing a race moves on to
// the next. When every ID in range is leased it returns an error wrapping ErrNoWorkerID
// at once.
func (r *KVRegistry) Acquire(ctx context.Context) (Lease, error) {
	taken, err := r.leasedIDs(ctx)
	if err != nil {
		return nil, err
	}
	// The token tells this lease apart from any other holder of the same ID, including
	// an earlier run of this same node.
	token := rand.Text()
	val, err := json.Marshal(leaseValue{NodeID: r.cfg.NodeID, Token: token})
	if err != nil {
		return nil, fmt.Errorf("encode lease: %w", err)
	}
	for id := r.cfg.MinWorkerID; id <= r.cfg.MaxWorkerID; id++ {
		if taken[id] {
			continue
		}
		key := strconv.FormatInt(id, 10)
		rev, err := r.leases.Create(ctx, key, val)
		if errors.Is(err, jetstream.ErrKeyExists) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("lease worker ID %d in %s: %w", id, r.leases.Bucket(), err)
		}
		l := &kvLease{reg: r, id: id, key: key, token: token, leaseVal: val}
		l.setRev(rev)
		recorded, err := l.claimWorker(ctx)
		if err != nil {
			// Give the ID back at once rather than blocking it for a TTL; best effort.
			_ = r.leases.Delete(context.WithoutCancel(ctx), key, jetstream.LastRevision(rev))
			return nil, err
		}
		l.recorded = recorded
		r.cfg.Logger.Info("leased worker ID", "worker_id", id, "bucket", r.leases.Bucket(),
			"ttl", r.cfg.TTL, "recorded", recorded, "recorded_time", fmtMs(recorded))
		return l, nil
	}
	rng := r.cfg.workerRange()
	return nil, fmt.Errorf("%w: all %d of this deployment's %s are leased in %s", ErrNoWorkerID, rng.Len(), rng.describe(), r.leases.Bucket())
}

// leasedIDs lists the worker IDs that have a live lease, completely (kvbucket.List): a
// lease left out would only cost a failed create, but the listing is the same one
// everywhere.
func (r *KVRegistry) leasedIDs(ctx context.Context) (map[int64]bool, error) {
	leases, err := kvbucket.List(ctx, r.js, r.leases)
	if err != nil {
		return nil, fmt.Errorf("list leases in %s: %w", r.leases.Bucket(), err)
	}
	taken := make(map[int64]bool, len(leases))
	for k := range leases {
		if id, err := strconv.ParseInt(k, 10, 64); err == nil {
			taken[id] = true
		}
	}
	return taken, nil
}

// kvLease is one holder's lease on one worker ID.
type kvLease struct {
	reg      *KVRegistry
	id       int64
	key      string
	token    string
	leaseVal []byte
	recorded int64

	mu       sync.Mutex
	rev      uint64 // last revision of the lease key this holder wrote
	released bool

	// For the watch, which runs beside Renew (kv_watch.go).
	releasing atomic.Bool // Release is deleting the key: the watch will see it go
	wroteMu   sync.Mutex
	wroteRev  uint64    // = rev, readable without waiting for a Renew in progress
	wroteAt   time.Time // when wroteRev was written
}

var _ Lease = (*kvLease)(nil)

// setRev notes rev as this holder's last write of the lease key. l.mu is held.
func (l *kvLease) setRev(rev uint64) {
	l.rev = rev
	l.wroteMu.Lock()
	l.wroteRev, l.wroteAt = rev, time.Now()
	l.wroteMu.Unlock()
}

// lastWrite returns this holder's last write of the lease key and when it was made.
func (l *kvLease) lastWrite() (uint64, time.Time) {
	l.wroteMu.Lock()
	defer l.wroteMu.Unlock()
	return l.wroteRev, l.wroteAt
}

func (l *kvLease) WorkerID() int64    { return l.id }
func (l *kvLease) Recorded() int64    { return l.recorded }
func (l *kvLease) TTL() time.Duration { return l.reg.cfg.TTL }

// Renew records ts in the workers bucket, then extends the lease with a compare-and-set
// on its last revision. A lease key that expired while nobody else held the ID is
// created again: the workers record still carrying this holder's token proves nobody
// took the ID in between, and a create-only write fails if someone is taking it now.
func (l *kvLease) Renew(ctx context.Context, ts int64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.released {
		return fmt.Errorf("renew worker ID %d: lease already released", l.id)
	}
	if err := l.recordWorker(ctx, ts); err != nil {
		return err
	}
	return l.extend(ctx)
}

// Release records ts and deletes the lease key (only if it is still this holder's), so
// the ID is free at once instead of after a TTL.
func (l *kvLease) Release(ctx context.Context, ts int64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.released {
		return nil
	}
	if err := l.recordWorker(ctx, ts); err != nil {
		return err
	}
	l.releasing.Store(true) // the watch is to take the deletion for what it is
	defer func() { l.releasing.Store(l.released) }()
	for attempt := 0; attempt < casAttempts; attempt++ {
		err := l.reg.leases.Delete(ctx, l.key, jetstream.LastRevision(l.rev))
		if err == nil {
			l.released = true
			l.reg.cfg.Logger.Info("released worker ID", "worker_id", l.id, "recorded", ts, "recorded_time", fmtMs(ts))
			return nil
		}
		if !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			return fmt.Errorf("release worker ID %d: %w", l.id, err)
		}
		holder, rev, err := l.leaseHolder(ctx)
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
			l.released = true // expired meanwhile: nothing to give back
			return nil
		case err != nil:
			return fmt.Errorf("release worker ID %d: %w", l.id, err)
		case holder.Token != l.token:
			return fmt.Errorf("%w: release worker ID %d: now held by node %s", ErrLeaseLost, l.id, holder.NodeID)
		}
		l.setRev(rev) // an earlier write of ours succeeded although we saw an error
	}
	return fmt.Errorf("release worker ID %d: lease key kept changing", l.id)
}

// extend rewrites the lease key with a compare-and-set, re-creating it when it expired.
func (l *kvLease) extend(ctx context.Context) error {
	for attempt := 0; attempt < casAttempts; attempt++ {
		rev, err := l.reg.leases.Update(ctx, l.key, l.leaseVal, l.rev)
		if err == nil {
			l.setRev(rev)
			return nil
		}
		if !errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
			return fmt.Errorf("renew lease on worker ID %d: %w", l.id, err)
		}
		holder, rev, err := l.leaseHolder(ctx)
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound):
			rev, err := l.reg.leases.Create(ctx, l.key, l.leaseVal)
			if errors.Is(err, jetstream.ErrKeyExists) {
				return fmt.Errorf("%w: worker ID %d expired and another node is taking it", ErrLeaseLost, l.id)
			}
			if err != nil {
				return fmt.Errorf("re-create expired lease on worker ID %d: %w", l.id, err)
			}
			l.reg.cfg.Logger.Warn("worker ID lease had expired; re-created it (nobody held the ID in between)",
				"worker_id", l.id, "ttl", l.reg.cfg.TTL)
			l.setRev(rev)
			return nil
		case err != nil:
			return fmt.Errorf("renew lease on worker ID %d: %w", l.id, err)
		case holder.Token != l.token:
			return fmt.Errorf("%w: worker ID %d is now held by node %s", ErrLeaseLost, l.id, holder.NodeID)
		}
		// Our own earlier write went through although we saw an error: adopt it.
		l.setRev(rev)
	}
	return fmt.Errorf("renew lease on worker ID %d: lease key kept changing", l.id)
}

// leaseHolder reads the lease key; jetstream.ErrKeyNotFound when it expired or was
// released.
func (l *kvLease) leaseHolder(ctx context.Context) (leaseValue, uint64, error) {
	e, err := l.reg.leases.Get(ctx, l.key)
	if err != nil {
		return leaseValue{}, 0, err
	}
	var v leaseValue
	if err := json.Unmarshal(e.Value(), &v); err != nil {
		return leaseValue{}, 0, fmt.Errorf("lease on worker ID %d is not a lease (%q): %w", l.id, e.Value(), err)
	}
	return v, e.Revision(), nil
}

// claimWorker puts this holder's token on the worker record, keeping its timestamp, and
// returns that timestamp: the highest any previous holder recorded.
func (l *kvLease) claimWorker(ctx context.Context) (int64, error) {
	for attempt := 0; attempt < casAttempts; attempt++ {
		prev, rev, err := l.readWorker(ctx)
		if err != nil {
			return 0, err
		}
		next := workerValue{WorkerID: l.id, Timestamp: prev.Timestamp, NodeID: l.reg.cfg.NodeID, Token: l.token}
		ok, err := l.writeWorker(ctx, next, rev)
		if err != nil {
			return 0, err
		}
		if ok {
			return prev.Timestamp, nil
		}
	}
	return 0, fmt.Errorf("claim worker record %d in %s: it kept changing", l.id, l.reg.workers.Bucket())
}

// recordWorker raises the worker record to ts, failing with ErrLeaseLost when another
// holder's token is on it: that holder claimed the ID after our last write.
func (l *kvLease) recordWorker(ctx context.Context, ts int64) error {
	for attempt := 0; attempt < casAttempts; attempt++ {
		prev, rev, err := l.readWorker(ctx)
		if err != nil {
			return err
		}
		if rev != 0 && prev.Token != l.token {
			return fmt.Errorf("%w: worker ID %d was claimed by node %s (record %s)", ErrLeaseLost, l.id, prev.NodeID, fmtMs(prev.Timestamp))
		}
		if rev != 0 && prev.Timestamp >= ts {
			return nil
		}
		next := workerValue{WorkerID: l.id, Timestamp: ts, NodeID: l.reg.cfg.NodeID, Token: l.token}
		ok, err := l.writeWorker(ctx, next, rev)
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
	}
	return fmt.Errorf("record %d for worker ID %d in %s: it kept changing", ts, l.id, l.reg.workers.Bucket())
}

// readWorker returns the worker record and its revision; revision 0 when there is none.
func (l *kvLease) readWorker(ctx context.Context) (workerValue, uint64, error) {
	e, err := l.reg.workers.Get(ctx, l.key)
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return workerValue{}, 0, nil
	}
	if err != nil {
		return workerValue{}, 0, fmt.Errorf("read worker record %d from %s: %w", l.id, l.reg.workers.Bucket(), err)
	}
	var v workerValue
	if err := json.Unmarshal(e.Value(), &v); err != nil {
		// Refuse rather than guess: a lost record could hide timestamps already used.
		return workerValue{}, 0, fmt.Errorf("worker record %d in %s is not a record (%q): %w", l.id, l.reg.workers.Bucket(), e.Value(), err)
	}
	return v, e.Revision(), nil
}

// writeWorker writes v if the record is still at revision rev (0: absent). It reports
// false when someone wrote in between.
func (l *kvLease) writeWorker(ctx context.Context, v workerValue, rev uint64) (bool, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return false, fmt.Errorf("encode worker record: %w", err)
	}
	if rev == 0 {
		_, err = l.reg.workers.Create(ctx, l.key, b)
	} else {
		_, err = l.reg.workers.Update(ctx, l.key, b, rev)
	}
	if errors.Is(err, jetstream.ErrKeyExists) || errors.Is(err, jetstream.ErrKeyRevisionMismatch) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("write worker record %d to %s: %w", l.id, l.reg.workers.Bucket(), err)
	}
	return true, nil
}

// fmtMs formats Unix ms as RFC 3339 with milliseconds, UTC; "none" for 0.
func fmtMs(ms int64) string {
	if ms == 0 {
		return "none"
	}
	return time.UnixMilli(ms).UTC().Format("2006-01-02T15:04:05.000Z07:00")
}
