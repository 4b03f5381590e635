package dispenser

import (
	"errors"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/leafbus/leafbus/internal/testutil"
	"github.com/leafbus/leafbus/snowflake"
	"github.com/leafbus/leafbus/testenv"
)

// failFast bounds how long a start refused for bad input may take (issue 16: 5 s).
const failFast = 5 * time.Second

// TestEpochAgainstClock: an epoch the clock has not reached, and one whose time bits
// the clock is already past, are refused at start, at once, naming --epoch.
func TestEpochAgainstClock(t *testing.T) {
	now := time.Now()
	layout := DefaultConfig().Layout()
	tests := []struct {
		name    string
		epoch   int64
		clock   time.Time
		wantMsg string
	}{
		{"OK", layout.Epoch, now, ""},
		{"ErrFuture", 99999999999999, now, "--epoch 99999999999999 (5138-11-16T09:46:39.999Z) is in the future"},
		{"ErrFutureByASecond", now.Add(time.Second).UnixMilli(), now, "is in the future"},
		{"ErrNoRoom", layout.Epoch, time.UnixMilli(layout.MaxTimestamp()), "leaves no room: 41 time bits end at 2080-07-10T17:30:30.208Z"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := testConfig(t)
			cfg.Epoch = tt.epoch
			start := time.Now()
			_, err := newTest(t, cfg, WithClock(snowflake.NewFakeClock(tt.clock)))
			testutil.CheckErr(t, "New", err, nil, tt.wantMsg)
			if took := time.Since(start); tt.wantMsg != "" && took > failFast {
				t.Errorf("refusal took %v, want under %v", took, failFast)
			}
			if tt.wantMsg != "" {
				if _, err := os.Stat(filepath.Join(cfg.DataDir, "jetstream")); !errors.Is(err, os.ErrNotExist) {
					t.Errorf("the refused start created the JetStream store (stat: %v): the check must come before NATS", err)
				}
			}
		})
	}
}

// TestMySQLDSNFailsFast: a DSN that does not parse or names no database ends the start
// at once, even with a --start-timeout to wait for dependencies; one that reaches no
// server that answers (refused, or accepted and never answered) ends it within 5 s with
// --start-timeout 0, and after --start-timeout otherwise. Each message names
// --mysql-dsn and never the password, for the segment store and the worker registry.
func TestMySQLDSNFailsFast(t *testing.T) {
	const password = "hunter2secret"
	silent := testenv.SilentTCP(t)
	refused := closedPort(t)
	tests := []struct {
		name, dsn    string
		startTimeout time.Duration
		wantMsg      string
	}{
		{"ErrNoSlash", "u", time.Minute, "--mysql-dsn does not parse: invalid DSN: missing the slash"},
		{"ErrAddress", "bob:" + password + "@tcp(127.0.0.1:3306/leaf", time.Minute, "--mysql-dsn does not parse"},
		{"ErrParam", "bob:" + password + "@tcp(127.0.0.1:3306)/leaf?parseTime=maybe", time.Minute, "--mysql-dsn does not parse: invalid bool value: maybe"},
		{"ErrNoDatabase", "bob:" + password + "@tcp(127.0.0.1:3306)/", time.Minute, "--mysql-dsn names no database"},
		{"ErrRefused", "bob:" + password + "@tcp(" + refused + ")/leaf", 0, "--mysql-dsn: cannot reach database \"leaf\" on " + refused + " as user \"bob\""},
		{"ErrSilent", "bob:" + password + "@tcp(" + silent + ")/leaf", 0, "--mysql-dsn: cannot reach database \"leaf\" on " + silent + " as user \"bob\": no MySQL answer within 3s"},
		{"ErrRefusedAfterStartTimeout", "bob:" + password + "@tcp(" + refused + ")/leaf", 2 * time.Second, "not ready within --start-timeout 2s"},
	}
	for _, mode := range []string{"SegmentStore", "WorkerRegistry"} {
		for _, tt := range tests {
			t.Run(mode+"/"+tt.name, func(t *testing.T) {
				cfg := testConfig(t)
				cfg.MySQLDSN, cfg.StartTimeout = tt.dsn, tt.startTimeout
				if mode == "SegmentStore" {
					cfg.SegmentStore = "mysql"
				} else {
					cfg.WorkerRegistry, cfg.Advertise = "mysql", "127.0.0.1:7000"
				}
				start := time.Now()
				_, err := newTest(t, cfg)
				took := time.Since(start)
				testutil.CheckErr(t, "New", err, nil, tt.wantMsg)
				if strings.Contains(err.Error(), password) {
					t.Errorf("the message shows the password: %v", err)
				}
				if took > failFast+tt.startTimeout {
					t.Errorf("refusal took %v, want under %v", took, failFast+tt.startTimeout)
				}
			})
		}
	}
}

