package mysqldsn

import (
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
)

// TestDefaultTimeouts: the defaults fill the timeouts a DSN leaves unset, and a DSN's
// own are kept.
func TestDefaultTimeouts(t *testing.T) {
	dc, err := mysql.ParseDSN("u:p@tcp(127.0.0.1:3306)/leaf?readTimeout=1s")
	if err != nil {
		t.Fatal(err)
	}
	DefaultTimeouts(dc, 5*time.Second, 10*time.Second)
	if dc.Timeout != 5*time.Second || dc.ReadTimeout != time.Second || dc.WriteTimeout != 10*time.Second {
		t.Fatalf("DefaultTimeouts: dial %v read %v write %v, want 5s, the DSN's 1s, 10s", dc.Timeout, dc.ReadTimeout, dc.WriteTimeout)
	}
}
