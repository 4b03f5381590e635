package dispenser

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/leafbus/leafbus/workerid"
)

// mysqlReachTimeout bounds one attempt of the start-up check that MySQL answers: dial,
// handshake and a ping. A database in reach answers in milliseconds; a wrong host, a
// firewall that drops packets, or a server that accepts and never speaks must end the
// attempt within seconds, not after the kernel's connect retries (minutes) or never.
const mysqlReachTimeout = 3 * time.Second

// usesMySQL reports whether the segment store or the worker registry is MySQL.
func (c Config) usesMySQL() bool {
	return c.SegmentStore == "mysql" || c.WorkerRegistry == "mysql"
}

// checkMySQL, with a MySQL store or registry, checks --mysql-dsn before anything else
// connects to it: that it parses, names a database, and reaches a server that answers
// within mysqlReachTimeout and lets this user in, so that a bad DSN or a server that
// refuses is one clear error at start rather than a store's or a registry's retries
// (both open with driver timeouts of their own, mysqldsn.DefaultTimeouts). A DSN that does not parse, and a server that refuses the user or the
// database, fail the start at once (a wait mends neither); a server out of reach is a
// dependency that may still be starting, waited for up to --start-timeout like the
// store and the registry (startwait.go), each attempt logged. Messages never show the
// password.
func (d *Dispenser) checkMySQL(ctx context.Context) error {
	if !d.cfg.usesMySQL() {
		return nil
	}
	dsn := d.cfg.MySQLDSN
	dc, err := mysql.ParseDSN(dsn)
	if err != nil {
		return badDSN("--mysql-dsn does not parse: %s (want user:password@tcp(host:3306)/database)", redactDSN(err.Error(), dsn))
	}
	if dc.DBName == "" {
		return badDSN("--mysql-dsn names no database for %s (want user:password@tcp(host:3306)/database)", dc.Addr)
	}
	where := fmt.Sprintf("database %q on %s as user %q", dc.DBName, dc.Addr, dc.User)
	if dc.Timeout == 0 || dc.Timeout > mysqlReachTimeout {
		dc.Timeout = mysqlReachTimeout
	}
	dc.ReadTimeout, dc.WriteTimeout = mysqlReachTimeout, mysqlReachTimeout
	dc.Logger = discardMySQLLog{}
	conn, err := mysql.NewConnector(dc)
	if err != nil {
		return badDSN("--mysql-dsn: %s", redactDSN(err.Error(), dsn))
	}
	db := sql.OpenDB(conn)
	defer db.Close()
	ctx, cancel := context.WithTimeout(ctx, mysqlReachTimeout)
	defer cancel()
	err = db.PingContext(ctx)
	var refused *mysql.MySQLError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &refused) && mysqlRefusals[refused.Number]:
		return badDSN("--mysql-dsn: %s refused: %s", where, redactDSN(err.Error(), dsn))
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, mysql.ErrInvalidConn):
		// A handshake cut short by the read timeout or the context says only "invalid
		// connection".
		err = fmt.Errorf("no MySQL answer within %v (is it MySQL listening there?): %w", mysqlReachTimeout, err)
	}
	return fmt.Errorf("--mysql-dsn: cannot reach %s: %s", where, redactDSN(err.Error(), dsn))
}

// mysqlRefusals are the server's answers that no wait changes: wrong user or password
// (1045; 1698 without a password), no access to the database (1044), no such database
// (1049), no privilege on a table, column or routine (1142, 1143, 1370) or for an
// operation (1227), a password that must be changed (1820, 1862), a locked account
// (3118 in MySQL, 4151 in MariaDB).
var mysqlRefusals = map[uint16]bool{
	1044: true, 1045: true, 1049: true, 1142: true, 1143: true, 1227: true, 1370: true,
	1698: true, 1820: true, 1862: true, 3118: true, 4151: true,
}

// mysqlDeniedErr reports whether err holds one of mysqlRefusals, or the driver's
// refusal to use the authentication the server asks for: failures of the MySQL store
// or registry that no wait mends (startwait.go).
func mysqlDeniedErr(err error) bool {
	var refused *mysql.MySQLError
	if errors.As(err, &refused) && mysqlRefusals[refused.Number] {
		return true
	}
	return errors.Is(err, mysql.ErrCleartextPassword) || errors.Is(err, mysql.ErrNativePassword) ||
		errors.Is(err, mysql.ErrOldPassword) || errors.Is(err, mysql.ErrUnknownPlugin)
}

// badDSNError is a --mysql-dsn that no wait mends. It unwraps to
// workerid.ErrInvalidConfig, the sentinel classify (startwait.go) knows as "the
// configuration is wrong", without that sentinel's text in the message.
type badDSNError struct{ msg string }

func (e *badDSNError) Error() string { return e.msg }
func (e *badDSNError) Unwrap() error { return workerid.ErrInvalidConfig }

func badDSN(format string, args ...any) error {
	return &badDSNError{fmt.Sprintf(format, args...)}
}

// redactDSN removes from msg whatever in dsn may be a password: go-sql-driver's own
// messages can quote parts of a DSN. The password is what lies between the first ':'
// and the last '@' of a DSN (user:password@...); without an '@', everything after the
// first ':' is taken for one, since a DSN that does not parse may be cut anywhere.
func redactDSN(msg, dsn string) string {
	if slash := strings.LastIndexByte(dsn, '/'); slash >= 0 && strings.IndexByte(dsn[slash:], '@') < 0 {
		dsn = dsn[:slash] // the database and parameters; the password comes before
	}
	_, rest, ok := strings.Cut(dsn, ":")
	if !ok {
		return msg
	}
	if at := strings.LastIndexByte(rest, '@'); at >= 0 {
		rest = rest[:at]
	}
	if rest == "" {
		return msg
	}
	return strings.ReplaceAll(msg, rest, "xxxxx")
}

// discardMySQLLog keeps the driver's own messages (a failed handshake, say) of the
// start-up check out of stderr: the check's error says what failed.
type discardMySQLLog struct{}

func (discardMySQLLog) Print(...any) {}
