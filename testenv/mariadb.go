package testenv

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
)

// MariaDBServer is one mariadbd bound to 127.0.0.1 on a random port, logged in to as
// root without a password, with its data in a temp dir. Get the binary's shared one
// with MariaDB, or a private one for fault tests with StartMariaDB.
type MariaDBServer struct {
	tb     testing.TB // fails Start of a private instance; nil for the shared one
	shared bool
	paths  mariaDBPaths
	dir    string // data/, mariadbd.sock, mariadbd.log
	port   int    // fixed after the first start, so Restart keeps the address

	mu   sync.Mutex
	proc *proc // nil while stopped

	dbSeq atomic.Int64
}

// mariaDBPaths says where MariaDB's programs are. Tests point it at missing files to
// check the message a missing install gives.
type mariaDBPaths struct {
	mariadbd  string
	installDB string
}

// debianMariaDBPaths are where Debian's mariadb-server package puts them (/usr/sbin is
// often not on a non-root PATH, so no PATH lookup).
func debianMariaDBPaths() mariaDBPaths {
	return mariaDBPaths{mariadbd: "/usr/sbin/mariadbd", installDB: "/usr/bin/mariadb-install-db"}
}

func (p mariaDBPaths) check() error {
	var missing []string
	for _, f := range []string{p.mariadbd, p.installDB} {
		if _, err := os.Stat(f); err != nil {
			missing = append(missing, f)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("%s: %w", strings.Join(missing, ", "), errMissing)
	}
	return nil
}

// mariaDBOptions follow mariadbd's and mariadb-install-db's fixed arguments. Most trade
// durability against an OS crash for speed, which a throwaway server can afford.
// innodb_flush_log_at_trx_commit is 2, not 0: with 2 every commit reaches the OS at
// once, so a test that SIGKILLs mariadbd (Kill) finds every committed row after Start,
// as production would after a crash; with 0 the last second is lost and a segment store
// could hand out a range twice for a reason production never has. --no-defaults also
// drops Debian's utf8mb4 default, so it is set here, as production servers have it.
var mariaDBOptions = []string{
	"--character-set-server=utf8mb4",
	"--max-connections=500", // tests with many pools share one server
	"--skip-log-bin",
	"--performance-schema=OFF",
	"--innodb-buffer-pool-size=16M",
	"--innodb-log-file-size=4M",
	"--innodb-flush-log-at-trx-commit=2",
	"--skip-innodb-doublewrite",
	"--innodb-flush-method=nosync",
	"--innodb-temp-data-file-path=ibtmp1:1M:autoextend",
	"--skip-name-resolve",
}

const (
	// mariaDBReadyTimeout bounds one start; a warm start takes well under a second.
	mariaDBReadyTimeout = 30 * time.Second
	// startAttempts bounds the retries after losing a port race.
	startAttempts = 5
)

// MariaDB returns the test binary's shared server, starting it on first use. Every test
// of the binary gets the same server, so isolate with NewDatabase and never stop it
// (Stop, Start, Restart and Kill panic on it); use StartMariaDB for fault tests. It is
// stopped by Main, or dies with the binary.
func MariaDB(tb testing.TB) *MariaDBServer {
	tb.Helper()
	return env.maria.get(tb, "MariaDB", func() (*MariaDBServer, error) { return newMariaDB(debianMariaDBPaths(), true) })
}

// StartMariaDB starts a private server for tb, stopped and removed at tb's cleanup.
func StartMariaDB(tb testing.TB) *MariaDBServer {
	tb.Helper()
	return startMariaDB(tb, debianMariaDBPaths())
}

func startMariaDB(tb testing.TB, paths mariaDBPaths) *MariaDBServer {
	tb.Helper()
	return startPrivate(tb, "MariaDB", func() (*MariaDBServer, error) {
		m, err := newMariaDB(paths, false)
		if err == nil {
			m.tb = tb
		}
		return m, err
	})
}

func newMariaDB(paths mariaDBPaths, shared bool) (*MariaDBServer, error) {
	if err := paths.check(); err != nil {
		return nil, err
	}
	tpl, err := env.mariaDBTemplate(paths)
	if err != nil {
		return nil, err
	}
	dir, err := newDir("mdb")
	if err != nil {
		return nil, err
	}
	m := &MariaDBServer{shared: shared, paths: paths, dir: dir}
	if err := m.populate(tpl); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	if err := m.launch(true); err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return m, nil
}

// mariaDBTemplate runs mariadb-install-db once per binary (about 1.5 s); each server
// then starts from a copy of its result (about 0.03 s).
func (e *environment) mariaDBTemplate(paths mariaDBPaths) (string, error) {
	e.mariaTplMu.Lock()
	defer e.mariaTplMu.Unlock()
	if e.mariaTemplate != "" || e.mariaTplErr != nil {
		return filepath.Join(e.mariaTemplate, "data"), e.mariaTplErr
	}
	dir, err := newDir("mdbtpl")
	if err != nil {
		e.mariaTplErr = err
		return "", err
	}
	if err := os.Mkdir(filepath.Join(dir, "tmp"), 0o700); err != nil {
		os.RemoveAll(dir)
		e.mariaTplErr = fmt.Errorf("make MariaDB template: %w", err)
		return "", e.mariaTplErr
	}
	args := []string{
		"--no-defaults", // first, or /etc/mysql/my.cnf applies
		"--datadir=" + filepath.Join(dir, "data"),
		"--tmpdir=" + filepath.Join(dir, "tmp"), // see MariaDBServer.tmpDir
		// Lets root log in over TCP without a password.
		"--auth-root-authentication-method=normal",
		"--skip-test-db",
	}
	// The same InnoDB sizes as the server, so that its first start resizes nothing.
	args = append(args, mariaDBOptions...)
	p, err := startProc(paths.installDB, args, dir, filepath.Join(dir, "install.log"))
	if err == nil {
		select {
		case <-p.done:
			if p.waitErr != nil {
				err = fmt.Errorf("%s: %w\n%s", paths.installDB, p.waitErr, p.tail())
			}
		case <-time.After(2 * time.Minute):
			err = fmt.Errorf("%s did not finish in 2m\n%s", paths.installDB, p.tail())
			p.kill()
		}
	}
	if err != nil {
		os.RemoveAll(dir)
		e.mariaTplErr = fmt.Errorf("make MariaDB template: %w", err)
		return "", e.mariaTplErr
	}
	e.mariaTemplate = dir
	return filepath.Join(dir, "data"), nil
}

func (m *MariaDBServer) dataDir() string { return filepath.Join(m.dir, "data") }

// populate fills the server's directory: a copy of the template tpl as its data dir, and
// its tmpdir.
func (m *MariaDBServer) populate(tpl string) error {
	if err := copyDir(tpl, m.dataDir()); err != nil {
		return fmt.Errorf("copy MariaDB template %s: %w", tpl, err)
	}
	if err := os.Mkdir(m.tmpDir(), 0o700); err != nil {
		return fmt.Errorf("MariaDB tmpdir: %w", err)
	}
	return nil
}

// tmpDir is the server's own --tmpdir. Left at /tmp, shared by every server and
// mariadb-install-db of the machine, a server that starts removes the "#sql" files it
// finds there, which are other servers' temporary tables: 5 of 24 template builds run
// eight at a time failed ("Unknown table 'mysql.tmp_user_sys'"), and make test at -p 4
// lost a test binary's whole MariaDB to it. With one each: 0 of 24.
func (m *MariaDBServer) tmpDir() string { return filepath.Join(m.dir, "tmp") }

func (m *MariaDBServer) args() []string {
	a := []string{
		"--no-defaults", // first, or /etc/mysql/my.cnf applies
		"--datadir=" + m.dataDir(),
		"--tmpdir=" + m.tmpDir(),
		"--socket=" + filepath.Join(m.dir, "mariadbd.sock"),
		"--pid-file=" + filepath.Join(m.dir, "mariadbd.pid"),
		"--port=" + strconv.Itoa(m.port),
		"--bind-address=127.0.0.1",
	}
	if os.Geteuid() == 0 {
		a = append(a, "--user=root") // mariadbd refuses to run as root otherwise
	}
	return append(a, mariaDBOptions...)
}

// launch starts mariadbd and waits until it answers. With newPort it picks a port and
// moves to another one when a concurrent process took it first; otherwise (Start after
// Stop) it keeps the port clients know and retries it a few times.
func (m *MariaDBServer) launch(newPort bool) error {
	for attempt := 1; ; attempt++ {
		if newPort {
			port, err := FreePort()
			if err != nil {
				return err
			}
			m.port = port
		}
		p, err := startProc(m.paths.mariadbd, m.args(), m.dir, filepath.Join(m.dir, "mariadbd.log"))
		if err != nil {
			return err
		}
		err = m.waitReady(p)
		if err == nil {
			m.proc = p
			return nil
		}
		if kerr := p.kill(); kerr != nil {
			return errors.Join(err, kerr)
		}
		if !errors.Is(err, errAddrInUse) || attempt == startAttempts {
			return err
		}
		if !newPort {
			time.Sleep(250 * time.Millisecond)
		}
	}
}

// waitReady polls until SELECT 1 works over TCP on our port, and checks that the server
// answering is this one: after a lost port race another test binary's mariadbd may be
// the one listening there.
func (m *MariaDBServer) waitReady(p *proc) error {
	db := m.open("", time.Second)
	defer db.Close()
	deadline := time.Now().Add(mariaDBReadyTimeout)
	var last error
	for {
		exited := p.exited()
		if strings.Contains(p.output(), "Address already in use") {
			return fmt.Errorf("mariadbd port %d: %w", m.port, errAddrInUse)
		}
		if exited {
			return fmt.Errorf("mariadbd on port %d: %w (%v)\n%s", m.port, errExited, p.waitErr, p.tail())
		}
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		var datadir string
		last = db.QueryRowContext(ctx, "SELECT @@datadir").Scan(&datadir)
		cancel()
		if last == nil {
			if filepath.Clean(datadir) == m.dataDir() {
				return nil
			}
			last = fmt.Errorf("port %d is served by another mariadbd (datadir %s)", m.port, datadir)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("mariadbd on port %d: %w (%v): %v\n%s", m.port, errNotReady, mariaDBReadyTimeout, last, p.tail())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// config is the driver configuration for database as root, with parseTime.
func (m *MariaDBServer) config(database string) *mysql.Config {
	c := mysql.NewConfig()
	c.User = "root"
	c.Net = "tcp"
	c.Addr = m.Addr()
	c.DBName = database
	c.ParseTime = true
	return c
}

// open returns a handle for testenv's own statements: a short dial timeout and a quiet
// driver logger, so a stopped server fails fast without noise.
func (m *MariaDBServer) open(database string, dial time.Duration) *sql.DB {
	c := m.config(database)
	c.Timeout = dial
	c.ReadTimeout = 10 * time.Second
	c.WriteTimeout = 10 * time.Second
	c.Logger = &mysql.NopLogger{}
	conn, err := mysql.NewConnector(c)
	if err != nil {
		// NewConnector only fails on an invalid config, and this one is built above.
		panic(fmt.Sprintf("testenv: mysql connector: %v", err))
	}
	return sql.OpenDB(conn)
}

// Addr is the server's TCP address, 127.0.0.1:port; it stays the same across restarts.
func (m *MariaDBServer) Addr() string {
	return "127.0.0.1:" + strconv.Itoa(m.port)
}

// DSN is a go-sql-driver DSN for database (empty for none) as root, with parseTime=true.
func (m *MariaDBServer) DSN(database string) string {
	return m.config(database).FormatDSN()
}

// NewDatabase creates a database with a name no other test of this server gets and
// returns its DSN. The database is dropped at tb's cleanup; a stopped server is ignored
// then.
func (m *MariaDBServer) NewDatabase(tb testing.TB) string {
	tb.Helper()
	db := m.open("", 5*time.Second)
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for {
		name := "t" + strconv.FormatInt(m.dbSeq.Add(1), 10)
		_, err := db.ExecContext(ctx, "CREATE DATABASE `"+name+"`")
		var myErr *mysql.MySQLError
		if errors.As(err, &myErr) && myErr.Number == 1007 { // ER_DB_CREATE_EXISTS: a test made it by hand
			continue
		}
		if err != nil {
			tb.Fatalf("testenv: CREATE DATABASE %s on %s: %v", name, m.Addr(), err)
		}
		tb.Cleanup(func() { m.dropDatabase(name) })
		return m.DSN(name)
	}
}

func (m *MariaDBServer) dropDatabase(name string) {
	db := m.open("", 2*time.Second)
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	_, _ = db.ExecContext(ctx, "DROP DATABASE IF EXISTS `"+name+"`")
}

// Freeze makes the server hang instead of refusing: it stops the process (SIGSTOP) and
// returns once every thread of it is stopped, so that from then on no request is
// answered, not even one already on its way. thaw (SIGCONT) lets it carry on; it also
// runs at cleanup, and calling it again does nothing. Panics on the shared server.
func (m *MariaDBServer) Freeze() (thaw func()) {
	m.mustBePrivate("Freeze")
	m.mu.Lock()
	p := m.proc
	m.mu.Unlock()
	if p == nil {
		m.tb.Fatalf("testenv: freeze MariaDB on %s: not running", m.Addr())
	}
	var once sync.Once
	thaw = func() {
		once.Do(func() {
			if err := p.thaw(); err != nil {
				m.tb.Errorf("testenv: thaw MariaDB on %s: %v", m.Addr(), err)
			}
		})
	}
	m.tb.Cleanup(thaw)
	if err := p.freeze(); err != nil {
		m.tb.Fatalf("testenv: freeze MariaDB on %s: %v", m.Addr(), err)
	}
	return thaw
}

// OpenDB opens a database/sql handle on dsn (from NewDatabase or DSN), for a test's own
// statements, with a 2s dial timeout so that a stopped server fails fast and the
// driver's connection noise silenced; it is closed at tb's cleanup.
func OpenDB(tb testing.TB, dsn string) *sql.DB {
	tb.Helper()
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		tb.Fatalf("testenv: OpenDB: parse DSN %q: %v", dsn, err)
	}
	cfg.Timeout = 2 * time.Second
	cfg.Logger = &mysql.NopLogger{}
	conn, err := mysql.NewConnector(cfg)
	if err != nil {
		tb.Fatalf("testenv: OpenDB: %v", err)
	}
	db := sql.OpenDB(conn)
	tb.Cleanup(func() { db.Close() })
	return db
}

// PID is the server's process id while it runs, 0 while stopped. Fault tests may signal
// it; Freeze is the way to make it hang.
func (m *MariaDBServer) PID() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.proc == nil {
		return 0
	}
	return m.proc.pid()
}

// Stop shuts the server down (SIGTERM, then SIGKILL after 10 s) and waits until the
// process is gone. Safe to call twice. Panics on the shared server.
func (m *MariaDBServer) Stop() {
	m.mustBePrivate("Stop")
	if err := m.halt(); err != nil {
		m.tb.Fatalf("testenv: stop MariaDB on %s: %v", m.Addr(), err)
	}
}

// Kill ends the server with SIGKILL, as a crash would; Start then runs InnoDB's crash
// recovery, and every committed transaction is still there. Panics on the shared server.
func (m *MariaDBServer) Kill() {
	m.mustBePrivate("Kill")
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.proc == nil {
		return
	}
	if err := m.proc.kill(); err != nil {
		m.tb.Fatalf("testenv: kill MariaDB on %s: %v", m.Addr(), err)
	}
	m.proc = nil
}

// Start starts a stopped server again on the same port with the same data. It does
// nothing when the server runs. Panics on the shared server.
func (m *MariaDBServer) Start() {
	m.mustBePrivate("Start")
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.proc != nil {
		return
	}
	if err := m.launch(false); err != nil {
		m.tb.Fatalf("testenv: restart MariaDB on %s: %v", m.Addr(), err)
	}
}

// Restart is Stop followed by Start.
func (m *MariaDBServer) Restart() {
	m.Stop()
	m.Start()
}

func (m *MariaDBServer) mustBePrivate(op string) {
	if m.shared {
		panic("testenv: " + op + " on the shared MariaDB server; use StartMariaDB for a server a test may stop")
	}
}

// removeDir removes the server's directory (data, socket, log); it must be halted.
func (m *MariaDBServer) removeDir() { os.RemoveAll(m.dir) }

// halt stops the server whether shared or not.
func (m *MariaDBServer) halt() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.proc == nil {
		return nil
	}
	err := m.proc.stop(stopGrace)
	m.proc = nil
	return err
}
