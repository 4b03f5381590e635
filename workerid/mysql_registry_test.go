package workerid

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/leafbus/leafbus/internal/testutil"
	"github.com/leafbus/leafbus/testenv"
)

// mysqlConfig is the default MySQL registry configuration for dsn and advertise,
// changed by edits.
func mysqlConfig(dsn, advertise string, edits ...func(*MySQLRegistryConfig)) MySQLRegistryConfig {
	cfg := DefaultMySQLRegistryConfig()
	cfg.DSN, cfg.Advertise = dsn, advertise
	for _, edit := range edits {
		edit(&cfg)
	}
	return cfg
}

func TestMySQLRegistryConfigValidate(t *testing.T) {
	const dsn = "root@tcp(127.0.0.1:3306)/leaf"
	tests := []struct {
		name    string
		cfg     MySQLRegistryConfig
		wantErr error
		wantMsg string
	}{
		{"OK", mysqlConfig(dsn, "10.0.0.5:8080"), nil, ""},
		{"OK/IPv6", mysqlConfig(dsn, "[::1]:8080", func(c *MySQLRegistryConfig) { c.MaxWorkerID = 31 }), nil, ""},
		{"OK/only worker ID 0", mysqlConfig(dsn, "10.0.0.5:8080", func(c *MySQLRegistryConfig) { c.MaxWorkerID = 0 }), nil, ""},
		{"ErrInvalidConfig/noDSN", mysqlConfig("", "10.0.0.5:8080"), ErrInvalidConfig, "DSN is empty"},
		{"ErrInvalidConfig/badDSN", mysqlConfig("tcp(x", "10.0.0.5:8080"), ErrInvalidConfig, "DSN"},
		// The driver quotes a bad parameter's value; the message must not, whatever it holds.
		{"ErrInvalidConfig/badDSN keeps the secret out", mysqlConfig("root:hunter2@tcp(127.0.0.1:3306)/leaf?timeout=hunter2", "10.0.0.5:8080"), ErrInvalidConfig, "the DSN does not parse"},
		{"ErrInvalidConfig/noPort", mysqlConfig(dsn, "10.0.0.5"), ErrInvalidConfig, `Advertise "10.0.0.5"`},
		{"ErrInvalidConfig/empty", mysqlConfig(dsn, ""), ErrInvalidConfig, "Advertise"},
		{"ErrInvalidConfig/long", mysqlConfig(dsn, strings.Repeat("1", 130)+":1"), ErrInvalidConfig, "132 characters"},
		{"ErrInvalidConfig/max", mysqlConfig(dsn, "10.0.0.5:8080", func(c *MySQLRegistryConfig) { c.MaxWorkerID = -1 }), ErrInvalidConfig, "MaxWorkerID is -1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			if tt.wantErr == nil {
				must(t, "Validate", err)
				return
			}
			wantErrIs(t, "Validate", err, tt.wantErr)
			if !strings.Contains(err.Error(), tt.wantMsg) {
				t.Errorf("Validate() = %q, want it to name %q", err, tt.wantMsg)
			}
			if strings.Contains(err.Error(), "hunter2") {
				t.Errorf("Validate() = %q quotes the DSN's password", err)
			}
		})
	}
}

// openMySQLRegistry opens a registry on dsn for advertise, creating the table; closed at
// cleanup.
func openMySQLRegistry(tb testing.TB, dsn, advertise string, maxWorkerID int64) *MySQLRegistry {
	tb.Helper()
	r, err := OpenMySQLRegistry(testutil.Context(tb, 10*time.Second), mysqlConfig(dsn, advertise, func(c *MySQLRegistryConfig) {
		c.MaxWorkerID, c.CreateTable, c.Logger = maxWorkerID, true, testutil.Logger(tb)
	}))
	if err != nil {
		tb.Fatalf("OpenMySQLRegistry(%s): %v", advertise, err)
	}
	tb.Cleanup(r.Close)
	return r
}

