package workerid

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/leafbus/leafbus/internal/testutil"
	"github.com/leafbus/leafbus/snowflake"
)

// keeperNode is one node's worker identity on a real NATS: a KV registry, the forever
// bucket, a real snowflake generator, and the Keeper over them.
type keeperNode struct {
	keeper *Keeper
	gen    *snowflake.Generator
	reg    *KVRegistry
}

// keeperConfig is the configuration of node's Keeper over reg and f, with the heartbeat
// and guard on the system clocks, beating every 250 ms; edit changes it.
func keeperConfig(tb testing.TB, node string, reg Registry, f *Forever, edit func(*KeeperConfig)) KeeperConfig {
	guard := DefaultGuardConfig()
	guard.NodeID, guard.Forever, guard.Logger = node, f, testutil.Logger(tb)
	hb := DefaultHeartbeatConfig()
	hb.NodeID, hb.Forever, hb.Interval, hb.Logger = node, f, 250*time.Millisecond, testutil.Logger(tb)
	cfg := KeeperConfig{Registry: reg, Guard: guard, Heartbeat: hb, Logger: testutil.Logger(tb)}
	if edit != nil {
		edit(&cfg)
	}
	return cfg
}

// startKeeper acquires a worker ID for node, checks the clock, builds the generator on
// the floor and starts the heartbeat, as a dispenser's start does.
func startKeeper(tb testing.TB, cfg KeeperConfig) (*Keeper, *snowflake.Generator) {
	tb.Helper()
	ctx := testutil.Context(tb, 20*time.Second)
	k, err := NewKeeper(cfg)
	must(tb, "NewKeeper", err)
	must(tb, "Acquire", k.Acquire(ctx))
	floor, err := k.CheckClock(ctx)
	must(tb, "CheckClock", err)
	gen, err := snowflake.New(snowflake.Config{WorkerID: k.WorkerID(), Floor: floor, BorrowMax: DefaultBorrowMax})
	must(tb, "snowflake.New", err)
	must(tb, "Start", k.Start(ctx, gen))
	return k, gen
}

// runKeeper runs k.Run until stop is called (or the test ends); stop returns Run's error.
// done is closed when Run has returned.
func runKeeper(tb testing.TB, k *Keeper) (stop func() error, done <-chan struct{}) {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ch := make(chan struct{})
	var result error
	go func() {
		defer close(ch)
		result = k.Run(ctx)
	}()
	stop = func() error {
		cancel()
		select {
		case <-ch:
		case <-time.After(20 * time.Second):
			tb.Fatal("Keeper.Run did not return within 20s of its context ending")
		}
		return result
	}
	tb.Cleanup(func() { stop() })
	return stop, ch
}

// leaseHolderOf reads worker ID id's lease key in reg's bucket: its node ID, or "" when
// no lease is held.
func leaseHolderOf(tb testing.TB, reg *KVRegistry, id int64) string {
	tb.Helper()
	e, err := reg.leases.Get(testutil.Context(tb, 5*time.Second), fmt.Sprint(id))
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return ""
	}
	must(tb, "read lease", err)
	return string(e.Value())
}

