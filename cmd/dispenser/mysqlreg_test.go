package main

// The MySQL worker registry (--worker-registry mysql) through the real dispenser code
// path, against a real MariaDB.

import (
	"context"
	"database/sql"
	"errors"
	"testing"
	"time"

	_ "github.com/go-sql-driver/mysql" // the "mysql" driver for the test's own queries

	"github.com/leafbus/leafbus/testenv"
	"github.com/leafbus/leafbus/workerid"
)

// mysqlRegNode configures a dispenser that takes its worker ID from dsn's
// leaf_workerid_alloc as advertise, with its own embedded NATS and data dir.
func mysqlRegNode(dsn, node, advertise, dataDir string) func(*testConfig) {
	return func(c *testConfig) {
		c.NodeID = node
		c.DataDir = dataDir
		c.WorkerRegistry = "mysql"
		c.MySQLDSN = dsn
		c.MySQLCreateTable = true
		c.Advertise = advertise
	}
}

// mysqlRegRow reads ip_port's row: its id and max_timestamp.
func mysqlRegRow(t *testing.T, db *sql.DB, ipPort string) (id, maxTS int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := db.QueryRowContext(ctx, "SELECT id, COALESCE(max_timestamp, 0) FROM leaf_workerid_alloc WHERE ip_port = ?", ipPort).Scan(&id, &maxTS)
	if err != nil {
		t.Fatalf("read the leaf_workerid_alloc row of %s: %v", ipPort, err)
	}
	return id, maxTS
}

// TestMySQLWorkerRegistry: a dispenser gets its worker ID from its leaf_workerid_alloc
// row, records its timestamps there, keeps the ID across a restart and starts past its
// record; a second dispenser gets another ID and their IDs never collide; a third
// started with the second's --advertise is refused.
func TestMySQLWorkerRegistry(t *testing.T) {
	dsn := testenv.MariaDB(t).NewDatabase(t)
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	seen := map[int64]string{}
	dirA := t.TempDir()

	a := startDispenser(t, mysqlRegNode(dsn, "mysql-a", "127.0.0.1:7001", dirA))
	wa, _ := takeSnowflakes(t, a, seen, "a", 1000)
	rowID, recorded := mysqlRegRow(t, db, "127.0.0.1:7001")
	if rowID != wa {
		t.Fatalf("dispenser a issues with worker ID %d, its leaf_workerid_alloc row has id %d", wa, rowID)
	}
	if recorded == 0 {
		t.Fatalf("max_timestamp of a's row is 0: the first heartbeat should have recorded a timestamp before serving")
	}

	b := startDispenser(t, mysqlRegNode(dsn, "mysql-b", "127.0.0.1:7002", t.TempDir()))
	wb, _ := takeSnowflakes(t, b, seen, "b", 1000)
	if wb == wa {
		t.Fatalf("dispensers a and b both have worker ID %d", wa)
	}
	if rowID, _ := mysqlRegRow(t, db, "127.0.0.1:7002"); rowID != wb {
		t.Fatalf("dispenser b issues with worker ID %d, its row has id %d", wb, rowID)
	}

	// A clean stop records the highest timestamp a issued.
	_, lastA := takeSnowflakes(t, a, seen, "a", 1000)
	if err := a.stop(); err != nil {
		t.Fatalf("stop a: %v", err)
	}
	if _, recorded := mysqlRegRow(t, db, "127.0.0.1:7001"); recorded < lastA {
		t.Fatalf("after a stopped, max_timestamp = %d, below the last timestamp it issued (%d)", recorded, lastA)
	}

	// Restarted with the same identity, a keeps its ID and never repeats an ID.
	a2 := startDispenser(t, mysqlRegNode(dsn, "mysql-a", "127.0.0.1:7001", dirA))
	if w, _ := takeSnowflakes(t, a2, seen, "a restarted", 1000); w != wa {
		t.Fatalf("after a restart a has worker ID %d, want %d (its row's)", w, wa)
	}
	takeSnowflakes(t, b, seen, "b", 1000)

	// A third process with b's identity must not run as b's worker ID.
	err = startErr(t, mysqlRegNode(dsn, "mysql-c", "127.0.0.1:7002", t.TempDir()))
	if !errors.Is(err, workerid.ErrIdentityInUse) {
		t.Fatalf("start with b's --advertise while b runs = %v, want ErrIdentityInUse", err)
	}
}