func acquireMySQL(tb testing.TB, r *MySQLRegistry) Lease {
	tb.Helper()
	l, err := r.Acquire(testutil.Context(tb, 10*time.Second))
	if err != nil {
		tb.Fatalf("Acquire for %s: %v", r.cfg.Advertise, err)
	}
	return l
}

// sqlDB is a plain connection to dsn for the test's own statements.
func sqlDB(tb testing.TB, dsn string) *sql.DB {
	tb.Helper()
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		tb.Fatalf("sql.Open: %v", err)
	}
	tb.Cleanup(func() { db.Close() })
	return db
}

// storedMax reads max_timestamp of ip_port's row.
func storedMax(tb testing.TB, db *sql.DB, ipPort string) int64 {
	tb.Helper()
	var ts int64
	err := db.QueryRowContext(testutil.Context(tb, 5*time.Second), "SELECT max_timestamp FROM leaf_workerid_alloc WHERE ip_port = ?", ipPort).Scan(&ts)
	must(tb, "read max_timestamp of "+ipPort, err)
	return ts
}

func TestMySQLRegistryKeepsIDAcrossRestart(t *testing.T) {
	t.Parallel()
	dsn := testenv.MariaDB(t).NewDatabase(t)
	ctx := testutil.Context(t, 20*time.Second)

	ra := openMySQLRegistry(t, dsn, "10.0.0.5:8080", DefaultMaxWorkerID)
	a := acquireMySQL(t, ra)
	if a.WorkerID() != 1 || a.Recorded() != 0 || a.TTL() != 0 {
		t.Fatalf("first node: WorkerID, Recorded, TTL = %d, %d, %s; want 1, 0, 0s (first auto-increment id, no record, permanent)",
			a.WorkerID(), a.Recorded(), a.TTL())
	}
	b := acquireMySQL(t, openMySQLRegistry(t, dsn, "10.0.0.6:8080", DefaultMaxWorkerID))
	if b.WorkerID() != 2 {
		t.Fatalf("second node: WorkerID = %d, want 2", b.WorkerID())
	}
	must(t, "Renew(1000)", a.Renew(ctx, 1000))
	must(t, "Release(2000)", a.Release(ctx, 2000))
	ra.Close()

	// The restarted node finds its row: same ID, its own record.
	a2 := acquireMySQL(t, openMySQLRegistry(t, dsn, "10.0.0.5:8080", DefaultMaxWorkerID))
	if a2.WorkerID() != 1 || a2.Recorded() != 2000 {
		t.Fatalf("after restart: WorkerID, Recorded = %d, %d; want 1, 2000", a2.WorkerID(), a2.Recorded())
	}
	// A restart inserts nothing, so it burns no auto-increment value.
	c := acquireMySQL(t, openMySQLRegistry(t, dsn, "10.0.0.7:8080", DefaultMaxWorkerID))
	if c.WorkerID() != 3 {
		t.Fatalf("third node after a restart: WorkerID = %d, want 3 (no id burnt by the restart)", c.WorkerID())
	}
}

func TestMySQLRegistryRecordOnlyRises(t *testing.T) {
	t.Parallel()
	dsn := testenv.MariaDB(t).NewDatabase(t)
	db := sqlDB(t, dsn)
	ctx := testutil.Context(t, 20*time.Second)
	l := acquireMySQL(t, openMySQLRegistry(t, dsn, "10.0.0.5:8080", DefaultMaxWorkerID))
	for _, step := range []struct {
		renew, want int64
	}{
		{5000, 5000},
		{3000, 5000}, // lower: kept
		{5000, 5000}, // same value, same second: nothing changes, still fine
		{7000, 7000},
	} {
		must(t, fmt.Sprintf("Renew(%d)", step.renew), l.Renew(ctx, step.renew))
		if got := storedMax(t, db, "10.0.0.5:8080"); got != step.want {
			t.Fatalf("after Renew(%d): max_timestamp = %d, want %d", step.renew, got, step.want)
		}
	}
	must(t, "Release(6000)", l.Release(ctx, 6000))
	if got := storedMax(t, db, "10.0.0.5:8080"); got != 7000 {
		t.Fatalf("after Release(6000): max_timestamp = %d, want 7000", got)
	}
}

