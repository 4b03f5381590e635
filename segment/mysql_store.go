package segment

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/leafbus/leafbus/internal/mysqldsn"
	"github.com/leafbus/leafbus/wire"
)

// MySQLSchema is Leaf's leaf_alloc table exactly as PROTOCOL.md gives it ("Segment store
// compatibility (MySQL)"), with IF NOT EXISTS so that running it twice is harmless.
// `dispenser schema` prints it; MySQLConfig.CreateTable runs it. Do not change a column:
// a running Leaf shares these rows.
const MySQLSchema = "CREATE TABLE IF NOT EXISTS `leaf_alloc` (\n" +
	"  `biz_tag` varchar(128) NOT NULL DEFAULT '',\n" +
	"  `max_id` bigint(20) NOT NULL DEFAULT '1',\n" +
	"  `step` int(11) NOT NULL,\n" +
	"  `description` varchar(256) DEFAULT NULL,\n" +
	"  `update_time` timestamp NOT NULL DEFAULT CURRENT_TIMESTAMP ON UPDATE CURRENT_TIMESTAMP,\n" +
	"  PRIMARY KEY (`biz_tag`)\n" +
	") ENGINE=InnoDB;\n"

// ErrNoLeafAlloc is returned by OpenMySQLStore when the database has no usable leaf_alloc
// table (missing, or missing a column): run `dispenser schema` against it, or start with
// --mysql-create-table.
var ErrNoLeafAlloc = errors.New("no leaf_alloc table")

// Defaults of MySQLConfig.
const (
	// DefaultMySQLMaxOpenConns bounds the pool. A dispenser talks to MySQL only to take a
	// segment (about once per SegmentDuration per tag, in bursts when many tags start or
	// turn over together) and to list tags once a minute; each call holds a connection
	// for about a millisecond, so 8 connections carry thousands of Takes a second, while
	// dozens of dispensers stay far below MySQL's default max_connections (151).
	DefaultMySQLMaxOpenConns = 8
	// DefaultMySQLQueryTimeout bounds one call (a whole transaction): a Take is a few
	// round trips, so 3s only ever ends a hung server or a lost network, and stays below
	// the generator's LoadTimeout (5s) so that the store's own error, which says what
	// hung, is the one logged.
	DefaultMySQLQueryTimeout = 3 * time.Second
)

// Connection lifetimes. Connections live at most 5 minutes, far below MySQL's default
// wait_timeout (8h) and the idle cut-off of proxies and load balancers in between, and
// short enough that a fail-over to a new primary behind the same name is picked up;
// idle ones go after a minute, so a quiet dispenser holds few connections.
const (
	mysqlConnMaxLifetime = 5 * time.Minute
	mysqlConnMaxIdleTime = time.Minute
)

// MySQL error numbers the store maps to sentinels.
const (
	mysqlErrDupEntry       = 1062 // ER_DUP_ENTRY: AddTag of an existing biz_tag
	mysqlErrBadField       = 1054 // ER_BAD_FIELD_ERROR: leaf_alloc lacks a column
	mysqlErrNoSuchTable    = 1146 // ER_NO_SUCH_TABLE
	mysqlErrDataOutOfRange = 1690 // ER_DATA_OUT_OF_RANGE: max_id + step past BIGINT
	mysqlErrUnknownSysVar  = 1193 // ER_UNKNOWN_SYSTEM_VARIABLE: @@server_uuid on MariaDB
	mysqlErrCollationMix   = 1267 // ER_CANT_AGGREGATE_2COLLATIONS: a tag a utf8mb3 biz_tag cannot compare
	mysqlErrBadString      = 1366 // ER_TRUNCATED_WRONG_VALUE_FOR_FIELD: ... nor hold

	// Refusals of this user (ErrStoreDenied).
	mysqlErrDBAccessDenied     = 1044 // ER_DBACCESS_DENIED_ERROR: no privilege on the database
	mysqlErrAccessDenied       = 1045 // ER_ACCESS_DENIED_ERROR: user or password refused
	mysqlErrTableAccessDenied  = 1142 // ER_TABLEACCESS_DENIED_ERROR: "INSERT command denied ... for table"
	mysqlErrColumnAccessDenied = 1143 // ER_COLUMNACCESS_DENIED_ERROR
	mysqlErrSpecificDenied     = 1227 // ER_SPECIFIC_ACCESS_DENIED_ERROR
)

