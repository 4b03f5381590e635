package workerid

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"database/sql/driver"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/leafbus/leafbus/internal/mysqldsn"
)

// MySQLRegistrySchema creates the improved Leaf fork's worker-ID table (its
// leaf_workerid_alloc.sql), column for column, so a table the fork created is used as it
// is and a fork node's row keeps its worker ID here. The id is the worker ID.
const MySQLRegistrySchema = "CREATE TABLE IF NOT EXISTS leaf_workerid_alloc (\n" +
	"  id            BIGINT       NOT NULL AUTO_INCREMENT,\n" +
	"  ip            VARCHAR(127) DEFAULT NULL,\n" +
	"  port          VARCHAR(127) DEFAULT NULL,\n" +
	"  ip_port       VARCHAR(127) NOT NULL,\n" +
	"  max_timestamp BIGINT       DEFAULT NULL,\n" +
	"  gmt_create    TIMESTAMP    NULL DEFAULT NULL,\n" +
	"  gmt_modified  TIMESTAMP    NULL DEFAULT NULL ON UPDATE CURRENT_TIMESTAMP,\n" +
	"  PRIMARY KEY (id),\n" +
	"  UNIQUE KEY idx_ip_port (ip_port)\n" +
	") ENGINE=InnoDB"

// ErrIdentityInUse is returned by Acquire when another running process registered under
// the same ip:port (--advertise) already holds its worker ID: two processes sharing one
// identity would issue IDs with the same worker ID.
var ErrIdentityInUse = errors.New("another process runs under this identity")

// MySQL error numbers the registry tells apart.
const (
	mysqlErrDupEntry     = 1062 // ER_DUP_ENTRY
	mysqlErrNoSuchTable  = 1146 // ER_NO_SUCH_TABLE
	mysqlLockNameMaxLen  = 64   // MariaDB's limit on GET_LOCK names
	mysqlClaimAttempts   = 4
	identityLockWaitSecs = 2

	// Driver timeouts a DSN that sets none gets: they back up the callers' contexts, and
	// end a dial or a read stuck on a server that hangs (a frozen host, a dropped route)
	// instead of refusing, so that no registry call can outlive them. The I/O bound stays
	// well above the longest wait the registry asks the server for (GET_LOCK's).
	mysqlRegistryDialTimeout = 5 * time.Second
	mysqlRegistryIOTimeout   = 10 * time.Second
)

// MySQLRegistryConfig configures a MySQLRegistry. Start from DefaultMySQLRegistryConfig.
type MySQLRegistryConfig struct {
	// DSN is a go-sql-driver DSN naming the database that holds leaf_workerid_alloc,
	// e.g. user:pass@tcp(db:3306)/leaf. Required.
	DSN string
	// Advertise is this node's identity, ip:port (Leaf's): its row's ip_port. A node
	// keeps its worker ID as long as it keeps this value. Required.
	Advertise string
	// MinWorkerID and MaxWorkerID bound the worker IDs this registry uses
	// (--worker-id-min, --worker-id-max): 0 and the highest the snowflake layout holds
	// (1023) by default. A row whose id lies outside is refused (mysql_range.go).
	MinWorkerID int64
	MaxWorkerID int64
	// CreateTable runs MySQLRegistrySchema at open (--mysql-create-table), with the
	// table's AUTO_INCREMENT starting at MinWorkerID when that is above 0.
	CreateTable bool
	// Logger; nil discards. The driver's own messages go to it at debug level.
	Logger *slog.Logger
}

// DefaultMySQLRegistryConfig returns the defaults: worker IDs 0..1023, the table left as
// it is. DSN and Advertise are left for the caller.
func DefaultMySQLRegistryConfig() MySQLRegistryConfig {
	return MySQLRegistryConfig{MaxWorkerID: DefaultMaxWorkerID}
}

// maxIPPortLen is the width of leaf_workerid_alloc.ip_port.
const maxIPPortLen = 127

// Validate reports the first setting that is missing or out of range, naming the field,
// its value and the bound; errors wrap ErrInvalidConfig.
func (c MySQLRegistryConfig) Validate() error {
	const component = "MySQL registry"
	if c.DSN == "" {
		return invalid(component, "DSN is empty, want user:pass@tcp(host:port)/database")
	}
	if _, err := mysql.ParseDSN(c.DSN); err != nil {
		return errBadDSN(component)
	}
	host, port, err := net.SplitHostPort(c.Advertise)
	if err != nil || host == "" || port == "" {
		return invalid(component, "Advertise %q is not ip:port", c.Advertise)
	}
	if len(c.Advertise) > maxIPPortLen {
		return invalid(component, "Advertise %q has %d characters, more than the ip_port column holds (%d)", c.Advertise, len(c.Advertise), maxIPPortLen)
	}
	return c.workerRange().check(component)
}