// A row the Leaf fork wrote (explicit id, NULL max_timestamp as its schema allows, or a
// timestamp) is taken over as it is.
func TestMySQLRegistryTakesOverForkRow(t *testing.T) {
	t.Parallel()
	dsn := testenv.MariaDB(t).NewDatabase(t)
	db := sqlDB(t, dsn)
	ctx := testutil.Context(t, 20*time.Second)
	openMySQLRegistry(t, dsn, "10.0.0.9:1", DefaultMaxWorkerID) // creates the table
	_, err := db.ExecContext(ctx, "INSERT INTO leaf_workerid_alloc (id, ip, port, ip_port, max_timestamp, gmt_create) VALUES "+
		"(7, '10.0.0.5', '8080', '10.0.0.5:8080', 1763790000123, NOW()), (8, '10.0.0.6', '8080', '10.0.0.6:8080', NULL, NOW())")
	must(t, "insert fork rows", err)

	l := acquireMySQL(t, openMySQLRegistry(t, dsn, "10.0.0.5:8080", DefaultMaxWorkerID))
	if l.WorkerID() != 7 || l.Recorded() != 1763790000123 {
		t.Fatalf("fork row with a timestamp: WorkerID, Recorded = %d, %d; want 7, 1763790000123", l.WorkerID(), l.Recorded())
	}
	n := acquireMySQL(t, openMySQLRegistry(t, dsn, "10.0.0.6:8080", DefaultMaxWorkerID))
	if n.WorkerID() != 8 || n.Recorded() != 0 {
		t.Fatalf("fork row with NULL max_timestamp: WorkerID, Recorded = %d, %d; want 8, 0", n.WorkerID(), n.Recorded())
	}
	must(t, "Renew on the NULL row", n.Renew(ctx, 42))
	if got := storedMax(t, db, "10.0.0.6:8080"); got != 42 {
		t.Fatalf("max_timestamp = %d, want 42", got)
	}
}

func TestMySQLRegistryConcurrentAcquireGivesDistinctIDs(t *testing.T) {
	t.Parallel()
	dsn := testenv.MariaDB(t).NewDatabase(t)
	const n = 10
	regs := make([]*MySQLRegistry, n)
	for i := range regs {
		regs[i] = openMySQLRegistry(t, dsn, fmt.Sprintf("10.0.0.%d:8080", i+1), DefaultMaxWorkerID)
	}
	ids := raceAcquire(t, regs)
	seen := map[int64]int{}
	for i, id := range ids {
		if prev, dup := seen[id]; dup {
			t.Fatalf("nodes %d and %d both got worker ID %d", prev, i, id)
		}
		seen[id] = i
		if id < 1 || id > n {
			t.Errorf("node %d got worker ID %d, want 1..%d (no auto-increment value burnt)", i, id, n)
		}
	}
}

