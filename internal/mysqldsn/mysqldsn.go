// Package mysqldsn holds what the segment store and the worker registry both do to a
// parsed MySQL DSN.
package mysqldsn

import (
	"time"

	"github.com/go-sql-driver/mysql"
)

// DefaultTimeouts gives dc a dial timeout and read and write timeouts where the DSN sets
// none (timeout=, readTimeout=, writeTimeout= in the DSN win). The I/O timeouts back up
// each call's context (which the driver honours too): they end a read stuck on a peer
// that vanished without closing the connection.
func DefaultTimeouts(dc *mysql.Config, dial, io time.Duration) {
	if dc.Timeout == 0 {
		dc.Timeout = dial
	}
	if dc.ReadTimeout == 0 {
		dc.ReadTimeout = io
	}
	if dc.WriteTimeout == 0 {
		dc.WriteTimeout = io
	}
}