// workerRange is MinWorkerID..MaxWorkerID.
func (c MySQLRegistryConfig) workerRange() Range {
	return Range{Min: c.MinWorkerID, Max: c.MaxWorkerID}
}

// MySQLRegistry hands out permanent worker IDs from the leaf_workerid_alloc table, the
// improved Leaf fork's "mysql mode": one row per ip:port, its auto-increment id the
// worker ID, its max_timestamp the highest timestamp the node recorded.
//
// How it differs from the fork, and why:
//   - The ID comes from AUTO_INCREMENT and nothing else. InnoDB does not hand out an
//     auto-increment value twice (MariaDB 10.2.4+ and MySQL 8.0 persist the counter
//     across restarts; older servers recompute MAX(id)+1 at start, so there deleting
//     the newest row can free its ID), so an ID whose row was deleted is not given to a
//     node that would not know the timestamps it used. The price: once the counter
//     passes MaxWorkerID, new nodes are refused (ErrNoWorkerID) until an operator gives
//     them a free ID by hand; the message says how.
//   - An ID above MaxWorkerID is refused, never folded into range.
//   - The row is found before anything is inserted, so a restart burns no
//     auto-increment value; concurrent first starts of different nodes get distinct IDs
//     from AUTO_INCREMENT, and the unique ip_port key settles a race of one identity.
//   - A table row cannot say whether its node is alive, so each lease holds a MySQL named
//     lock (GET_LOCK) for its ip:port on a connection of its own: the server frees it
//     when that connection ends, like a ZooKeeper ephemeral node. A second process with
//     the same --advertise is refused (ErrIdentityInUse) instead of issuing IDs with the
//     same worker ID, and a holder that finds its lock taken after losing its connection
//     stops (ErrLeaseLost).
//   - The start-up check against max_timestamp is not done here: Lease.Recorded returns
//     it and Guard.Start refuses a clock behind it, never swallowing the failure.
//
// MySQL down at start is an error from OpenMySQLRegistry or Acquire: unlike the
// ZooKeeper registry there is no cache-file fallback, so the dispenser refuses to start,
// which is safe. Named locks are not replicated: after a fail-over to another server
// each lease takes its lock again there at the next Renew.
type MySQLRegistry struct {
	cfg      MySQLRegistryConfig
	db       *sql.DB
	ip, port string
	lockName string
	identity string // Identity(): the server's own name for itself, asked at open

	mu        sync.Mutex
	leases    map[*mysqlLease]struct{} // open leases, whose lock connections Close ends
	closed    bool
	closeOnce sync.Once
}

var (
	_ Registry   = (*MySQLRegistry)(nil)
	_ Identifier = (*MySQLRegistry)(nil)
)

// Identity is "mysql <host>:<port>/<schema>.leaf_workerid_alloc", with the host name
// and port the server reports (@@hostname, @@port) and the DSN's schema: one server
// reached under two names (a DNS alias, an IP) is one registry.
func (r *MySQLRegistry) Identity() string { return r.identity }

// OpenMySQLRegistry validates cfg, connects (failing when MySQL cannot be reached before
// ctx ends), creates the table with cfg.CreateTable, and checks that the table exists.
func OpenMySQLRegistry(ctx context.Context, cfg MySQLRegistryConfig) (*MySQLRegistry, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	dc, err := mysql.ParseDSN(cfg.DSN)
	if err != nil {
		return nil, errBadDSN("MySQL registry")
	}
	dc.Logger = mysqlDriverLogger{cfg.Logger}
	mysqldsn.DefaultTimeouts(dc, mysqlRegistryDialTimeout, mysqlRegistryIOTimeout)
	conn, err := mysql.NewConnector(dc)
	if err != nil {
		return nil, errBadDSN("MySQL registry")
	}
	db := sql.OpenDB(conn)
	ip, port, _ := net.SplitHostPort(cfg.Advertise) // checked by Validate
	r := &MySQLRegistry{cfg: cfg, db: db, ip: ip, port: port, leases: map[*mysqlLease]struct{}{}}
	if err := r.prepare(ctx); err != nil {
		db.Close()
		return nil, err
	}
	return r, nil
}

