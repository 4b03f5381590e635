package workerid

import (
	"strings"
	"testing"

	"github.com/go-sql-driver/mysql"

	"github.com/leafbus/leafbus/testenv"
)

// TestRegistryIdentity checks each registry's Identity against a real backend: what a
// deployment record compares, so two dispensers on one backend must say the same and
// two on different ones must not.
func TestRegistryIdentity(t *testing.T) {
	t.Parallel()
	t.Run("static", func(t *testing.T) {
		r, err := NewStaticRegistry(3, DefaultMaxWorkerID)
		must(t, "NewStaticRegistry", err)
		if got := r.Identity(); got != "static" {
			t.Errorf("Identity() = %q, want %q", got, "static")
		}
	})
	t.Run("kv", func(t *testing.T) {
		env := startJS(t)
		a := openKVRegistry(t, env.js, kvConfig("a"))
		b := openKVRegistry(t, env.js, kvConfig("b", func(c *KVRegistryConfig) { c.Prefix = "other" }))
		if got, want := a.Identity(), "kv leaf_leases"; got != want {
			t.Errorf("Identity() = %q, want %q", got, want)
		}
		if got, want := b.Identity(), "kv other_leases"; got != want {
			t.Errorf("Identity() with prefix other = %q, want %q", got, want)
		}
	})
	t.Run("zk", func(t *testing.T) {
		srv := testenv.ZooKeeper(t)
		conn := srv.Connect(t)
		name := zkTestName(t, srv, conn)
		leaf := openZK(t, zkConfig(srv.Servers(), name, "10.0.0.5:8080"))
		recycle := openZK(t, zkConfig(srv.Servers(), name, "10.0.0.6:8080", zkRecycle(DefaultLeaseTTL)))
		other := openZK(t, zkConfig(srv.Servers(), name+"-other", "10.0.0.5:8080"))
		want := "zk /snowflake/" + name
		if got := leaf.Identity(); got != want {
			t.Errorf("Identity() = %q, want %q", got, want)
		}
		if got := recycle.Identity(); got != want {
			t.Errorf("Identity() in recycle mode = %q, want %q (one path, one space of worker IDs)", got, want)
		}
		if got := other.Identity(); got != want+"-other" {
			t.Errorf("Identity() under another name = %q, want %q", got, want+"-other")
		}
	})
	t.Run("mysql", func(t *testing.T) {
		dsn := testenv.MariaDB(t).NewDatabase(t)
		dc, err := mysql.ParseDSN(dsn)
		must(t, "ParseDSN", err)
		r := openMySQLRegistry(t, dsn, "10.0.0.5:8080", DefaultMaxWorkerID)
		want := "mysql " + dc.Addr + "/" + dc.DBName + ".leaf_workerid_alloc"
		if got := r.Identity(); got != want {
			t.Errorf("Identity() = %q, want %q", got, want)
		}
		if strings.Contains(r.Identity(), dc.Passwd) && dc.Passwd != "" {
			t.Errorf("Identity() = %q holds the DSN's password", r.Identity())
		}
	})
}