// MySQLConfig configures OpenMySQLStore.
type MySQLConfig struct {
	// DSN is a go-sql-driver DSN naming the database that holds leaf_alloc, e.g.
	// user:pass@tcp(db:3306)/leaf. OpenMySQLStore overrides four settings on purpose:
	// parseTime=true and loc=UTC with the session time_zone '+00:00', so update_time
	// reads back as the instant MySQL stored whatever the server's zone;
	// interpolateParams=false, so a tag always reaches the server as a bound parameter
	// and never as SQL text. Dial, read and write timeouts left unset in the DSN default
	// to QueryTimeout (dial) and twice QueryTimeout (I/O), so that no call can hang on a
	// dead peer.
	DSN string

	// CreateTable runs MySQLSchema at open (CREATE TABLE IF NOT EXISTS).
	CreateTable bool

	// MaxOpenConns bounds the connection pool (idle connections are kept up to the same
	// number). 0: DefaultMySQLMaxOpenConns.
	MaxOpenConns int

	// QueryTimeout bounds each store call, a whole transaction. 0:
	// DefaultMySQLQueryTimeout.
	QueryTimeout time.Duration

	// Logger receives the driver's own messages (broken connections). nil: discard.
	Logger *slog.Logger
}

// MySQLStore is a Store over Leaf's leaf_alloc table, so that dispensers can take over
// from, or run beside, a Leaf deployment on the same rows. A segment is taken as Leaf
// takes it: UPDATE max_id = max_id + step and SELECT the row in one transaction; the
// UPDATE's row lock orders every taker (Leaf nodes, other dispensers, this one's
// connections), so no two are granted the same range. Safe for concurrent use.
//
// biz_tag compares with the table's collation, case-insensitively by default, as in
// Leaf: "Orders" and "orders" name one row, so AddTag of one refuses the other. A tag
// is its row's stored bytes: Tag, Take and UpdateTag of a name that the collation
// equates with a row stored under another spelling ("Orders", "orders " or "ördérs"
// for the row "orders") refuse it with ErrTagSpelling, naming the row, and change
// nothing, so nothing downstream ever keys a rule by a second spelling.
type MySQLStore struct {
	db       *sql.DB
	timeout  time.Duration
	where    string // database, host and user for error messages; never the password
	database string // of the DSN, for the GRANT a refusal names
	user     string
	ident    string // Identity, asked of the server at open
}

var (
	_ Store      = (*MySQLStore)(nil)
	_ Identifier = (*MySQLStore)(nil)
)

// The statements. Only values are parameters: the table and column names are fixed.
const (
	mysqlSelectAll   = "SELECT biz_tag, max_id, step, description, update_time FROM leaf_alloc"
	mysqlSelectRow   = mysqlSelectAll + " WHERE biz_tag = ?"
	mysqlProbe       = mysqlSelectAll + " LIMIT 0"
	mysqlTakeStored  = "UPDATE leaf_alloc SET max_id = max_id + step WHERE biz_tag = ?"
	mysqlTakeCustom  = "UPDATE leaf_alloc SET max_id = max_id + ? WHERE biz_tag = ?"
	mysqlInsert      = "INSERT INTO leaf_alloc (biz_tag, max_id, step, description) VALUES (?, ?, ?, ?)"
	mysqlUpdateStep  = "UPDATE leaf_alloc SET step = ? WHERE biz_tag = ?"
	mysqlUpdateDescr = "UPDATE leaf_alloc SET description = ? WHERE biz_tag = ?"
	mysqlLockRow     = "SELECT biz_tag, max_id FROM leaf_alloc WHERE biz_tag = ? FOR UPDATE"
	mysqlUpdateMaxID = "UPDATE leaf_alloc SET max_id = ? WHERE biz_tag = ?"
)

