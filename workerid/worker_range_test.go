package workerid

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/leafbus/leafbus/internal/testutil"
	"github.com/leafbus/leafbus/testenv"
)

func TestRange(t *testing.T) {
	low, high, full := Range{0, 511}, Range{512, 1023}, fullRange(1023)
	tests := []struct {
		name                string
		r, o                Range
		overlaps, conflicts bool
	}{
		{"Disjoint", low, high, false, false},
		{"Adjacent", Range{0, 512}, high, true, true},
		{"Same", high, high, true, false},
		{"Inside", Range{600, 700}, high, true, true},
		{"Full", full, low, true, true},
		{"OneID", Range{7, 7}, Range{7, 7}, true, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.r.Overlaps(tt.o); got != tt.overlaps {
				t.Errorf("%s.Overlaps(%s) = %v, want %v", tt.r, tt.o, got, tt.overlaps)
			}
			if got := tt.o.Overlaps(tt.r); got != tt.overlaps {
				t.Errorf("%s.Overlaps(%s) = %v, want %v", tt.o, tt.r, got, tt.overlaps)
			}
			if got := tt.r.Conflicts(tt.o); got != tt.conflicts {
				t.Errorf("%s.Conflicts(%s) = %v, want %v", tt.r, tt.o, got, tt.conflicts)
			}
		})
	}
	if !high.Contains(512) || !high.Contains(1023) || high.Contains(511) || high.Contains(1024) {
		t.Errorf("%s.Contains is wrong at its edges", high)
	}
	if high.Len() != 512 || high.String() != "512..1023" {
		t.Errorf("%s: Len %d String %q, want 512 and 512..1023", high, high.Len(), high.String())
	}
}

// Every registry's config refuses an empty or negative range, naming the field.
func TestRangeValidate(t *testing.T) {
	const dsn = "root@tcp(127.0.0.1:3306)/leaf"
	tests := []struct {
		name     string
		min, max int64
		wantMsg  string
	}{
		{"OK/full", 0, 1023, ""},
		{"OK/upper half", 512, 1023, ""},
		{"OK/one", 9, 9, ""},
		{"ErrInvalidConfig/min above max", 600, 500, "MinWorkerID is 600, want 0 to MaxWorkerID 500"},
		{"ErrInvalidConfig/negative min", -1, 500, "MinWorkerID is -1"},
		{"ErrInvalidConfig/negative max", 0, -1, "MaxWorkerID is -1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			kv := kvConfig("n1", func(c *KVRegistryConfig) { c.MinWorkerID, c.MaxWorkerID = tt.min, tt.max })
			zkc := zkConfig([]string{"127.0.0.1:2181"}, "x", "10.0.0.5:8080", func(c *ZKRegistryConfig) { c.MinWorkerID, c.MaxWorkerID = tt.min, tt.max })
			my := mysqlConfig(dsn, "10.0.0.5:8080", func(c *MySQLRegistryConfig) { c.MinWorkerID, c.MaxWorkerID = tt.min, tt.max })
			_, static := NewStaticRegistryInRange(tt.min, Range{tt.min, tt.max})
			for what, err := range map[string]error{"KV": kv.Validate(), "ZooKeeper": zkc.Validate(), "MySQL": my.Validate(), "static": static} {
				if tt.wantMsg == "" {
					must(t, what+" Validate", err)
					continue
				}
				wantErrIs(t, what+" Validate", err, ErrInvalidConfig)
				if !strings.Contains(err.Error(), tt.wantMsg) {
					t.Errorf("%s Validate() = %q, want it to say %q", what, err, tt.wantMsg)
				}
			}
		})
	}
}