// Two processes started with the same --advertise: only one may run as its worker ID.
func TestMySQLRegistrySameIdentityRefused(t *testing.T) {
	t.Parallel()
	dsn := testenv.MariaDB(t).NewDatabase(t)
	const racers = 4
	regs := make([]*MySQLRegistry, racers)
	for i := range regs {
		regs[i] = openMySQLRegistry(t, dsn, "10.0.0.5:8080", DefaultMaxWorkerID)
	}
	ctx := testutil.Context(t, 30*time.Second)
	leases := make([]Lease, racers)
	errs := make([]error, racers)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range regs {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			leases[i], errs[i] = regs[i].Acquire(ctx)
		}()
	}
	close(start)
	wg.Wait()
	winner := -1
	for i, err := range errs {
		if err == nil {
			if winner >= 0 {
				t.Fatalf("processes %d and %d with the same ip:port both got worker ID %d", winner, i, leases[i].WorkerID())
			}
			winner = i
			continue
		}
		wantErrIs(t, fmt.Sprintf("Acquire by process %d", i), err, ErrIdentityInUse)
		if !strings.Contains(err.Error(), "10.0.0.5:8080") || !strings.Contains(err.Error(), "--advertise") {
			t.Errorf("error %q should name the identity and --advertise", err)
		}
	}
	if winner < 0 {
		t.Fatalf("no process got the worker ID: %v", errors.Join(errs...))
	}

	// Once the holder stops cleanly, a restarted process takes the same ID over.
	id := leases[winner].WorkerID()
	must(t, "Release", leases[winner].Release(ctx, 1000))
	next := regs[(winner+1)%racers]
	l := acquireMySQL(t, next)
	if l.WorkerID() != id || l.Recorded() != 1000 {
		t.Fatalf("after the holder released: WorkerID, Recorded = %d, %d; want %d, 1000", l.WorkerID(), l.Recorded(), id)
	}
}

func TestMySQLRegistryAboveRange(t *testing.T) {
	t.Parallel()
	dsn := testenv.MariaDB(t).NewDatabase(t)
	db := sqlDB(t, dsn)
	for _, ip := range []string{"10.0.0.1:1", "10.0.0.2:1"} {
		acquireMySQL(t, openMySQLRegistry(t, dsn, ip, 2))
	}
	r := openMySQLRegistry(t, dsn, "10.0.0.3:1", 2)
	for attempt := range 2 { // a second start says the same and burns no further id
		_, err := r.Acquire(testutil.Context(t, 10*time.Second))
		wantErrIs(t, fmt.Sprintf("Acquire %d of a third node with MaxWorkerID 2", attempt), err, ErrNoWorkerID)
		for _, s := range []string{"worker ID 3", "10.0.0.3:1", "above 2", "docs/errors.md#mysql-worker-range"} {
			if !strings.Contains(err.Error(), s) {
				t.Errorf("error %q should contain %q", err, s)
			}
		}
	}
	var maxID int64
	must(t, "read MAX(id)", db.QueryRowContext(testutil.Context(t, 5*time.Second), "SELECT MAX(id) FROM leaf_workerid_alloc").Scan(&maxID))
	if maxID != 3 {
		t.Fatalf("MAX(id) = %d, want 3 (the refused node's row kept, nothing more inserted)", maxID)
	}
	// The operator's fix from the message works.
	_, err := db.ExecContext(testutil.Context(t, 5*time.Second), "UPDATE leaf_workerid_alloc SET id = 0 WHERE ip_port = '10.0.0.3:1'")
	must(t, "move the row to id 0", err)
	if l := acquireMySQL(t, r); l.WorkerID() != 0 {
		t.Fatalf("after the fix: WorkerID = %d, want 0", l.WorkerID())
	}
}

func TestMySQLRegistryMissingTable(t *testing.T) {
	t.Parallel()
	dsn := testenv.MariaDB(t).NewDatabase(t)
	_, err := OpenMySQLRegistry(testutil.Context(t, 10*time.Second), mysqlConfig(dsn, "10.0.0.5:8080", func(c *MySQLRegistryConfig) { c.Logger = testutil.Logger(t) }))
	if err == nil || !strings.Contains(err.Error(), "--mysql-create-table") {
		t.Fatalf("OpenMySQLRegistry without the table: error = %v, want one that says --mysql-create-table", err)
	}
}