// OpenMySQLStore connects to cfg.DSN, checks that the server answers and that leaf_alloc
// is there (creating it first with CreateTable), and returns the store. Errors name the
// host, database and user, never the password; a missing table wraps ErrNoLeafAlloc.
func OpenMySQLStore(ctx context.Context, cfg MySQLConfig) (*MySQLStore, error) {
	dc, timeout, err := mysqlDriverConfig(cfg)
	if err != nil {
		return nil, err
	}
	connector, err := mysql.NewConnector(dc)
	if err != nil {
		return nil, fmt.Errorf("segment: mysql store: %w", err)
	}
	maxOpen := cfg.MaxOpenConns
	if maxOpen == 0 {
		maxOpen = DefaultMySQLMaxOpenConns
	}
	db := sql.OpenDB(connector)
	db.SetMaxOpenConns(maxOpen)
	db.SetMaxIdleConns(maxOpen) // a burst of loads should not reconnect each time
	db.SetConnMaxLifetime(mysqlConnMaxLifetime)
	db.SetConnMaxIdleTime(mysqlConnMaxIdleTime)
	s := &MySQLStore{
		db:       db,
		timeout:  timeout,
		where:    fmt.Sprintf("database %q on %s as user %q", dc.DBName, dc.Addr, dc.User),
		database: dc.DBName,
		user:     dc.User,
	}
	if err := s.check(ctx, cfg.CreateTable); err != nil {
		db.Close()
		return nil, err
	}
	return s, nil
}

// mysqlDriverConfig parses and completes the DSN (see MySQLConfig.DSN).
func mysqlDriverConfig(cfg MySQLConfig) (*mysql.Config, time.Duration, error) {
	if cfg.MaxOpenConns < 0 {
		return nil, 0, fmt.Errorf("segment: mysql store: MaxOpenConns %d must be 0 (default %d) or more", cfg.MaxOpenConns, DefaultMySQLMaxOpenConns)
	}
	if cfg.QueryTimeout < 0 {
		return nil, 0, fmt.Errorf("segment: mysql store: QueryTimeout %v must be 0 (default %v) or more", cfg.QueryTimeout, DefaultMySQLQueryTimeout)
	}
	if cfg.DSN == "" {
		return nil, 0, errors.New("segment: mysql store: the DSN is empty (want user:pass@tcp(host:3306)/database)")
	}
	dc, err := mysql.ParseDSN(cfg.DSN)
	if err != nil {
		// The driver's message may quote the DSN, password included: keep it out.
		return nil, 0, errors.New("segment: mysql store: the DSN does not parse (want user:pass@tcp(host:3306)/database)")
	}
	if dc.DBName == "" {
		return nil, 0, fmt.Errorf("segment: mysql store: the DSN for %s names no database (want .../database)", dc.Addr)
	}
	timeout := cfg.QueryTimeout
	if timeout == 0 {
		timeout = DefaultMySQLQueryTimeout
	}
	dc.ParseTime = true
	dc.Loc = time.UTC
	if dc.Params == nil {
		dc.Params = make(map[string]string)
	}
	dc.Params["time_zone"] = "'+00:00'"
	dc.InterpolateParams = false
	mysqldsn.DefaultTimeouts(dc, timeout, 2*timeout)
	logger := cfg.Logger
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	dc.Logger = driverLogger{logger}
	return dc, timeout, nil
}

// driverLogger sends go-sql-driver's messages to slog.
type driverLogger struct{ log *slog.Logger }

func (l driverLogger) Print(v ...any) {
	l.log.Warn("segment: mysql driver: " + strings.TrimSpace(fmt.Sprint(v...)))
}

// check pings the server, creates the table when asked, and reads zero rows of every
// column the store uses, so that a missing or different table fails at start.
func (s *MySQLStore) check(ctx context.Context, create bool) error {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	if err := s.db.PingContext(ctx); err != nil {
		return fmt.Errorf("segment: mysql store: cannot reach %s: %w", s.where, err)
	}
	if create {
		if _, err := s.db.ExecContext(ctx, MySQLSchema); err != nil {
			return fmt.Errorf("segment: mysql store: create leaf_alloc in %s: %w", s.where, s.denied(err, "CREATE", "to create it (--mysql-create-table)"))
		}
	}
	rows, err := s.db.QueryContext(ctx, mysqlProbe)
	if err == nil {
		err = rows.Close()
	}
	if err != nil {
		if n := mysqlErrNumber(err); n == mysqlErrNoSuchTable || n == mysqlErrBadField {
			return fmt.Errorf("segment: mysql store: %w in %s (run `dispenser schema` against it, or start with --mysql-create-table): %w", ErrNoLeafAlloc, s.where, err)
		}
		return fmt.Errorf("segment: mysql store: read leaf_alloc in %s: %w", s.where, s.denied(err, "SELECT", "to read the tags"))
	}
	if s.ident, err = s.askIdentity(ctx); err != nil {
		return fmt.Errorf("segment: mysql store: ask %s which server it is: %w", s.where, err)
	}
	return nil
}

