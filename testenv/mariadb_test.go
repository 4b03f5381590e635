package testenv_test

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/leafbus/leafbus/internal/testutil"
	"github.com/leafbus/leafbus/testenv"
)

func mustExec(tb testing.TB, db *sql.DB, query string, args ...any) {
	tb.Helper()
	if _, err := db.ExecContext(testutil.Context(tb, 10*time.Second), query, args...); err != nil {
		tb.Fatalf("Exec(%q): %v", query, err)
	}
}

func TestMariaDBSharedAnswers(t *testing.T) {
	m := testenv.MariaDB(t)
	if again := testenv.MariaDB(t); again != m {
		t.Fatalf("MariaDB() returned a second server %s, want the shared %s", again.Addr(), m.Addr())
	}
	if !strings.HasPrefix(m.Addr(), "127.0.0.1:") {
		t.Errorf("Addr() = %q, want 127.0.0.1:port", m.Addr())
	}
	db := testenv.OpenDB(t, m.DSN(""))
	var version, charset string
	var now time.Time // parseTime=true is what lets DATETIME scan into time.Time
	if err := db.QueryRowContext(testutil.Context(t, 10*time.Second),
		"SELECT VERSION(), NOW(), @@character_set_server").Scan(&version, &now, &charset); err != nil {
		t.Fatalf("SELECT VERSION(), NOW(), @@character_set_server: %v", err)
	}
	if !strings.Contains(version, "MariaDB") {
		t.Errorf("VERSION() = %q, want a MariaDB version", version)
	}
	if charset != "utf8mb4" {
		t.Errorf("@@character_set_server = %q, want utf8mb4", charset)
	}
	t.Logf("server %s, version %s", m.Addr(), version)
}

func TestMariaDBDSN(t *testing.T) {
	m := testenv.MariaDB(t)
	want := "root@tcp(" + m.Addr() + ")/leaf?parseTime=true"
	if got := m.DSN("leaf"); got != want {
		t.Errorf("DSN(%q) = %q, want %q", "leaf", got, want)
	}
}

func TestMariaDBNewDatabaseIsolated(t *testing.T) {
	m := testenv.MariaDB(t)
	dsnA, dsnB := m.NewDatabase(t), m.NewDatabase(t)
	if dsnA == dsnB {
		t.Fatalf("NewDatabase twice gave the same DSN %q", dsnA)
	}
	a, b := testenv.OpenDB(t, dsnA), testenv.OpenDB(t, dsnB)
	mustExec(t, a, "CREATE TABLE leaf_alloc (biz_tag VARCHAR(128) PRIMARY KEY, max_id BIGINT NOT NULL)")
	mustExec(t, a, "INSERT INTO leaf_alloc VALUES ('t', 1000)")

	var n int
	err := b.QueryRowContext(testutil.Context(t, 10*time.Second), "SELECT COUNT(*) FROM leaf_alloc").Scan(&n)
	var myErr *mysql.MySQLError
	if !errors.As(err, &myErr) || myErr.Number != 1146 { // ER_NO_SUCH_TABLE
		t.Fatalf("SELECT in the second database: err = %v, want error 1146 (no such table)", err)
	}
	mustExec(t, b, "CREATE TABLE leaf_alloc (biz_tag VARCHAR(128) PRIMARY KEY, max_id BIGINT NOT NULL)")
	if err := b.QueryRowContext(testutil.Context(t, 10*time.Second), "SELECT COUNT(*) FROM leaf_alloc").Scan(&n); err != nil || n != 0 {
		t.Fatalf("rows in the second database's leaf_alloc = %d, %v; want 0, nil", n, err)
	}
}

func TestMariaDBNewDatabaseDroppedAtCleanup(t *testing.T) {
	m := testenv.MariaDB(t)
	var name string
	t.Run("OK", func(t *testing.T) {
		cfg, err := mysql.ParseDSN(m.NewDatabase(t))
		if err != nil {
			t.Fatal(err)
		}
		name = cfg.DBName
	})
	db := testenv.OpenDB(t, m.DSN(""))
	var n int
	if err := db.QueryRowContext(testutil.Context(t, 10*time.Second),
		"SELECT COUNT(*) FROM information_schema.SCHEMATA WHERE SCHEMA_NAME = ?", name).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if n != 0 {
		t.Errorf("database %q still exists after its test ended", name)
	}
}