// TestKeeperRejoin: a worker ID taken from under the Keeper (another node's lease on its
// key) stops the generator at once; the Keeper takes the next worker ID, moves the same
// generator to it past that ID's records and serves on; Run's clean stop gives the new
// ID back.
func TestKeeperRejoin(t *testing.T) {
	env := startJS(t)
	f := openForever(t, env.js)
	reg := openKVRegistry(t, env.js, kvConfig("n1", kvMaxWorkerID(3)))
	cache := &CacheFile{Path: filepath.Join(t.TempDir(), "cache.json")}
	k, gen := startKeeper(t, keeperConfig(t, "n1", reg, f, func(c *KeeperConfig) { c.Heartbeat.Cache = cache }))
	// The cache file says which registry issued the worker ID (issue 21).
	if e, err := cache.Load(); err != nil || e.WorkerID != 0 || e.Registry != "kv leaf_leases" {
		t.Fatalf("cache file after the first beat: %+v, %v; want worker ID 0 from registry %q", e, err, "kv leaf_leases")
	}
	if k.WorkerID() != 0 || gen.WorkerID() != 0 {
		t.Fatalf("worker ID %d (generator %d), want 0, the lowest free", k.WorkerID(), gen.WorkerID())
	}
	if _, err := gen.Next(); err != nil {
		t.Fatalf("Next after Start: %v", err)
	}
	stop, done := runKeeper(t, k)

	ctx := testutil.Context(t, 30*time.Second)
	if _, err := reg.leases.Put(ctx, "0", []byte(`{"node_id":"thief","token":"not-the-holders"}`)); err != nil {
		t.Fatalf("rewrite the lease: %v", err)
	}
	testutil.Eventually(t, 20*time.Second, "the generator serving with worker ID 1", func() bool {
		_, err := gen.Next()
		return err == nil && gen.WorkerID() == 1
	})
	select {
	case <-done:
		t.Fatalf("Run returned after the loss: %v", stop())
	default:
	}
	if n, why := k.Rejoins(); n != 1 || why == "" {
		t.Fatalf("Rejoins() = %d, %q; want 1 and the loss", n, why)
	}
	if k.WorkerID() != 1 || k.Lease().WorkerID() != 1 {
		t.Fatalf("the Keeper holds worker ID %d, want 1", k.WorkerID())
	}
	if st := k.Stats(); st.LeaseLost || st.Suspended || st.WorkerID != 1 {
		t.Fatalf("Stats() = %+v, want worker ID 1 held and issuing", st)
	}
	if err := stop(); err != nil {
		t.Fatalf("Run after a clean stop: %v", err)
	}
	if holder := leaseHolderOf(t, reg, 1); holder != "" {
		t.Fatalf("worker ID 1 still leased after the clean stop: %s", holder)
	}
	if err := k.Release(ctx); err != nil {
		t.Fatalf("Release after Run: %v", err)
	}
}

// TestKeeperReleaseBeforeRun: a Keeper whose Run never ran (a failed start) gives its
// worker ID back on Release, suspending the generator first; after Run, Release leaves
// the lease to Run.
func TestKeeperReleaseBeforeRun(t *testing.T) {
	env := startJS(t)
	f := openForever(t, env.js)
	reg := openKVRegistry(t, env.js, kvConfig("n1", kvMaxWorkerID(3)))
	k, gen := startKeeper(t, keeperConfig(t, "n1", reg, f, nil))
	if holder := leaseHolderOf(t, reg, 0); holder == "" {
		t.Fatal("worker ID 0 not leased after Start")
	}
	must(t, "Release", k.Release(testutil.Context(t, 10*time.Second)))
	if holder := leaseHolderOf(t, reg, 0); holder != "" {
		t.Fatalf("worker ID 0 still leased after Release: %s", holder)
	}
	if _, err := gen.Next(); !errors.Is(err, ErrStopped) {
		t.Fatalf("Next after Release = %v, want ErrStopped", err)
	}

	// A Keeper that ran: its clean stop released the lease, and Release does nothing.
	k2, _ := startKeeper(t, keeperConfig(t, "n2", reg, f, nil))
	stop, _ := runKeeper(t, k2)
	must(t, "Run", stop())
	reg2 := openKVRegistry(t, env.js, kvConfig("n3", kvMaxWorkerID(3)))
	l, err := reg2.Acquire(testutil.Context(t, 10*time.Second))
	must(t, "Acquire after the clean stop", err)
	if l.WorkerID() != 0 {
		t.Fatalf("after the clean stop the next node leased worker ID %d, want 0 again", l.WorkerID())
	}
	must(t, "Release after Run", k2.Release(testutil.Context(t, 10*time.Second)))
	if holder := leaseHolderOf(t, reg, 0); holder == "" {
		t.Fatal("Release after Run gave back the lease another node holds now")
	}
}

// refusingRegistry hands out leases of fakeLease until its first Acquire after a loss,
// which fails with err.
type refusingRegistry struct {
	leases []*fakeLease
	err    error
	n      int
}

func (r *refusingRegistry) Acquire(context.Context) (Lease, error) {
	if r.n >= len(r.leases) {
		return nil, r.err
	}
	r.n++
	return r.leases[r.n-1], nil
}