// askIdentity asks the server which server and database it is (Identity): the
// server's own name for itself, not the address in the DSN, which differs between
// dispensers that reach one server by different names and can be the same for two
// servers behind one name. MySQL 5.6+ has @@server_uuid; MariaDB has none, so there it
// is @@hostname:@@port.
func (s *MySQLStore) askIdentity(ctx context.Context) (string, error) {
	var (
		server string
		db     sql.NullString
	)
	err := s.db.QueryRowContext(ctx, "SELECT @@server_uuid, DATABASE()").Scan(&server, &db)
	if mysqlErrNumber(err) == mysqlErrUnknownSysVar {
		var (
			host string
			port int
		)
		err = s.db.QueryRowContext(ctx, "SELECT @@hostname, @@port, DATABASE()").Scan(&host, &port, &db)
		server = fmt.Sprintf("%s:%d", host, port)
	}
	if err != nil {
		return "", err
	}
	return "mysql " + server + "/" + db.String, nil
}

// Identity implements Identifier: "mysql <server>/<database>", as the server named
// itself when the store opened.
func (s *MySQLStore) Identity() string { return s.ident }

// Close closes the connection pool.
func (s *MySQLStore) Close() error {
	return s.db.Close()
}

// Take implements Store.
func (s *MySQLStore) Take(ctx context.Context, tag string, step int64) (Tag, error) {
	if err := checkTake(tag, step); err != nil {
		return Tag{}, err
	}
	return s.take(ctx, tag, step)
}

// take is Take without the name check. Tests call it with hostile names to show that a
// name only ever travels as a bound parameter.
func (s *MySQLStore) take(ctx context.Context, tag string, step int64) (Tag, error) {
	var t Tag
	err := s.inTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		var err error
		if step == 0 {
			_, err = tx.ExecContext(ctx, mysqlTakeStored, tag)
		} else {
			_, err = tx.ExecContext(ctx, mysqlTakeCustom, step, tag)
		}
		if mysqlErrNumber(err) == mysqlErrDataOutOfRange {
			what := "the stored step"
			if step != 0 {
				what = fmt.Sprintf("step %d", step)
			}
			return fmt.Errorf("tag %q: max_id + %s: %w (%w)", tag, what, ErrMaxIDOverflow, err)
		}
		if err != nil {
			return err
		}
		// Rows affected is no test of existence (without CLIENT_FOUND_ROWS a row whose
		// stored step is 0 is matched but not changed): the SELECT is.
		if t, err = scanRow(tx.QueryRowContext(ctx, mysqlSelectRow, tag)); err != nil {
			return err
		}
		if err := CheckSpelling(tag, t.Name); err != nil {
			return err // rolled back: the row of another spelling keeps its max_id
		}
		used := step
		if used == 0 {
			used = t.Step
		}
		if used < 1 || used > MaxStoredStep {
			// A hand-edited row: granting [max_id-step, max_id) would repeat or skip
			// wildly. Rolled back; not ErrInvalidTag, which callers answer with 400.
			return fmt.Errorf("tag %q: stored step %d is outside 1..%d", tag, used, MaxStoredStep)
		}
		return nil
	})
	if errors.Is(err, ErrTagSpelling) {
		return Tag{}, err
	}
	if e := unstorableTag(tag, err); e != nil {
		return Tag{}, e
	}
	if err != nil {
		return Tag{}, fmt.Errorf("segment: mysql take: %w", s.denied(err, "UPDATE", "to take segments"))
	}
	return t, nil
}