func TestMariaDBSharedRefusesStop(t *testing.T) {
	m := testenv.MariaDB(t)
	defer func() {
		r := recover()
		if s, _ := r.(string); !strings.Contains(s, "StartMariaDB") {
			t.Errorf("Stop on the shared server: recovered %v, want a panic pointing at StartMariaDB", r)
		}
	}()
	m.Stop()
}

func TestMariaDBPrivateStopStartKeepsData(t *testing.T) {
	m := testenv.StartMariaDB(t)
	if shared := testenv.MariaDB(t); shared == m || shared.Addr() == m.Addr() {
		t.Fatalf("StartMariaDB gave the shared server %s", m.Addr())
	}
	addr := m.Addr()
	db := testenv.OpenDB(t, m.NewDatabase(t))
	mustExec(t, db, "CREATE TABLE leaf_alloc (biz_tag VARCHAR(128) PRIMARY KEY, max_id BIGINT NOT NULL)")
	mustExec(t, db, "INSERT INTO leaf_alloc VALUES ('t', 1000)")

	wantMaxID := int64(1000)
	tests := []struct {
		name    string
		stop    func()
		next    int64 // max_id written before the stop
		stopped bool
	}{
		{name: "Stop", stop: m.Stop, next: 2000, stopped: true},
		{name: "Kill", stop: m.Kill, next: 3000, stopped: true},
		{name: "Restart", stop: m.Restart, next: 4000},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			mustExec(t, db, "UPDATE leaf_alloc SET max_id = ? WHERE biz_tag = 't'", tt.next)
			wantMaxID = tt.next
			tt.stop()
			if tt.stopped {
				if pid := m.PID(); pid != 0 {
					t.Errorf("PID() after %s = %d, want 0", tt.name, pid)
				}
				err := db.QueryRowContext(testutil.Context(t, 10*time.Second), "SELECT 1").Scan(new(int))
				if err == nil {
					t.Fatalf("SELECT 1 after %s succeeded, want an error", tt.name)
				}
				m.Start()
			}
			if m.Addr() != addr {
				t.Errorf("Addr() after %s = %s, want %s", tt.name, m.Addr(), addr)
			}
			var got int64
			// The pool's old connections died with the server; database/sql retries on a
			// fresh one.
			if err := db.QueryRowContext(testutil.Context(t, 10*time.Second), "SELECT max_id FROM leaf_alloc WHERE biz_tag = 't'").Scan(&got); err != nil {
				t.Fatalf("SELECT after %s and Start: %v", tt.name, err)
			}
			if got != wantMaxID {
				t.Errorf("max_id after %s = %d, want %d (committed before the stop)", tt.name, got, wantMaxID)
			}
		})
	}
}

// TestMariaDBFreeze: a frozen server answers nothing, so a query ends at its context's
// deadline, not earlier and not with an answer; thawed, it answers on the same pool.
func TestMariaDBFreeze(t *testing.T) {
	m := testenv.StartMariaDB(t)
	db := testenv.OpenDB(t, m.DSN(""))
	if err := db.QueryRowContext(testutil.Context(t, 10*time.Second), "SELECT 1").Scan(new(int)); err != nil {
		t.Fatalf("SELECT 1 before Freeze: %v", err)
	}
	thaw := m.Freeze()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	// The deadline, not a time taken after the timer started (that read 297ms once).
	deadline, _ := ctx.Deadline()
	err := db.QueryRowContext(ctx, "SELECT 1").Scan(new(int))
	if early := time.Until(deadline); !errors.Is(err, context.DeadlineExceeded) || early > 0 {
		t.Fatalf("SELECT 1 on a frozen server = %v %v before its deadline, want %v at it", err, early, context.DeadlineExceeded)
	}
	thaw()
	thaw() // twice: nothing more
	if err := db.QueryRowContext(testutil.Context(t, 10*time.Second), "SELECT 1").Scan(new(int)); err != nil {
		t.Fatalf("SELECT 1 after thaw: %v", err)
	}
}