// TestKeeperGivesUp: after a loss, a Keeper keeps trying while the registry cannot hand
// out an ID for now (every ID taken), and Run returns, saying why, at the first refusal
// (going on would be unsafe).
func TestKeeperGivesUp(t *testing.T) {
	tests := []struct {
		name    string
		err     error
		wantRun bool // Run goes on
	}{
		{"ErrNoWorkerID", fmt.Errorf("acquire: %w", ErrNoWorkerID), true},
		{"ErrClockBehindRecord", fmt.Errorf("clock: %w", ErrClockBehindRecord), false},
		{"ErrIdentityInUse", ErrIdentityInUse, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			lease := &fakeLease{id: 5}
			reg := &refusingRegistry{leases: []*fakeLease{lease}, err: tt.err}
			k, gen := startKeeper(t, keeperConfig(t, "n1", reg, nil, nil))
			stop, done := runKeeper(t, k)
			lease.setRenewErr(fmt.Errorf("%w: taken", ErrLeaseLost))
			select {
			case <-done:
				if tt.wantRun {
					t.Fatalf("Run returned %v; want it to keep trying", stop())
				}
				err := stop()
				if !errors.Is(err, tt.err) {
					t.Fatalf("Run = %v, want the refusal %v", err, tt.err)
				}
			case <-time.After(3 * time.Second):
				if !tt.wantRun {
					t.Fatal("Run still going 3s after the loss; want it to give up")
				}
				if _, err := gen.Next(); !errors.Is(err, ErrLeaseLost) {
					t.Fatalf("Next while no new worker ID = %v, want ErrLeaseLost", err)
				}
				must(t, "Run", stop())
			}
		})
	}
}

func TestIsRefusal(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want bool
	}{
		{"unreachable", errors.New("nats: no responders available for request"), false},
		{"every ID taken", fmt.Errorf("acquire: %w", ErrNoWorkerID), false},
		{"ZooKeeper down", fmt.Errorf("x: %w", ErrZKUnavailable), false},
		{"records unreadable", ErrRecordUnavailable, false},
		{"timeout", context.DeadlineExceeded, false},
		{"clock behind", fmt.Errorf("clock check: %w", ErrClockBehindRecord), true},
		{"peer skew", ErrPeerSkew, true},
		{"another process as this ip:port", ErrZKAddressInUse, true},
		{"another process as this identity", ErrIdentityInUse, true},
		{"configuration", ErrInvalidConfig, true},
		{"node ID", ErrInvalidNodeID, true},
		{"out of range", ErrWorkerIDOutOfRange, true},
		{"sequence out of range", ErrZKSequenceOutOfRange, true},
		{"canceled", context.Canceled, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := IsRefusal(tt.err); got != tt.want {
				t.Fatalf("IsRefusal(%v) = %v, want %v", tt.err, got, tt.want)
			}
		})
	}
}

func TestKeeperConfigValidate(t *testing.T) {
	base := func(c *KeeperConfig) {}
	tests := []struct {
		name    string
		edit    func(*KeeperConfig)
		wantErr error
		wantMsg string
	}{
		{"OK", base, nil, ""},
		{"ErrInvalidConfig/no registry", func(c *KeeperConfig) { c.Registry = nil }, ErrInvalidConfig, "Registry is nil"},
		{"ErrInvalidNodeID", func(c *KeeperConfig) { c.Guard.NodeID = "" }, ErrInvalidNodeID, "Guard.NodeID"},
		{"ErrInvalidConfig/StopTimeout", func(c *KeeperConfig) { c.Heartbeat.StopTimeout = 0 }, ErrInvalidConfig, "StopTimeout is 0s"},
		{"ErrInvalidConfig/peers without service", func(c *KeeperConfig) {
			env := startJS(t)
			c.Peers.Conn = env.nc
		}, ErrInvalidConfig, "Service is empty"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := keeperConfig(t, "n1", &refusingRegistry{}, nil, tt.edit)
			_, err := NewKeeper(cfg)
			testutil.CheckErr(t, "NewKeeper", err, tt.wantErr, tt.wantMsg)
		})
	}
}