// TestMySQLServerRefusesDSN: a server that refuses the user's password or does not
// have the database ends the start at once, whatever --start-timeout allows, and the
// message names --mysql-dsn and never the password.
func TestMySQLServerRefusesDSN(t *testing.T) {
	srv := testenv.MariaDB(t)
	const password = "hunter2secret"
	tests := []struct{ name, dsn, wantMsg string }{
		{"ErrNoSuchDatabase", srv.DSN("no_such_database"), "--mysql-dsn: database \"no_such_database\" on " + srv.Addr() + " as user \"root\" refused: Error 1049"},
		{"ErrWrongPassword", "root:" + password + "@tcp(" + srv.Addr() + ")/mysql", "refused: Error 1045"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := testConfig(t)
			cfg.SegmentStore, cfg.MySQLDSN, cfg.StartTimeout = "mysql", tt.dsn, time.Minute
			start := time.Now()
			_, err := newTest(t, cfg)
			testutil.CheckErr(t, "New", err, nil, tt.wantMsg)
			if strings.Contains(err.Error(), password) {
				t.Errorf("the message shows the password: %v", err)
			}
			if took := time.Since(start); took > failFast {
				t.Errorf("refusal took %v, want under %v", took, failFast)
			}
		})
	}
}

// TestRedactDSN: whatever may be a password is masked, however the DSN is cut.
func TestRedactDSN(t *testing.T) {
	tests := []struct{ name, dsn, msg, want string }{
		{"Plain", "bob:pw@tcp(h:3306)/leaf", "bad pw here", "bad xxxxx here"},
		{"SlashInPassword", "bob:p/w@tcp(h:3306)/leaf", "bad p/w", "bad xxxxx"},
		{"AtInPassword", "bob:p@w@tcp(h:3306)/leaf", "bad p@w", "bad xxxxx"},
		{"NoAt", "bob:pw", "bad pw", "bad xxxxx"},
		{"NoPassword", "bob@tcp(h:3306)/leaf", "bad bob", "bad bob"},
		{"NoColon", "u", "bad u", "bad u"},
		{"Socket", "bob:pw@unix(/tmp/my.sock)/leaf", "bad pw", "bad xxxxx"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := redactDSN(tt.msg, tt.dsn); got != tt.want {
				t.Errorf("redactDSN(%q, %q) = %q, want %q", tt.msg, tt.dsn, got, tt.want)
			}
		})
	}
}

// TestConfigModes: a setting the chosen mode would ignore is refused by Validate, with
// what to use instead.
func TestConfigModes(t *testing.T) {
	natsConf := filepath.Join(t.TempDir(), "nats.conf")
	if err := os.WriteFile(natsConf, []byte("authorization { users = [{user: bob, password: pw}] }\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name      string
		configure func(*Config)
		wantMsg   string
	}{
		{"OK", func(*Config) {}, ""},
		{"ErrCredentialsEmbedded", func(c *Config) { c.Conn.User, c.Conn.Password = "bob", "pw" },
			"--user, --password: the embedded NATS server has no users without --nats-config"},
		{"ErrTokenEmbedded", func(c *Config) { c.Conn.Token = "t" }, "--token: the embedded NATS server has no users"},
		{"ErrCredsEmbedded", func(c *Config) { c.Conn.CredsFile = natsConf }, "or --nats (docs/errors.md#embedded-users)"},
		{"ErrTLSEmbedded", func(c *Config) { c.Conn.TLSCA = natsConf }, "--tls-ca: the embedded NATS server speaks TLS only when --nats-config configures it"},
		{"CredentialsWithNATSConfig", func(c *Config) { c.NATSConfig, c.Conn.User, c.Conn.Password = natsConf, "bob", "pw" }, ""},
		{"CredentialsWithNATS", func(c *Config) { c.NATS, c.Conn.User, c.Conn.Password = "nats://127.0.0.1:4222", "bob", "pw" }, ""},
		{"ErrNATSConfigWithNATS", func(c *Config) { c.NATS, c.NATSConfig = "nats://127.0.0.1:4222", natsConf },
			"--nats-config configures the embedded NATS server, and with --nats nats://127.0.0.1:4222 the dispenser embeds none"},
		{"ErrInsecureListenWithNATS", func(c *Config) { c.NATS, c.InsecureListen = "nats://127.0.0.1:4222", true }, "--insecure-listen configures the embedded"},
		{"ErrMonitorWithNATS", func(c *Config) { c.NATS, c.Monitor = "nats://127.0.0.1:4222", "127.0.0.1:8222" }, "--monitor configures the embedded"},
		{"ErrMySQLDSNUnused", func(c *Config) { c.MySQLDSN = "u:p@tcp(h:3306)/leaf" }, "--mysql-dsn is only used with --segment-store mysql or --worker-registry mysql (got kv and kv)"},
		{"ErrMySQLCreateTableUnused", func(c *Config) { c.MySQLCreateTable = true }, "--mysql-create-table is only used"},
		{"ErrZKUnused", func(c *Config) { c.ZK = "127.0.0.1:2181" }, "--zk is only used with --worker-registry zk (got kv)"},
		{"ErrAdvertiseUnused", func(c *Config) { c.Advertise = "10.0.0.1:7000" }, "--advertise is only used with --worker-registry zk or mysql (got kv)"},
		{"AdvertiseWithZK", func(c *Config) { c.WorkerRegistry, c.ZK, c.Advertise = "zk", "127.0.0.1:2181", "10.0.0.1:7000" }, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := testConfig(t)
			tt.configure(&cfg)
			testutil.CheckErr(t, "Validate", cfg.Validate(), nil, tt.wantMsg)
		})
	}
}

// closedPort is a loopback address nothing listens on, nor takes meanwhile
// (testenv.FreePort).
func closedPort(tb testing.TB) string {
	tb.Helper()
	p, err := testenv.FreePort()
	if err != nil {
		tb.Fatal(err)
	}
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(p))
}
