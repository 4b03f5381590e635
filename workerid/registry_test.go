package workerid

import (
	"os"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/leafbus/leafbus/testenv"
)

// TestRegistryIdentity: every registry says which one it is, in the forms Identifier
// documents, each against its real server.
func TestRegistryIdentity(t *testing.T) {
	t.Run("Static", func(t *testing.T) {
		r, err := NewStaticRegistryInRange(7, fullRange(DefaultMaxWorkerID))
		must(t, "NewStaticRegistryInRange", err)
		if got := r.Identity(); got != "static" {
			t.Fatalf("Identity() = %q, want %q", got, "static")
		}
	})
	t.Run("KV", func(t *testing.T) {
		env := startJS(t)
		for prefix, want := range map[string]string{"leaf": "kv leaf_leases", "dc2": "kv dc2_leases"} {
			r := openKVRegistry(t, env.js, kvConfig("n1", func(c *KVRegistryConfig) { c.Prefix = prefix }))
			if got := r.Identity(); got != want {
				t.Errorf("prefix %s: Identity() = %q, want %q", prefix, got, want)
			}
		}
	})
	t.Run("ZK", func(t *testing.T) {
		srv := testenv.ZooKeeper(t)
		name := zkTestName(t, srv, srv.Connect(t))
		leaf := openZK(t, zkConfig(srv.Servers(), name, "10.0.0.5:8080"))
		if got, want := leaf.Identity(), "zk /snowflake/"+name; got != want {
			t.Errorf("Leaf's layout: Identity() = %q, want %q", got, want)
		}
		recycle := openZK(t, zkConfig(srv.Servers(), name, "10.0.0.6:8080", zkRecycle(8*time.Second)))
		if got, want := recycle.Identity(), "zk /snowflake/"+name+" (recycle)"; got != want {
			t.Errorf("recycle mode: Identity() = %q, want %q", got, want)
		}
	})
	t.Run("MySQL", func(t *testing.T) {
		dsn := testenv.MariaDB(t).NewDatabase(t)
		cfg, err := mysql.ParseDSN(dsn)
		must(t, "ParseDSN", err)
		host, err := os.Hostname()
		must(t, "Hostname", err)
		_, port, _ := strings.Cut(cfg.Addr, ":")
		want := "mysql " + host + ":" + port + "/" + cfg.DBName + ".leaf_workerid_alloc"
		// The same server under another name is the same registry: the server names
		// itself (@@hostname is this machine's name, where testenv runs it).
		alias := cfg.Clone()
		alias.Addr = "localhost:" + port
		for _, d := range []string{dsn, alias.FormatDSN()} {
			r := openMySQLRegistry(t, d, "10.0.0.5:8080", DefaultMaxWorkerID)
			if got := r.Identity(); got != want {
				t.Errorf("DSN address %s: Identity() = %q, want %q", strings.Split(strings.Split(d, "(")[1], ")")[0], got, want)
			}
		}
	})
}