// Tag implements Store.
func (s *MySQLStore) Tag(ctx context.Context, tag string) (Tag, error) {
	if err := CheckTagName(tag); err != nil {
		return Tag{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	t, err := scanRow(s.db.QueryRowContext(ctx, mysqlSelectRow, tag))
	if e := unstorableTag(tag, err); e != nil {
		return Tag{}, e
	}
	if err != nil {
		return Tag{}, fmt.Errorf("segment: mysql tag: %w", s.denied(err, "SELECT", "to read the tags"))
	}
	if err := CheckSpelling(tag, t.Name); err != nil {
		return Tag{}, err
	}
	return t, nil
}

// Tags implements Store. They are sorted here, by bytes as every store sorts, rather
// than by the column's case-insensitive collation.
func (s *MySQLStore) Tags(ctx context.Context) ([]Tag, error) {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	rows, err := s.db.QueryContext(ctx, mysqlSelectAll)
	if err != nil {
		return nil, fmt.Errorf("segment: mysql list tags: %w", s.denied(err, "SELECT", "to read the tags"))
	}
	defer rows.Close()
	list := []Tag{}
	for rows.Next() {
		t, err := scanRow(rows)
		if err != nil {
			return nil, fmt.Errorf("segment: mysql list tags: %w", err)
		}
		list = append(list, t)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("segment: mysql list tags: %w", err)
	}
	slices.SortFunc(list, func(a, b Tag) int { return strings.Compare(a.Name, b.Name) })
	return list, nil
}

// AddTag implements Store. An empty description is stored as NULL, the column's
// default.
func (s *MySQLStore) AddTag(ctx context.Context, t Tag) (Tag, error) {
	if t.MaxID == 0 {
		t.MaxID = 1
	}
	if err := t.Validate(); err != nil {
		return Tag{}, err
	}
	var added Tag
	err := s.inTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		descr := sql.NullString{String: t.Description, Valid: t.Description != ""}
		_, err := tx.ExecContext(ctx, mysqlInsert, t.Name, t.MaxID, t.Step, descr)
		if mysqlErrNumber(err) == mysqlErrDupEntry {
			// The collation may equate the name with a row of another spelling: say which.
			if row, rerr := scanRow(tx.QueryRowContext(ctx, mysqlSelectRow, t.Name)); rerr == nil && row.Name != t.Name {
				return fmt.Errorf("tag %q: %w: it is stored as %q", t.Name, ErrTagExists, row.Name)
			}
			return fmt.Errorf("tag %q: %w", t.Name, ErrTagExists)
		}
		if err != nil {
			return err
		}
		if added, err = scanRow(tx.QueryRowContext(ctx, mysqlSelectRow, t.Name)); err != nil {
			return err
		}
		// A column that cannot hold the name as given (a utf8mb3 table and a 4-byte
		// character, stored as "?") is refused, rolled back.
		return CheckSpelling(t.Name, added.Name)
	})
	if errors.Is(err, ErrTagSpelling) {
		return Tag{}, err
	}
	if e := unstorableTag(t.Name, err); e != nil {
		return Tag{}, e
	}
	if err != nil {
		return Tag{}, fmt.Errorf("segment: mysql add: %w", s.denied(err, "INSERT", "to add tags (dispenser tag add)"))
	}
	return added, nil
}

// UpdateTag implements Store. Each given field is one UPDATE, then the row is read back,
// all in one transaction; the read, not MySQL's rows-affected count (0 when the values
// were already so), says whether the tag exists. A new max_id is compared with the row
// read under its write lock (SELECT ... FOR UPDATE), so no Take, by this store or by a
// Leaf node, can move max_id between the check and the write.
func (s *MySQLStore) UpdateTag(ctx context.Context, u TagUpdate) (Tag, error) {
	if err := u.Validate(); err != nil {
		return Tag{}, err
	}
	var updated Tag
	err := s.inTx(ctx, func(ctx context.Context, tx *sql.Tx) error {
		// The row first, under its write lock: it must be there, and by this spelling.
		var (
			stored  string
			current int64
		)
		err := tx.QueryRowContext(ctx, mysqlLockRow, u.Name).Scan(&stored, &current)
		if errors.Is(err, sql.ErrNoRows) {
			return fmt.Errorf("tag %q: %w", u.Name, ErrTagNotFound)
		}
		if err != nil {
			return fmt.Errorf("lock tag %q: %w", u.Name, err)
		}
		if err := CheckSpelling(u.Name, stored); err != nil {
			return err
		}
		if u.MaxID != nil {
			if err := checkRaise(u.Name, current, *u.MaxID); err != nil {
				return err
			}
			if _, err := tx.ExecContext(ctx, mysqlUpdateMaxID, *u.MaxID, u.Name); err != nil {
				return err
			}
		}
		if u.Step != nil {
			if _, err := tx.ExecContext(ctx, mysqlUpdateStep, *u.Step, u.Name); err != nil {
				return err
			}
		}
		if u.Description != nil {
			descr := sql.NullString{String: *u.Description, Valid: *u.Description != ""}
			if _, err := tx.ExecContext(ctx, mysqlUpdateDescr, descr, u.Name); err != nil {
				return err
			}
		}
		updated, err = scanRow(tx.QueryRowContext(ctx, mysqlSelectRow, u.Name))
		return err
	})
	if errors.Is(err, ErrTagSpelling) {
		return Tag{}, err
	}
	if e := unstorableTag(u.Name, err); e != nil {
		return Tag{}, e
	}
	if err != nil {
		return Tag{}, fmt.Errorf("segment: mysql update: %w", s.denied(err, "UPDATE", "to update tags (dispenser tag update)"))
	}
	return updated, nil
}