func TestNewStaticRegistryInRange(t *testing.T) {
	rng := Range{512, 1023}
	for _, id := range []int64{512, 700, 1023} {
		r, err := NewStaticRegistryInRange(id, rng)
		must(t, fmt.Sprintf("NewStaticRegistryInRange(%d, %s)", id, rng), err)
		if l, err := r.Acquire(context.Background()); err != nil || l.WorkerID() != id {
			t.Fatalf("Acquire = %v, %v; want worker ID %d", l, err, id)
		}
	}
	for _, id := range []int64{0, 511, 1024} {
		_, err := NewStaticRegistryInRange(id, rng)
		wantErrIs(t, fmt.Sprintf("NewStaticRegistryInRange(%d, %s)", id, rng), err, ErrWorkerIDOutOfRange)
		wantErrIs(t, fmt.Sprintf("NewStaticRegistryInRange(%d, %s)", id, rng), err, ErrInvalidConfig)
		if want := fmt.Sprintf("--worker-id %d is outside this deployment's worker IDs 512..1023", id); !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
}

// kvRange restricts a KV registry to min..max.
func kvRange(min, max int64) func(*KVRegistryConfig) {
	return func(c *KVRegistryConfig) { c.MinWorkerID, c.MaxWorkerID = min, max }
}

// Two deployments' KV registries on one bucket (the worst case: in production they sit
// on two NATS clusters) with disjoint ranges never hand out each other's IDs, and a full
// range refuses naming it.
func TestKVRegistryRange(t *testing.T) {
	t.Parallel()
	env := startJS(t)
	var got []int64
	for i := range 3 {
		got = append(got, acquire(t, openKVRegistry(t, env.js, kvConfig(fmt.Sprintf("b%d", i), kvRange(5, 7)))).WorkerID())
	}
	if fmt.Sprint(got) != "[5 6 7]" {
		t.Fatalf("worker IDs in range 5..7 = %v, want [5 6 7]", got)
	}
	_, err := openKVRegistry(t, env.js, kvConfig("b3", kvRange(5, 7))).Acquire(testutil.Context(t, 10*time.Second))
	wantErrIs(t, "Acquire in a full range", err, ErrNoWorkerID)
	if want := "all 3 of this deployment's worker IDs 5..7 (--worker-id-min, --worker-id-max) are leased"; !strings.Contains(err.Error(), want) {
		t.Errorf("error %q does not say %q", err, want)
	}
	if l := acquire(t, openKVRegistry(t, env.js, kvConfig("a0", kvRange(0, 4)))); l.WorkerID() != 0 {
		t.Fatalf("range 0..4: worker ID %d, want 0", l.WorkerID())
	}
}

// zkRange restricts a ZooKeeper registry to min..max.
func zkRange(min, max int64) func(*ZKRegistryConfig) {
	return func(c *ZKRegistryConfig) { c.MinWorkerID, c.MaxWorkerID = min, max }
}

func TestZKRecycleRange(t *testing.T) {
	t.Parallel()
	srv := testenv.ZooKeeper(t)
	name := zkTestName(t, srv, srv.Connect(t))
	for i, want := range []int64{8, 9} {
		l := zkAcquire(t, openZK(t, zkConfig(srv.Servers(), name, fmt.Sprintf("10.0.0.%d:1", i+1), zkRecycle(4*time.Second), zkRange(8, 9))))
		if l.WorkerID() != want {
			t.Fatalf("recycle lease %d in range 8..9: worker ID %d, want %d", i, l.WorkerID(), want)
		}
	}
	_, err := openZK(t, zkConfig(srv.Servers(), name, "10.0.0.3:1", zkRecycle(4*time.Second), zkRange(8, 9))).Acquire(testutil.Context(t, 10*time.Second))
	wantErrIs(t, "Acquire in a full range", err, ErrNoWorkerID)
	if want := "all 2 of this deployment's worker IDs 8..9"; !strings.Contains(err.Error(), want) {
		t.Errorf("error %q does not say %q", err, want)
	}
}

// Leaf's layout with a range that does not start at 0: a path whose counter is below
// the range is refused before anything is created; raised the way README "Several
// datacenters" says (placeholder children created and deleted again), it gives the
// range's first ID. A node whose existing node lies outside the range is refused, and
// its node kept.
func TestZKLeafRange(t *testing.T) {
	t.Parallel()
	srv := testenv.ZooKeeper(t)
	conn := srv.Connect(t)
	name := zkTestName(t, srv, conn)
	forever := "/snowflake/" + name + "/forever"

	_, err := openZK(t, zkConfig(srv.Servers(), name, "10.0.0.5:8080", zkRange(6, 9))).Acquire(testutil.Context(t, 10*time.Second))
	wantErrIs(t, "Acquire below the range", err, ErrWorkerIDOutOfRange)
	wantErrIs(t, "Acquire below the range", err, ErrZKSequenceOutOfRange)
	for _, want := range []string{"sequence 0", forever, "worker IDs 6..9", "raised to 6", "6 more children created", "several-datacenters"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	children, _, err := conn.Children(forever)
	must(t, "Children", err)
	if len(children) != 0 {
		t.Fatalf("after the refusal forever/ holds %v, want nothing created", children)
	}

	// The README's set-up: every child created raises the counter, deletes do not.
	for range 6 {
		p, err := conn.Create(forever+"/0.0.0.0:0-", nil, zk.FlagSequence, zk.WorldACL(zk.PermAll))
		must(t, "create placeholder", err)
		must(t, "delete placeholder", conn.Delete(p, -1))
	}
	for i, want := range []int64{6, 7} {
		l := zkAcquire(t, openZK(t, zkConfig(srv.Servers(), name, fmt.Sprintf("10.0.0.%d:8080", i+5), zkRange(6, 9))))
		if l.WorkerID() != want {
			t.Fatalf("node %d after raising the counter: worker ID %d, want %d", i, l.WorkerID(), want)
		}
	}

	// 10.0.0.9 registered under the full range (worker ID 8) and now runs with 0..5.
	full := zkAcquire(t, openZK(t, zkConfig(srv.Servers(), name, "10.0.0.9:8080")))
	must(t, "Release", full.Release(testutil.Context(t, 5*time.Second), 1000))
	_, err = openZK(t, zkConfig(srv.Servers(), name, "10.0.0.9:8080", zkRange(0, 5))).Acquire(testutil.Context(t, 15*time.Second))
	wantErrIs(t, "Acquire of a node registered outside the range", err, ErrWorkerIDOutOfRange)
	for _, want := range []string{"10.0.0.9:8080-0000000008", "worker ID 8", "worker IDs 0..5"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	if _, _, err := conn.Get(forever + "/10.0.0.9:8080-0000000008"); err != nil {
		t.Fatalf("the refused node's own node: %v, want it kept", err)
	}
}

// A cache file whose worker ID lies outside the range is refused while ZooKeeper is
// unreachable.
func TestZKRegistryCacheOutOfRange(t *testing.T) {
	t.Parallel()
	cache := &CacheFile{Path: filepath.Join(t.TempDir(), "cache.json")}
	must(t, "Save", cache.Save(cacheEntry{NodeID: "n1", WorkerID: 7, Timestamp: time.Now().UnixMilli() - 10_000, Registry: "zk /snowflake/down"}))
	r := openZK(t, zkConfig([]string{closedAddr(t)}, "down", "10.0.0.5:8080", zkRange(512, 1023), func(c *ZKRegistryConfig) {
		c.SessionTimeout, c.Cache = time.Second, cache
	}))
	_, err := r.Acquire(testutil.Context(t, 10*time.Second))
	wantErrIs(t, "Acquire from a cache file outside the range", err, ErrWorkerIDOutOfRange)
	if want := "holds worker ID 7, outside this deployment's worker IDs 512..1023"; !strings.Contains(err.Error(), want) {
		t.Errorf("error %q does not say %q", err, want)
	}
}

// openMySQLRange opens a MySQL registry restricted to min..max.
func openMySQLRange(tb testing.TB, dsn, advertise string, min, max int64, createTable bool) *MySQLRegistry {
	tb.Helper()
	r, err := OpenMySQLRegistry(testutil.Context(tb, 10*time.Second), mysqlConfig(dsn, advertise, func(c *MySQLRegistryConfig) {
		c.MinWorkerID, c.MaxWorkerID, c.CreateTable, c.Logger = min, max, createTable, testutil.Logger(tb)
	}))
	if err != nil {
		tb.Fatalf("OpenMySQLRegistry(%s, %d..%d): %v", advertise, min, max, err)
	}
	tb.Cleanup(r.Close)
	return r
}

// A datacenter's own leaf_workerid_alloc counts from its range: created that way by
// --mysql-create-table, or moved there by the ALTER TABLE the refusal names. A row
// below the range is refused (a new one removed again, an old one kept); a full range
// is refused naming it.
func TestMySQLRegistryRange(t *testing.T) {
	t.Parallel()
	maria := testenv.MariaDB(t)
	ctx := testutil.Context(t, 30*time.Second)

	// A new table for range 512..513.
	dsn := maria.NewDatabase(t)
	for i, want := range []int64{512, 513} {
		if l := acquireMySQL(t, openMySQLRange(t, dsn, fmt.Sprintf("10.0.0.%d:1", i+1), 512, 513, true)); l.WorkerID() != want {
			t.Fatalf("node %d in a table created for 512..513: worker ID %d, want %d", i, l.WorkerID(), want)
		}
	}
	_, err := openMySQLRange(t, dsn, "10.0.0.3:1", 512, 513, true).Acquire(ctx)
	wantErrIs(t, "Acquire in a full range", err, ErrNoWorkerID)
	if want := "above 513, the top of worker IDs 512..513"; !strings.Contains(err.Error(), want) {
		t.Errorf("error %q does not say %q", err, want)
	}

	// A table that counts from 1, then the ALTER TABLE from the message.
	dsn = maria.NewDatabase(t)
	old := acquireMySQL(t, openMySQLRange(t, dsn, "10.0.0.9:1", 0, 1023, true)) // worker ID 1
	r := openMySQLRange(t, dsn, "10.0.0.1:1", 512, 1023, false)
	_, err = r.Acquire(ctx)
	wantErrIs(t, "Acquire below the range", err, ErrWorkerIDOutOfRange)
	for _, want := range []string{"gave 10.0.0.1:1 worker ID 2", "worker IDs 512..1023", "removed again", "AUTO_INCREMENT at 512"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q does not say %q", err, want)
		}
	}
	db := sqlDB(t, dsn)
	var rows int
	must(t, "count rows", db.QueryRowContext(ctx, "SELECT COUNT(*) FROM leaf_workerid_alloc WHERE ip_port = '10.0.0.1:1'").Scan(&rows))
	if rows != 0 {
		t.Fatalf("the refused node's new row is still there (%d rows), want it removed", rows)
	}
	_, err = db.ExecContext(ctx, "ALTER TABLE leaf_workerid_alloc AUTO_INCREMENT = 512")
	must(t, "ALTER TABLE", err)
	if l := acquireMySQL(t, r); l.WorkerID() != 512 {
		t.Fatalf("after the ALTER TABLE: worker ID %d, want 512", l.WorkerID())
	}

	// The node registered under the full range, now run with 512..1023: refused, row kept.
	must(t, "Release", old.Release(ctx, 1000))
	_, err = openMySQLRange(t, dsn, "10.0.0.9:1", 512, 1023, false).Acquire(ctx)
	wantErrIs(t, "Acquire of a row below the range", err, ErrWorkerIDOutOfRange)
	if want := "the row of 10.0.0.9:1 in leaf_workerid_alloc holds worker ID 1, below worker IDs 512..1023"; !strings.Contains(err.Error(), want) {
		t.Errorf("error %q does not say %q", err, want)
	}
	if storedMax(t, db, "10.0.0.9:1") != 1000 {
		t.Fatal("the refused node's row changed")
	}
}
