package segment

import (
	"database/sql"
	"fmt"
	"testing"

	"github.com/go-sql-driver/mysql"

	"github.com/leafbus/leafbus/testenv"
)

// TestStoreIdentity checks Identity on the real stores: the same store seen by two
// dispensers says the same, another database or bucket says something else, and a
// MySQL store names the server as the server names itself.
func TestStoreIdentity(t *testing.T) {
	t.Parallel()
	t.Run("kv", func(t *testing.T) {
		srv := testenv.StartNATS(t)
		a, b := openKV(t, srv, "leaf_segments"), openKV(t, srv, "leaf_segments")
		other := openKV(t, srv, "other_segments")
		if got, want := a.Identity(), "kv leaf_segments"; got != want {
			t.Errorf("Identity() = %q, want %q", got, want)
		}
		if a.Identity() != b.Identity() {
			t.Errorf("two stores on one bucket: %q and %q", a.Identity(), b.Identity())
		}
		if got, want := other.Identity(), "kv other_segments"; got != want {
			t.Errorf("Identity() = %q, want %q", got, want)
		}
	})
	t.Run("mysql", func(t *testing.T) {
		srv := testenv.MariaDB(t)
		dsn, otherDSN := srv.NewDatabase(t), srv.NewDatabase(t)
		a, b, other := openMySQL(t, dsn), openMySQL(t, dsn), openMySQL(t, otherDSN)

		// What the server calls itself (MariaDB: no @@server_uuid).
		db, err := sql.Open("mysql", dsn)
		if err != nil {
			t.Fatal(err)
		}
		defer db.Close()
		var (
			host string
			port int
		)
		if err := db.QueryRowContext(testCtx(t), "SELECT @@hostname, @@port").Scan(&host, &port); err != nil {
			t.Fatalf("ask the server: %v", err)
		}
		dc, err := mysql.ParseDSN(dsn)
		if err != nil {
			t.Fatal(err)
		}
		if got, want := a.Identity(), fmt.Sprintf("mysql %s:%d/%s", host, port, dc.DBName); got != want {
			t.Errorf("Identity() = %q, want %q", got, want)
		}
		if a.Identity() != b.Identity() {
			t.Errorf("two stores on one database: %q and %q", a.Identity(), b.Identity())
		}
		if other.Identity() == a.Identity() {
			t.Errorf("stores on two databases both say %q", a.Identity())
		}
	})
}