// errBadDSN is the error for a DSN the driver cannot parse. It never wraps the driver's
// error: that quotes parts of the DSN (a parameter's value, say), which may hold the
// password.
func errBadDSN(component string) error {
	return fmt.Errorf("%w: %s: the DSN does not parse (want user:pass@tcp(host:3306)/database)", ErrInvalidConfig, component)
}

// prepare checks the connection and the table, and names the identity lock.
func (r *MySQLRegistry) prepare(ctx context.Context) error {
	var dbName, host sql.NullString
	var port sql.NullInt64
	if err := r.db.QueryRowContext(ctx, "SELECT DATABASE(), @@hostname, @@port").Scan(&dbName, &host, &port); err != nil {
		return fmt.Errorf("MySQL registry: connect: %w", err)
	}
	if !dbName.Valid || dbName.String == "" {
		return fmt.Errorf("%w: MySQL registry: the DSN names no database (want user:pass@tcp(host:port)/database)", ErrInvalidConfig)
	}
	r.identity = fmt.Sprintf("mysql %s/%s.leaf_workerid_alloc", net.JoinHostPort(host.String, strconv.FormatInt(port.Int64, 10)), dbName.String)
	r.lockName = identityLockName(dbName.String, r.cfg.Advertise)
	if r.cfg.CreateTable {
		if _, err := r.db.ExecContext(ctx, r.schema()); err != nil {
			return fmt.Errorf("MySQL registry: create table leaf_workerid_alloc: %w", err)
		}
	}
	rows, err := r.db.QueryContext(ctx, "SELECT id, ip_port, max_timestamp FROM leaf_workerid_alloc LIMIT 0")
	if err != nil {
		return r.tableErr("check table leaf_workerid_alloc", err)
	}
	return rows.Close()
}

// identityLockName is the GET_LOCK name for an identity. Named locks are server-wide, so
// the database is part of the name: two deployments (or tests) sharing one server do not
// block each other. A name too long for the server is replaced by its hash.
func identityLockName(database, advertise string) string {
	name := "leafbus.workerid:" + database + "/" + advertise
	if len(name) <= mysqlLockNameMaxLen {
		return name
	}
	sum := sha256.Sum256([]byte(database + "/" + advertise))
	return "leafbus.workerid:" + hex.EncodeToString(sum[:])[:40]
}

// tableErr gives a missing table a message that says how to create it.
func (r *MySQLRegistry) tableErr(what string, err error) error {
	var me *mysql.MySQLError
	if errors.As(err, &me) && me.Number == mysqlErrNoSuchTable {
		return fmt.Errorf("MySQL registry: %s: table leaf_workerid_alloc does not exist: create it with --mysql-create-table or run MySQLRegistrySchema: %w", what, err)
	}
	return fmt.Errorf("MySQL registry: %s: %w", what, err)
}

// Close ends the lock connections of leases still open (freeing their identities) and
// closes the connection pool. Leases fail afterwards.
func (r *MySQLRegistry) Close() {
	r.closeOnce.Do(func() {
		r.mu.Lock()
		r.closed = true
		leases := r.leases
		r.leases = nil
		r.mu.Unlock()
		for l := range leases {
			l.mu.Lock()
			l.dropLock()
			l.released = true
			l.mu.Unlock()
		}
		r.db.Close()
	})
}

// Acquire takes this node's identity lock, then finds the node's row by ip_port or
// inserts it. Recorded is the row's max_timestamp (0 for a new row). Errors wrap
// ErrIdentityInUse when another process holds the identity, ErrNoWorkerID when a new
// row's id is above MaxWorkerID (the range is used up) and ErrWorkerIDOutOfRange when the
// row's id is outside MinWorkerID..MaxWorkerID otherwise.
func (r *MySQLRegistry) Acquire(ctx context.Context) (Lease, error) {
	lock, err := r.lockIdentity(ctx)
	if err != nil {
		return nil, err
	}
	id, recorded, inserted, err := r.claimRow(ctx)
	if err == nil {
		err = r.checkRow(ctx, id, inserted)
	}
	if err != nil {
		discardConn(lock)
		return nil, err
	}
	l := &mysqlLease{reg: r, id: id, recorded: recorded, lock: lock}
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		discardConn(lock)
		return nil, errors.New("MySQL registry: closed")
	}
	r.leases[l] = struct{}{}
	r.mu.Unlock()
	r.cfg.Logger.Info("worker ID from MySQL", "worker_id", id, "ip_port", r.cfg.Advertise,
		"recorded", recorded, "recorded_time", fmtMs(recorded), "lock", r.lockName)
	return l, nil
}

