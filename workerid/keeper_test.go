package workerid

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"strings"
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
	hb.CeilingLead = 0 // no KV stall to ride out here; a start waits out less
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
	return runInBackground(tb, "Keeper.Run", 20*time.Second, k.Run)
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
		{"another holder of the worker ID", fmt.Errorf("fence: %w", ErrWorkerIDInUse), true},
		{"corrupt cache file", fmt.Errorf("load: %w", ErrCorruptCacheFile), true},
		{"cache file of another registry", fmt.Errorf("start: %w", ErrCacheOtherRegistry), false},
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

// staticKeeperConfig is node's Keeper configuration with the static registry's worker
// ID id on f, its cache file at cache ("" for none), beating every 100 ms with records
// stale after 1 s.
func staticKeeperConfig(t *testing.T, node string, id int64, f *Forever, cache string) KeeperConfig {
	t.Helper()
	reg, err := NewStaticRegistryInRange(id, fullRange(DefaultMaxWorkerID))
	must(t, "NewStaticRegistryInRange", err)
	return keeperConfig(t, node, reg, f, func(c *KeeperConfig) {
		c.Heartbeat.Interval, c.StaleAfter = 100*time.Millisecond, time.Second
		if cache != "" {
			c.Heartbeat.Cache = &CacheFile{Path: cache}
			c.Guard.Cache = c.Heartbeat.Cache
		}
	})
}

// TestKeeperStaticIDTwice: two dispensers given one static worker ID on one NATS (issue
// 21): the second refuses the worker ID at its clock check, naming the first, which
// serves on; once the first stops cleanly, the second takes the worker ID at once.
func TestKeeperStaticIDTwice(t *testing.T) {
	env := startJS(t)
	f := openForever(t, env.js)
	first, gen := startKeeper(t, staticKeeperConfig(t, "disp-1", 7, f, ""))
	stop, _ := runKeeper(t, first)

	ctx := testutil.Context(t, 30*time.Second)
	second, err := NewKeeper(staticKeeperConfig(t, "disp-2", 7, f, ""))
	must(t, "NewKeeper", err)
	must(t, "Acquire", second.Acquire(ctx))
	_, err = second.CheckClock(ctx)
	testutil.CheckErr(t, "CheckClock of the second holder", err, ErrWorkerIDInUse, "worker ID 7 is held by node disp-1")
	if !IsRefusal(err) {
		t.Fatalf("IsRefusal(%v) = false: a start would wait it out", err)
	}
	if _, err := gen.Next(); err != nil {
		t.Fatalf("the first holder after the second was refused: Next = %v", err)
	}

	must(t, "Run of the first", stop())
	rec, err := f.GetWorker(ctx, 7)
	must(t, "GetWorker", err)
	if !rec.Released || rec.NodeID != "disp-1" {
		t.Fatalf("record after the first's clean stop = %+v, want it released by disp-1", rec)
	}
	third, gen3 := startKeeper(t, staticKeeperConfig(t, "disp-2", 7, f, ""))
	if _, err := gen3.Next(); err != nil || third.WorkerID() != 7 {
		t.Fatalf("after the release: worker ID %d, Next = %v; want 7 and issuing", third.WorkerID(), err)
	}
}

// TestKeeperRaceToStart: two dispensers with one worker ID start at the same instant,
// again and again: never do both serve; one does, the other is refused naming it.
func TestKeeperRaceToStart(t *testing.T) {
	env := startJS(t)
	f := openForever(t, env.js)
	for round := range 5 {
		id := int64(100 + round)
		type result struct {
			node string
			k    *Keeper
			err  error
		}
		results := make(chan result, 2)
		start := make(chan struct{})
		for _, node := range []string{"racer-a", "racer-b"} {
			cfg := staticKeeperConfig(t, node, id, f, "")
			go func() {
				<-start
				ctx := testutil.Context(t, 30*time.Second)
				k, err := NewKeeper(cfg)
				if err == nil {
					err = k.Acquire(ctx)
				}
				var floor int64
				if err == nil {
					floor, err = k.CheckClock(ctx)
				}
				if err == nil {
					var gen *snowflake.Generator
					if gen, err = snowflake.New(snowflake.Config{WorkerID: id, Floor: floor, BorrowMax: DefaultBorrowMax}); err == nil {
						err = k.Start(ctx, gen)
					}
				}
				results <- result{node, k, err}
			}()
		}
		close(start)
		var served, refused []result
		for range 2 {
			r := <-results
			if r.err == nil {
				served = append(served, r)
				stop, _ := runKeeper(t, r.k)
				t.Cleanup(func() { stop() })
			} else {
				refused = append(refused, r)
			}
		}
		if len(served) != 1 || len(refused) != 1 {
			t.Fatalf("round %d: %d served and %d were refused (%v), want one of each", round, len(served), len(refused), refused)
		}
		testutil.CheckErr(t, "start of "+refused[0].node, refused[0].err, ErrWorkerIDInUse, "node "+served[0].node)
	}
}