// The identity lock behaves like an ephemeral node: a lost connection is taken again
// when nobody else took the identity meanwhile, and ErrLeaseLost when someone did.
func TestMySQLRegistryLockConnectionLost(t *testing.T) {
	t.Parallel()
	dsn := testenv.MariaDB(t).NewDatabase(t)
	db := sqlDB(t, dsn)
	ctx := testutil.Context(t, 30*time.Second)
	r := openMySQLRegistry(t, dsn, "10.0.0.5:8080", DefaultMaxWorkerID)
	l := acquireMySQL(t, r)
	killLockHolder := func() {
		t.Helper()
		var conn int64
		must(t, "IS_USED_LOCK", db.QueryRowContext(ctx, "SELECT IS_USED_LOCK(?)", r.lockName).Scan(&conn))
		_, err := db.ExecContext(ctx, fmt.Sprintf("KILL %d", conn))
		must(t, "KILL the lock connection", err)
		testutil.Eventually(t, 5*time.Second, "the lock to be freed", func() bool {
			var free int64
			return db.QueryRowContext(ctx, "SELECT IS_FREE_LOCK(?)", r.lockName).Scan(&free) == nil && free == 1
		})
	}

	killLockHolder()
	must(t, "Renew after losing the lock connection", l.Renew(ctx, 1000))
	var holder sql.NullInt64
	must(t, "IS_USED_LOCK", db.QueryRowContext(ctx, "SELECT IS_USED_LOCK(?)", r.lockName).Scan(&holder))
	if !holder.Valid {
		t.Fatalf("after Renew the identity lock is free, want it taken again")
	}

	killLockHolder()
	other := acquireMySQL(t, openMySQLRegistry(t, dsn, "10.0.0.5:8080", DefaultMaxWorkerID))
	err := l.Renew(ctx, 2000)
	wantErrIs(t, "Renew after another process took the identity", err, ErrLeaseLost)
	must(t, "the new holder's Renew", other.Renew(ctx, 3000))
}

func TestMySQLRegistryRowDeleted(t *testing.T) {
	t.Parallel()
	dsn := testenv.MariaDB(t).NewDatabase(t)
	db := sqlDB(t, dsn)
	ctx := testutil.Context(t, 20*time.Second)
	l := acquireMySQL(t, openMySQLRegistry(t, dsn, "10.0.0.5:8080", DefaultMaxWorkerID))
	_, err := db.ExecContext(ctx, "DELETE FROM leaf_workerid_alloc")
	must(t, "DELETE", err)
	wantErrIs(t, "Renew after the row was deleted", l.Renew(ctx, 1000), ErrLeaseLost)
}

// The start-up check on max_timestamp is the guard's and it refuses, where the Leaf fork
// would swallow a failed check.
func TestMySQLRegistryGuardRefusesClockBehindRecord(t *testing.T) {
	t.Parallel()
	dsn := testenv.MariaDB(t).NewDatabase(t)
	db := sqlDB(t, dsn)
	ctx := testutil.Context(t, 20*time.Second)
	r := openMySQLRegistry(t, dsn, "10.0.0.5:8080", DefaultMaxWorkerID)
	l := acquireMySQL(t, r)
	ahead := time.Now().Add(time.Hour).UnixMilli()
	must(t, "Renew an hour ahead", l.Renew(ctx, ahead))
	must(t, "Release", l.Release(ctx, ahead))

	l = acquireMySQL(t, r)
	if l.Recorded() != ahead {
		t.Fatalf("Recorded() = %d, want %d", l.Recorded(), ahead)
	}
	g, err := newGuard(guardConfig(func(c *GuardConfig) {
		c.NodeID = "n1"
		c.Logger = testutil.Logger(t)
	}))
	must(t, "newGuard", err)
	_, err = g.Start(ctx, l)
	wantErrIs(t, "Guard.Start with max_timestamp an hour ahead", err, ErrClockBehindRecord)
	if storedMax(t, db, "10.0.0.5:8080") != ahead {
		t.Fatalf("the refused start changed max_timestamp")
	}
}

