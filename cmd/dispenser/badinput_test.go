package main

import (
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/leafbus/leafbus/testenv"
)

// TestBinaryBadInputFailsFast runs the real binary with operator mistakes: each exits
// non-zero within 5 s (an epoch or a DSN that used to hang, 15 s and 20 s), with a
// message naming the flag, and never shows a password. Flags the mode would ignore
// are usage errors (exit 2); what only the start can find is exit 1. A MySQL server out
// of reach may be one still starting: it is waited for up to --start-timeout (each
// attempt logged), so these rows set it short.
func TestBinaryBadInputFailsFast(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	const password = "hunter2secret"
	silent := testenv.SilentTCP(t)
	file := filepath.Join(t.TempDir(), "some.pem")
	if err := os.WriteFile(file, []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name     string
		env      []string
		args     []string
		wantCode int
		want     []string
	}{
		{"EpochInFuture", nil, []string{"--epoch", "99999999999999"}, 1,
			[]string{"--epoch 99999999999999 (5138-11-16T09:46:39.999Z) is in the future"}},
		{"DSNDoesNotParse", nil, []string{"--worker-registry", "mysql", "--mysql-dsn", "u"}, 1,
			[]string{"--mysql-dsn does not parse: invalid DSN: missing the slash separating the database name"}},
		{"DSNStoreDoesNotParse", nil, []string{"--segment-store", "mysql", "--mysql-dsn", "bob:" + password + "@tcp(db:3306/leaf"}, 1,
			[]string{"--mysql-dsn does not parse"}},
		{"DSNUnreachable", nil, []string{"--worker-registry", "mysql", "--mysql-dsn", "bob:" + password + "@tcp(" + silent + ")/leaf", "--start-timeout", "0"}, 1,
			[]string{"--mysql-dsn: cannot reach database \"leaf\" on " + silent + " as user \"bob\": no MySQL answer within 3s"}},
		{"DSNUnreachableWaited", nil, []string{"--segment-store", "mysql", "--mysql-dsn", "bob:" + password + "@tcp(" + silent + ")/leaf", "--start-timeout", "1s"}, 1,
			[]string{"not ready within --start-timeout 1s", "--mysql-dsn: cannot reach database \"leaf\""}},
		{"Credentials", nil, []string{"--user", "bob", "--password", password}, 2,
			[]string{"--user, --password: the embedded NATS server has no users without --nats-config", "--nats-config", "--nats"}},
		{"CredentialsFromEnv", []string{"LEAFBUS_TOKEN=" + password}, nil, 2,
			[]string{"--token: the embedded NATS server has no users"}},
		{"TLS", nil, []string{"--tls-ca", file}, 2,
			[]string{"--tls-ca: the embedded NATS server speaks TLS only when --nats-config configures it"}},
		{"ListenWithNATS", nil, []string{"--nats", "nats://127.0.0.1:4222", "--listen", "127.0.0.1:4333"}, 2,
			[]string{"--listen is the embedded NATS server's address, and with --nats the dispenser embeds none"}},
		{"ZKWithoutZK", nil, []string{"--zk", "127.0.0.1:2181", "--zk-name", "x"}, 2,
			[]string{"--zk is only used with --worker-registry zk (got kv)", "--zk-name is only used with --worker-registry zk (got kv)"}},
		{"MySQLDSNWithoutMySQL", nil, []string{"--mysql-dsn", "bob:" + password + "@tcp(db:3306)/leaf"}, 2,
			[]string{"--mysql-dsn is only used with --segment-store mysql or --worker-registry mysql (got kv and kv)"}},
		{"WorkerIDWithoutStatic", nil, []string{"--worker-id", "5"}, 2,
			[]string{"--worker-id 5 is only used with --worker-registry static (got kv)"}},
		{"LeaseTTLWithStatic", nil, []string{"--worker-registry", "static", "--worker-id", "5", "--lease-ttl", "1m"}, 2,
			[]string{"--lease-ttl is only used with --worker-registry kv, or zk with --zk-recycle (got static)"}},
		{"SampleTagWithMySQL", nil, []string{"--segment-store", "mysql", "--mysql-dsn", "bob@tcp(db:3306)/leaf", "--sample-tag"}, 2,
			[]string{"--sample-tag is only used with --segment-store kv (got mysql)"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			args := append([]string{"--data-dir", t.TempDir(), "--node-id", "bad-input"}, tt.args...)
			if !slices.Contains(tt.args, "--nats") {
				args = append([]string{"--listen", fmt.Sprintf("127.0.0.1:%d", freePort(t))}, args...)
			}
			code, stderr, took := runToExit(t, 30*time.Second, tt.env, args...)
			if code != tt.wantCode {
				t.Fatalf("exit %d, want %d\nstderr:\n%s", code, tt.wantCode, stderr)
			}
			for _, want := range tt.want {
				if !strings.Contains(stderr, want) {
					t.Errorf("stderr does not contain %q:\n%s", want, stderr)
				}
			}
			if strings.Contains(stderr, password) {
				t.Errorf("stderr shows the password:\n%s", stderr)
			}
			if took > 5*time.Second {
				t.Errorf("exit after %v, want within 5s", took)
			}
			t.Logf("exit %d after %v", code, took.Round(time.Millisecond))
		})
	}
}