// TestKeeperStopsForAnotherHolder: a running holder whose worker record another live
// dispenser writes (one of a version without the fence, given the same worker ID)
// stops issuing at its next beat and, unable to take the ID back (its registry gives
// only this one), Run returns the refusal, naming the other.
func TestKeeperStopsForAnotherHolder(t *testing.T) {
	env := startJS(t)
	f := openForever(t, env.js)
	k, gen := startKeeper(t, staticKeeperConfig(t, "disp-1", 9, f, ""))
	stop, done := runKeeper(t, k)
	// An old version raises the record (Forever.RaiseWorker): its ceiling is never below
	// this holder's.
	keepWriting(t, f, 9, Record{WorkerID: 9, NodeID: "old-version", Ceiling: time.Now().Add(time.Minute).UnixMilli()}, 50*time.Millisecond)
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("Run still going 20s after another holder started writing the worker record")
	}
	err := stop()
	testutil.CheckErr(t, "Run", err, ErrWorkerIDInUse, "node old-version (a version without the worker-ID fence)")
	if _, err := gen.Next(); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("Next after the loss = %v, want ErrLeaseLost", err)
	}
}

// TestKeeperRestartTakesItsOwnRecord: a holder that crashed (its Run never stopped
// cleanly) leaves its record unreleased: a restart of the same data dir takes it over
// at once, since its cache file names that run; another node (another data dir) waits
// to see it unwritten for StaleAfter first.
func TestKeeperRestartTakesItsOwnRecord(t *testing.T) {
	env := startJS(t)
	f := openForever(t, env.js)
	cache := filepath.Join(t.TempDir(), "cache.json")
	crashed, _ := startKeeper(t, staticKeeperConfig(t, "disp-1", 11, f, cache))
	_ = crashed // its heartbeat never runs again: as after kill -9

	var logs testutil.SyncBuffer
	cfg := staticKeeperConfig(t, "disp-1", 11, f, cache)
	cfg.StaleAfter = time.Hour // a wait would not end within the test
	cfg.Logger = slog.New(slog.NewTextHandler(io.MultiWriter(&logs, testutil.LogWriter(t)), nil))
	restarted, gen := startKeeper(t, cfg)
	if _, err := gen.Next(); err != nil || !strings.Contains(logs.String(), "previous run's, which has ended") {
		t.Fatalf("restart of the data dir: Next = %v, logs:\n%s\nwant the record taken over at once", err, logs.String())
	}
	stop, _ := runKeeper(t, restarted)
	must(t, "Run", stop())

	// Another data dir: the restarted run stopped cleanly, so at once too; a crashed
	// one's record is watched for StaleAfter.
	crashed2, _ := startKeeper(t, staticKeeperConfig(t, "disp-1", 12, f, cache))
	_ = crashed2
	logs = testutil.SyncBuffer{}
	other := staticKeeperConfig(t, "disp-2", 12, f, filepath.Join(t.TempDir(), "cache.json"))
	other.Logger = cfg.Logger
	_, gen2 := startKeeper(t, other)
	if _, err := gen2.Next(); err != nil || !strings.Contains(logs.String(), "did not rewrite it for") {
		t.Fatalf("another node on a crashed holder's ID: Next = %v, logs:\n%s\nwant it taken after watching", err, logs.String())
	}
}

// TestKeeperStartAfterPausedHolderWrites: a node claims the record of a holder that
// went silent (paused), and the holder, resumed, writes once more before the node's
// first write and then releases it (it finds its lease lost): the node's first write
// fails, it claims the record again, watching it, and serves once it is released,
// rather than refusing the worker ID.
func TestKeeperStartAfterPausedHolderWrites(t *testing.T) {
	env := startJS(t)
	f := openForever(t, env.js)
	paused, _ := startKeeper(t, staticKeeperConfig(t, "paused", 13, f, ""))
	time.Sleep(1200 * time.Millisecond) // past StaleAfter: it counts as gone

	var logs testutil.SyncBuffer
	cfg := staticKeeperConfig(t, "next", 13, f, "")
	cfg.Logger = slog.New(slog.NewTextHandler(io.MultiWriter(&logs, testutil.LogWriter(t)), nil))
	ctx := testutil.Context(t, 30*time.Second)
	k, err := NewKeeper(cfg)
	must(t, "NewKeeper", err)
	must(t, "Acquire", k.Acquire(ctx))
	floor, err := k.CheckClock(ctx)
	must(t, "CheckClock", err)

	// The paused holder resumes: one more write, then, finding its lease lost, release.
	now := time.Now().UnixMilli()
	must(t, "the paused holder's write", paused.fence.write(ctx, now, now+2000, false))
	go func() {
		time.Sleep(300 * time.Millisecond)
		_ = paused.fence.release(context.Background())
	}()

	gen, err := snowflake.New(snowflake.Config{WorkerID: 13, Floor: floor, BorrowMax: DefaultBorrowMax})
	must(t, "snowflake.New", err)
	must(t, "Start", k.Start(ctx, gen))
	id, err := gen.Next()
	must(t, "Next", err)
	dec, err := snowflake.DefaultLayout().Decode(id)
	must(t, "Decode", err)
	if dec.Timestamp <= now+2000 {
		t.Fatalf("first ID's timestamp %d, want above the paused holder's last ceiling %d", dec.Timestamp, now+2000)
	}
	if !strings.Contains(logs.String(), "claiming it again") {
		t.Fatalf("logs:\n%s\nwant the record claimed again after the first write failed", logs.String())
	}
}
