package workerid

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/leafbus/leafbus/internal/testutil"
	"github.com/nats-io/nats.go/jetstream"
)

func TestKVRegistryConfigValidate(t *testing.T) {
	tests := []struct {
		name    string
		edit    func(*KVRegistryConfig)
		wantErr error
		wantMsg []string
	}{
		{"OK/defaults", func(*KVRegistryConfig) {}, nil, nil},
		{"OK/4x", func(c *KVRegistryConfig) { c.TTL, c.RenewInterval = 4*time.Second, time.Second }, nil, nil},
		{"OK/only worker ID 0", kvMaxWorkerID(0), nil, nil},
		{"ErrInvalidConfig/TTL vs RenewInterval", func(c *KVRegistryConfig) { c.TTL = 10 * time.Second }, ErrInvalidConfig, []string{"TTL 10s", "renew interval 3s", "12s"}},
		{"ErrInvalidConfig/zero TTL", func(c *KVRegistryConfig) { c.TTL = 0 }, ErrInvalidConfig, []string{"TTL is 0s", "> 0"}},
		{"ErrInvalidConfig/zero RenewInterval", func(c *KVRegistryConfig) { c.RenewInterval = 0 }, ErrInvalidConfig, []string{"RenewInterval is 0s"}},
		{"ErrInvalidConfig/max", kvMaxWorkerID(-2), ErrInvalidConfig, []string{"MaxWorkerID is -2", ">= 0"}},
		{"ErrInvalidConfig/replicas", func(c *KVRegistryConfig) { c.Replicas = 7 }, ErrInvalidConfig, []string{"Replicas is 7", "1 to 5"}},
		{"ErrInvalidConfig/zero replicas", func(c *KVRegistryConfig) { c.Replicas = 0 }, ErrInvalidConfig, []string{"Replicas is 0"}},
		{"ErrInvalidConfig/prefix", func(c *KVRegistryConfig) { c.Prefix = "" }, ErrInvalidConfig, []string{"Prefix is empty"}},
		{"ErrInvalidNodeID", func(c *KVRegistryConfig) { c.NodeID = "a.b" }, ErrInvalidNodeID, []string{"a.b"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := kvConfig("n1", tt.edit).Validate()
			if tt.wantErr == nil {
				must(t, "Validate", err)
				return
			}
			wantErrIs(t, "Validate", err, tt.wantErr)
			for _, s := range tt.wantMsg {
				if !strings.Contains(err.Error(), s) {
					t.Errorf("Validate() = %q, want it to name %q", err, s)
				}
			}
		})
	}
}

func acquire(tb testing.TB, r *KVRegistry) Lease {
	tb.Helper()
	l, err := r.Acquire(testutil.Context(tb, 10*time.Second))
	if err != nil {
		tb.Fatalf("Acquire: %v", err)
	}
	return l
}

func TestKVRegistryTwoNodesGetDifferentIDs(t *testing.T) {
	env := startJS(t)
	a := acquire(t, openKVRegistry(t, env.js, kvConfig("a")))
	b := acquire(t, openKVRegistry(t, env.js, kvConfig("b")))
	if a.WorkerID() != 0 || b.WorkerID() != 1 {
		t.Fatalf("worker IDs = %d, %d, want 0, 1", a.WorkerID(), b.WorkerID())
	}
	if a.TTL() != DefaultLeaseTTL {
		t.Fatalf("TTL() = %s, want %s", a.TTL(), DefaultLeaseTTL)
	}
}

func TestKVRegistryTakesLowestFreeID(t *testing.T) {
	env := startJS(t)
	ctx := testutil.Context(t, 20*time.Second)
	var leases []Lease
	for i := range 3 {
		leases = append(leases, acquire(t, openKVRegistry(t, env.js, kvConfig(fmt.Sprintf("n%d", i)))))
	}
	must(t, "Release(1)", leases[1].Release(ctx, 1000))
	l := acquire(t, openKVRegistry(t, env.js, kvConfig("late")))
	if l.WorkerID() != 1 {
		t.Fatalf("after releasing 1 of 0..2, Acquire got %d, want 1", l.WorkerID())
	}
	if l.Recorded() != 1000 {
		t.Fatalf("Recorded() = %d, want 1000 (the timestamp the previous holder released with)", l.Recorded())
	}
}

func TestKVRegistryConcurrentAcquireGivesDistinctIDs(t *testing.T) {
	env := startJS(t)
	const n = 20
	regs := make([]*KVRegistry, n)
	for i := range regs {
		regs[i] = openKVRegistry(t, env.js, kvConfig(fmt.Sprintf("n%d", i)))
	}
	ids := raceAcquire(t, regs)
	seen := map[int64]int{}
	for i, id := range ids {
		if prev, dup := seen[id]; dup {
			t.Fatalf("n%d and n%d both got worker ID %d", prev, i, id)
		}
		seen[id] = i
		if id < 0 || id >= n {
			t.Errorf("n%d got worker ID %d, want 0..%d (lowest free)", i, id, n-1)
		}
	}
}

func TestKVRegistryAllTaken(t *testing.T) {
	env := startJS(t)
	for i := range 4 {
		acquire(t, openKVRegistry(t, env.js, kvConfig(fmt.Sprintf("n%d", i), kvMaxWorkerID(3))))
	}
	_, err := openKVRegistry(t, env.js, kvConfig("n4", kvMaxWorkerID(3))).Acquire(testutil.Context(t, 10*time.Second))
	wantErrIs(t, "fifth Acquire with MaxWorkerID 3", err, ErrNoWorkerID)
}