// MySQL down at start refuses; a MySQL restart while running is a transient Renew error,
// after which the lease takes its identity lock again.
func TestMySQLRegistryServerDown(t *testing.T) {
	t.Parallel()
	srv := testenv.StartMariaDB(t)
	dsn := srv.NewDatabase(t)
	ctx := testutil.Context(t, 60*time.Second)
	l := acquireMySQL(t, openMySQLRegistry(t, dsn, "10.0.0.5:8080", DefaultMaxWorkerID))
	must(t, "Renew", l.Renew(ctx, 1000))

	srv.Stop()
	dc, err := mysql.ParseDSN(dsn)
	must(t, "ParseDSN", err)
	dc.Timeout = time.Second
	_, err = OpenMySQLRegistry(testutil.Context(t, 5*time.Second), mysqlConfig(dc.FormatDSN(), "10.0.0.6:8080", func(c *MySQLRegistryConfig) { c.Logger = testutil.Logger(t) }))
	if err == nil {
		t.Fatalf("OpenMySQLRegistry with MariaDB stopped: want an error")
	}
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	err = l.Renew(rctx, 2000)
	cancel()
	if err == nil || errors.Is(err, ErrLeaseLost) {
		t.Fatalf("Renew with MariaDB stopped = %v, want a transient error (not ErrLeaseLost)", err)
	}

	srv.Start()
	testutil.Eventually(t, 20*time.Second, "Renew to succeed after MariaDB restarted", func() bool {
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		err := l.Renew(rctx, 3000)
		if errors.Is(err, ErrLeaseLost) {
			t.Fatalf("Renew after MariaDB restarted: %v", err)
		}
		return err == nil
	})
	// The restart freed every named lock; Renew took the identity back.
	_, err = openMySQLRegistry(t, dsn, "10.0.0.5:8080", DefaultMaxWorkerID).Acquire(ctx)
	wantErrIs(t, "Acquire of the same identity after the restart", err, ErrIdentityInUse)
}

// BenchmarkMySQLLeaseRenew is one heartbeat's registry write: the identity lock check and
// the GREATEST update.
func BenchmarkMySQLLeaseRenew(b *testing.B) {
	dsn := testenv.MariaDB(b).NewDatabase(b)
	l := acquireMySQL(b, openMySQLRegistry(b, dsn, "10.0.0.5:8080", DefaultMaxWorkerID))
	ctx := testutil.Context(b, 5*time.Minute)
	ts := time.Now().UnixMilli()
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		if err := l.Renew(ctx, ts+int64(i)); err != nil {
			b.Fatal(err)
		}
	}
}

// TestMySQLRegistryHungServer: a server that hangs instead of refusing (stopped with
// SIGSTOP, so connections are accepted and never answered) ends every registry call at
// the driver's I/O timeout even when the caller's context has no deadline, and a DSN's
// own timeouts are kept.
func TestMySQLRegistryHungServer(t *testing.T) {
	t.Parallel()
	// That a DSN's own timeouts are kept: internal/mysqldsn's test.

	srv := testenv.StartMariaDB(t)
	dsn := srv.NewDatabase(t)
	l := acquireMySQL(t, openMySQLRegistry(t, dsn, "10.0.0.5:8080", DefaultMaxWorkerID))
	srv.Freeze()

	bound := 3*mysqlRegistryIOTimeout + 30*time.Second // a slow machine's slack; a hang is forever
	opened, renewed := make(chan error, 1), make(chan error, 1)
	go func() {
		r, err := OpenMySQLRegistry(context.Background(), mysqlConfig(dsn, "10.0.0.6:8080", func(c *MySQLRegistryConfig) { c.Logger = testutil.Logger(t) }))
		if err == nil {
			r.Close()
		}
		opened <- err
	}()
	go func() { renewed <- l.Renew(context.Background(), time.Now().UnixMilli()) }()
	for _, c := range []struct {
		call string
		ch   chan error
	}{{"OpenMySQLRegistry", opened}, {"Renew", renewed}} {
		select {
		case err := <-c.ch:
			if err == nil || errors.Is(err, ErrLeaseLost) {
				t.Errorf("%s on a hung MariaDB = %v, want a transient error", c.call, err)
			}
		case <-time.After(bound):
			t.Fatalf("%s on a hung MariaDB with no deadline did not return within %v", c.call, bound)
		}
	}
}