// lockIdentity takes the identity's named lock on a connection of its own, waiting a
// moment so that a process that just ended has had its connection closed by the server.
func (r *MySQLRegistry) lockIdentity(ctx context.Context) (*sql.Conn, error) {
	conn, err := r.db.Conn(ctx)
	if err != nil {
		return nil, fmt.Errorf("MySQL registry: connect: %w", err)
	}
	var got sql.NullInt64
	err = conn.QueryRowContext(ctx, "SELECT GET_LOCK(?, ?)", r.lockName, identityLockWaitSecs).Scan(&got)
	switch {
	case err != nil:
		discardConn(conn)
		return nil, fmt.Errorf("MySQL registry: lock identity %s: %w", r.cfg.Advertise, err)
	case !got.Valid || got.Int64 != 1:
		holder := r.lockHolder(ctx)
		discardConn(conn)
		return nil, fmt.Errorf("%w: another process registered as %s is running (MySQL connection %s holds the lock %q): give each dispenser its own --advertise ip:port",
			ErrIdentityInUse, r.cfg.Advertise, holder, r.lockName)
	}
	return conn, nil
}

// lockHolder names the connection holding the identity lock, for messages.
func (r *MySQLRegistry) lockHolder(ctx context.Context) string {
	var id sql.NullInt64
	if err := r.db.QueryRowContext(ctx, "SELECT IS_USED_LOCK(?)", r.lockName).Scan(&id); err != nil || !id.Valid {
		return "(unknown)"
	}
	return fmt.Sprint(id.Int64)
}

// claimRow returns the id and max_timestamp of this node's row, inserting it when there
// is none (inserted). Reading first keeps restarts from burning auto-increment values; a
// duplicate ip_port on insert means another process (a Leaf fork node, which takes no
// lock) inserted it meanwhile, so it is read again.
func (r *MySQLRegistry) claimRow(ctx context.Context) (id, recorded int64, inserted bool, err error) {
	for attempt := 0; attempt < mysqlClaimAttempts; attempt++ {
		err := r.db.QueryRowContext(ctx,
			"SELECT id, COALESCE(max_timestamp, 0) FROM leaf_workerid_alloc WHERE ip_port = ?", r.cfg.Advertise).
			Scan(&id, &recorded)
		if err == nil {
			return id, recorded, false, nil
		}
		if !errors.Is(err, sql.ErrNoRows) {
			return 0, 0, false, r.tableErr("read the row of "+r.cfg.Advertise, err)
		}
		res, err := r.db.ExecContext(ctx,
			"INSERT INTO leaf_workerid_alloc (ip, port, ip_port, max_timestamp, gmt_create, gmt_modified) VALUES (?, ?, ?, 0, NOW(), NOW())",
			r.ip, r.port, r.cfg.Advertise)
		var me *mysql.MySQLError
		if errors.As(err, &me) && me.Number == mysqlErrDupEntry {
			continue
		}
		if err != nil {
			return 0, 0, false, r.tableErr("insert the row of "+r.cfg.Advertise, err)
		}
		if id, err = res.LastInsertId(); err != nil {
			return 0, 0, false, fmt.Errorf("MySQL registry: insert the row of %s: %w", r.cfg.Advertise, err)
		}
		return id, 0, true, nil
	}
	return 0, 0, false, fmt.Errorf("MySQL registry: the row of %s kept appearing and vanishing in leaf_workerid_alloc", r.cfg.Advertise)
}

// mysqlLease is a node's permanent worker ID from leaf_workerid_alloc.
type mysqlLease struct {
	reg      *MySQLRegistry
	id       int64
	recorded int64

	mu       sync.Mutex
	lock     *sql.Conn // holds the identity lock; nil after it was lost
	released bool
}

var _ Lease = (*mysqlLease)(nil)

func (l *mysqlLease) WorkerID() int64    { return l.id }
func (l *mysqlLease) Recorded() int64    { return l.recorded }
func (l *mysqlLease) TTL() time.Duration { return 0 }

// Renew makes sure this process still holds its identity (taking the lock again after
// its connection was lost), then raises the row's max_timestamp to ts. It returns
// ErrLeaseLost when another process took the identity or the row is gone.
func (l *mysqlLease) Renew(ctx context.Context, ts int64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.released {
		return fmt.Errorf("renew worker ID %d: lease already released", l.id)
	}
	if err := l.holdLock(ctx); err != nil {
		return err
	}
	return l.record(ctx, ts)
}