func TestKVRegistryBucketTTLMismatch(t *testing.T) {
	env := startJS(t)
	openKVRegistry(t, env.js, kvConfig("a"))
	_, err := OpenKVRegistry(testutil.Context(t, 10*time.Second), env.js, kvConfig("b", func(c *KVRegistryConfig) { c.TTL = 40 * time.Second }))
	wantErrIs(t, "OpenKVRegistry with another TTL", err, ErrInvalidConfig)
	if !strings.Contains(err.Error(), "30s") || !strings.Contains(err.Error(), "40s") {
		t.Fatalf("error %q should name both TTLs", err)
	}
}

// An abandoned lease expires, another node takes the ID and starts past the previous
// holder's record, and the previous holder's next Renew reports the loss.
func TestKVRegistryAbandonedLeaseExpires(t *testing.T) {
	env := startJS(t)
	ctx := testutil.Context(t, 60*time.Second) // generous: on a starved machine the steps below add up
	old := map[int64]Lease{}
	recorded := map[int64]int64{}
	for i, ts := range []int64{1_700_000_000_000, 1_700_000_000_500} {
		l := acquire(t, openKVRegistry(t, env.js, kvConfig(fmt.Sprintf("old%d", i), kvShortTTL)))
		must(t, "Renew", l.Renew(ctx, ts))
		old[l.WorkerID()] = l
		recorded[l.WorkerID()] = ts
	}
	// Both holders now stop renewing, as if killed.
	b := openKVRegistry(t, env.js, kvConfig("new", kvShortTTL))
	var got Lease
	testutil.Eventually(t, 10*time.Second, "an abandoned lease to expire", func() bool {
		l, err := b.Acquire(ctx)
		if err != nil && !errors.Is(err, ErrNoWorkerID) {
			t.Fatalf("Acquire: %v", err)
		}
		got = l
		return err == nil
	})
	if want := recorded[got.WorkerID()]; got.Recorded() != want {
		t.Fatalf("new holder of worker ID %d: Recorded() = %d, want the previous holder's %d", got.WorkerID(), got.Recorded(), want)
	}
	err := old[got.WorkerID()].Renew(ctx, recorded[got.WorkerID()]+3000)
	wantErrIs(t, "Renew by the previous holder", err, ErrLeaseLost)
	// The failed Renew of the previous holder must not have lowered the record either.
	must(t, "Renew by the new holder", got.Renew(ctx, 1_600_000_000_000))
	must(t, "Release", got.Release(ctx, 1_600_000_000_000))
	again := acquire(t, openKVRegistry(t, env.js, kvConfig("third", kvShortTTL)))
	if again.WorkerID() == got.WorkerID() && again.Recorded() < recorded[got.WorkerID()] {
		t.Fatalf("third holder's Recorded() = %d, below %d: the record went down", again.Recorded(), recorded[got.WorkerID()])
	}
}

// A lease that expired while nobody took the ID is created again by Renew.
func TestKVRegistryRenewRecreatesExpiredLease(t *testing.T) {
	env := startJS(t)
	ctx := testutil.Context(t, 30*time.Second)
	reg := openKVRegistry(t, env.js, kvConfig("a", kvShortTTL))
	l := acquire(t, reg)
	must(t, "Renew", l.Renew(ctx, 1000))
	kv, err := env.js.KeyValue(ctx, "leaf_leases")
	must(t, "bind leases bucket", err)
	testutil.Eventually(t, 10*time.Second, "the lease key to expire", func() bool {
		_, err := kv.Get(ctx, "0")
		return errors.Is(err, jetstream.ErrKeyNotFound)
	})
	must(t, "Renew after expiry", l.Renew(ctx, 2000))
	other := acquire(t, openKVRegistry(t, env.js, kvConfig("b", kvShortTTL)))
	if other.WorkerID() == l.WorkerID() {
		t.Fatalf("another node got worker ID %d although its holder renewed it", other.WorkerID())
	}
}

// Renew never lowers the worker record, and Release frees the ID at once.
func TestKVRegistryRecordOnlyRises(t *testing.T) {
	env := startJS(t)
	ctx := testutil.Context(t, 20*time.Second)
	l := acquire(t, openKVRegistry(t, env.js, kvConfig("a", kvMaxWorkerID(0))))
	must(t, "Renew(5000)", l.Renew(ctx, 5000))
	must(t, "Renew(4000)", l.Renew(ctx, 4000))
	must(t, "Release(4500)", l.Release(ctx, 4500))
	err := l.Renew(ctx, 6000)
	if err == nil {
		t.Fatal("Renew after Release succeeded, want an error")
	}
	next := acquire(t, openKVRegistry(t, env.js, kvConfig("b", kvMaxWorkerID(0))))
	if next.WorkerID() != 0 || next.Recorded() != 5000 {
		t.Fatalf("next holder = (ID %d, Recorded %d), want (0, 5000)", next.WorkerID(), next.Recorded())
	}
}

// A holder whose ID was taken over while its lease key still existed (an operator
// deleting the key, or an expiry it has not noticed) gets ErrLeaseLost, and so does its
// Release, which must not delete the new holder's lease.
func TestKVRegistryTakeover(t *testing.T) {
	env := startJS(t)
	ctx := context.Background()
	a := acquire(t, openKVRegistry(t, env.js, kvConfig("a", kvMaxWorkerID(0))))
	kv, err := env.js.KeyValue(ctx, "leaf_leases")
	must(t, "bind leases bucket", err)
	must(t, "delete lease key", kv.Delete(ctx, "0"))
	b := acquire(t, openKVRegistry(t, env.js, kvConfig("b", kvMaxWorkerID(0))))
	wantErrIs(t, "Renew by the old holder", a.Renew(ctx, 10), ErrLeaseLost)
	wantErrIs(t, "Release by the old holder", a.Release(ctx, 10), ErrLeaseLost)
	must(t, "Renew by the new holder", b.Renew(ctx, 20))
}