// inTx runs f in a transaction bounded by the call timeout, and commits when f returns
// nil; f runs its statements with the ctx it is given, so the timeout ends a statement
// that hangs (the transaction's own ctx only rolls back once statements return).
// A commit that fails leaves it unknown whether the change landed; the caller gets the
// error and never uses the row, so at worst a range is lost (a gap), never repeated.
func (s *MySQLStore) inTx(ctx context.Context, f func(ctx context.Context, tx *sql.Tx) error) error {
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("begin on %s: %w", s.where, err)
	}
	if err := f(ctx, tx); err != nil {
		_ = tx.Rollback()
		return err
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("commit on %s: %w", s.where, err)
	}
	return nil
}

// rowScanner is *sql.Row or *sql.Rows.
type rowScanner interface {
	Scan(dest ...any) error
}

// scanRow reads one leaf_alloc row; no row is ErrTagNotFound.
func scanRow(r rowScanner) (Tag, error) {
	var (
		t     Tag
		descr sql.NullString
	)
	err := r.Scan(&t.Name, &t.MaxID, &t.Step, &descr, &t.UpdateTime)
	if errors.Is(err, sql.ErrNoRows) {
		return Tag{}, ErrTagNotFound
	}
	if err != nil {
		return Tag{}, fmt.Errorf("read leaf_alloc row: %w", err)
	}
	t.Description = descr.String
	t.UpdateTime = t.UpdateTime.UTC()
	return t, nil
}

// denied wraps err as ErrStoreDenied when MySQL refused it to this user, saying which
// privilege is missing (the one MySQL names, else need, the one the operation needs),
// what it is needed for, and the statement that grants it; any other error is returned
// as it is.
func (s *MySQLStore) denied(err error, need, purpose string) error {
	var me *mysql.MySQLError
	if !errors.As(err, &me) {
		return err
	}
	switch me.Number {
	case mysqlErrTableAccessDenied, mysqlErrColumnAccessDenied, mysqlErrDBAccessDenied, mysqlErrSpecificDenied:
		// "INSERT command denied to user 'leaf'@'10.0.0.7' for table `leaf`.`leaf_alloc`"
		if cmd, _, ok := strings.Cut(me.Message, " command denied"); ok && cmd != "" && !strings.ContainsAny(cmd, " '`") {
			need = cmd
		}
		return fmt.Errorf("%w: MySQL user %q lacks the %s privilege on leaf_alloc, which it needs %s: GRANT %s ON `%s`.`leaf_alloc` TO '%s'@'<its host>' (docs/operations.md#mysql-segments---segment-store-mysql): %w",
			ErrStoreDenied, s.user, need, purpose, need, s.database, s.user, err)
	case mysqlErrAccessDenied:
		return fmt.Errorf("%w: the MySQL server refuses user %q (its password in the DSN, or the host it connects from): %w", ErrStoreDenied, s.user, err)
	}
	return err
}

// unstorableTag is the ErrInvalidTag (a 400) of a tag that leaf_alloc's biz_tag column
// can neither compare nor hold, and nil for any other err: a utf8mb3 column (Leaf's
// DDL says DEFAULT CHARSET=utf8) and a character of 4 UTF-8 bytes, which MySQL refuses
// to compare ("Illegal mix of collations") or to store ("Incorrect string value"). No
// row can have that name, so it is a bad request, not a store failure to retry.
func unstorableTag(tag string, err error) error {
	var me *mysql.MySQLError
	if !errors.As(err, &me) {
		return nil
	}
	if me.Number == mysqlErrCollationMix || me.Number == mysqlErrBadString && strings.Contains(me.Message, "biz_tag") {
		return fmt.Errorf("%w: tag %s holds a character that leaf_alloc's biz_tag column cannot hold (its character set is not utf8mb4): %w", ErrInvalidTag, wire.Quote(tag), err)
	}
	return nil
}

// mysqlErrNumber is the MySQL error number in err's chain, or 0.
func mysqlErrNumber(err error) uint16 {
	var me *mysql.MySQLError
	if errors.As(err, &me) {
		return me.Number
	}
	return 0
}