// Release records ts and frees the identity; the worker ID stays this ip:port's.
func (l *mysqlLease) Release(ctx context.Context, ts int64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.released {
		return nil
	}
	if err := l.record(ctx, ts); err != nil {
		return err
	}
	l.released = true
	l.dropLock()
	l.reg.mu.Lock()
	delete(l.reg.leases, l)
	l.reg.mu.Unlock()
	l.reg.cfg.Logger.Info("released worker ID", "worker_id", l.id, "recorded", ts, "recorded_time", fmtMs(ts))
	return nil
}

// record raises max_timestamp to ts; it never lowers it.
func (l *mysqlLease) record(ctx context.Context, ts int64) error {
	r := l.reg
	res, err := r.db.ExecContext(ctx,
		"UPDATE leaf_workerid_alloc SET max_timestamp = GREATEST(COALESCE(max_timestamp, 0), ?), gmt_modified = NOW() WHERE id = ? AND ip_port = ?",
		ts, l.id, r.cfg.Advertise)
	if err != nil {
		return fmt.Errorf("record %s for worker ID %d in leaf_workerid_alloc: %w", fmtMs(ts), l.id, err)
	}
	if n, err := res.RowsAffected(); err == nil && n > 0 {
		return nil
	}
	// Nothing changed: the same values in the same second, or the row is gone. Look.
	var found int
	err = r.db.QueryRowContext(ctx, "SELECT COUNT(*) FROM leaf_workerid_alloc WHERE id = ? AND ip_port = ?", l.id, r.cfg.Advertise).Scan(&found)
	if err != nil {
		return fmt.Errorf("record %s for worker ID %d in leaf_workerid_alloc: %w", fmtMs(ts), l.id, err)
	}
	if found == 0 {
		return fmt.Errorf("%w: the row of %s with worker ID %d is gone from leaf_workerid_alloc (deleted, or its id changed)", ErrLeaseLost, r.cfg.Advertise, l.id)
	}
	return nil
}

// holdLock checks the identity lock's connection and takes the lock again when that
// connection was lost (a MySQL restart or a network cut frees it). Finding it held by
// someone else means another process runs under this identity now: ErrLeaseLost.
func (l *mysqlLease) holdLock(ctx context.Context) error {
	r := l.reg
	if l.lock != nil {
		var mine sql.NullInt64
		err := l.lock.QueryRowContext(ctx, "SELECT IS_USED_LOCK(?) = CONNECTION_ID()", r.lockName).Scan(&mine)
		if err == nil && mine.Valid && mine.Int64 == 1 {
			return nil
		}
		if err != nil {
			r.cfg.Logger.Warn("identity lock connection lost; taking the lock again", "lock", r.lockName, "err", err)
		}
		l.dropLock()
	}
	conn, err := r.db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("take identity lock %q again: %w", r.lockName, err)
	}
	var got sql.NullInt64
	if err := conn.QueryRowContext(ctx, "SELECT GET_LOCK(?, 0)", r.lockName).Scan(&got); err != nil {
		discardConn(conn)
		return fmt.Errorf("take identity lock %q again: %w", r.lockName, err)
	}
	if !got.Valid || got.Int64 != 1 {
		discardConn(conn)
		return fmt.Errorf("%w: while this node's MySQL connection was down, another process registered as %s took the identity lock %q, and with it worker ID %d",
			ErrLeaseLost, r.cfg.Advertise, r.lockName, l.id)
	}
	l.lock = conn
	r.cfg.Logger.Info("identity lock taken again", "lock", r.lockName, "worker_id", l.id)
	return nil
}

// dropLock ends the lock connection, which frees the lock on the server. Best effort:
// a broken connection has freed it already.
func (l *mysqlLease) dropLock() {
	if l.lock == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	_, _ = l.lock.ExecContext(ctx, "DO RELEASE_LOCK(?)", l.reg.lockName)
	discardConn(l.lock)
	l.lock = nil
}

// discardConn closes conn's network connection instead of returning it to the pool, so
// a named lock it may still hold is freed by the server and never lingers on a pooled
// connection that other statements reuse. (Returning driver.ErrBadConn from Raw is how
// database/sql is told to throw a connection away.)
func discardConn(conn *sql.Conn) {
	_ = conn.Raw(func(any) error { return driver.ErrBadConn })
	conn.Close()
}

// mysqlDriverLogger sends go-sql-driver's messages (e.g. "closing bad idle connection")
// to slog at debug level instead of the standard logger.
type mysqlDriverLogger struct{ l *slog.Logger }

func (d mysqlDriverLogger) Print(v ...any) { d.l.Debug(fmt.Sprint(v...), "component", "mysql-driver") }
