package dispenser

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/go-zookeeper/zk"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/leafbus/leafbus/internal/testutil"
	"github.com/leafbus/leafbus/segment"
	"github.com/leafbus/leafbus/testenv"
	"github.com/leafbus/leafbus/workerid"
)

// A dispenser started while its NATS cluster has no JetStream quorum (two of three nodes
// still down, as when the cluster starts together with it) waits for it, logging why,
// instead of refusing at the first "no responders" (issue 13).
func TestStartWaitsForJetStream(t *testing.T) {
	cluster := testenv.StartNATSCluster(t, 3)
	cluster.Nodes[1].Stop()
	cluster.Nodes[2].Stop()
	cfg := testConfig(t)
	cfg.NATS = cluster.URLs()
	cfg.KVReplicas = 3
	cfg.StartTimeout = time.Minute

	started := make(chan struct{})
	go func() {
		defer close(started)
		time.Sleep(2 * time.Second)
		cluster.Nodes[1].Start()
		cluster.Nodes[2].Start()
	}()
	begin := time.Now()
	d, err := newTest(t, cfg)
	<-started
	if err != nil {
		t.Fatalf("New while JetStream forms: %v", err)
	}
	if waited := time.Since(begin); waited < 2*time.Second {
		t.Fatalf("New returned after %s, before the cluster had a quorum", waited)
	}
	runTest(t, d)

	// With no time to wait, the same start refuses at once.
	cluster.Nodes[1].Stop()
	cluster.Nodes[2].Stop()
	cfg.NodeID, cfg.DataDir, cfg.StartTimeout = "impatient", t.TempDir(), 0
	begin = time.Now()
	if _, err := newTest(t, cfg); err == nil {
		t.Fatalf("New without a JetStream quorum and --start-timeout 0 succeeded")
	}
	t.Logf("--start-timeout 0 refused after %s", time.Since(begin).Round(time.Millisecond))
}

// A refusal for safety is never waited out: a clock behind this node's record refuses at
// once, however long --start-timeout is.
func TestStartDoesNotWaitOutRefusals(t *testing.T) {
	srv := testenv.StartNATS(t)
	cfg := testConfig(t)
	cfg.NATS = srv.URL()
	cfg.StartTimeout = time.Minute
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	js, err := jetstream.New(srv.Connect(t))
	if err != nil {
		t.Fatalf("jetstream.New: %v", err)
	}
	forever, err := workerid.OpenForever(ctx, js, cfg.Prefix+"_forever", 1)
	if err != nil {
		t.Fatalf("OpenForever: %v", err)
	}
	ahead := time.Now().Add(time.Hour).UnixMilli()
	if err := forever.Put(ctx, cfg.NodeID, workerid.Record{WorkerID: 0, Timestamp: ahead}); err != nil {
		t.Fatalf("Put: %v", err)
	}
	begin := time.Now()
	_, err = newTest(t, cfg)
	if !errors.Is(err, workerid.ErrClockBehindRecord) {
		t.Fatalf("New with the clock an hour behind its record = %v, want ErrClockBehindRecord", err)
	}
	if d := time.Since(begin); d > 10*time.Second {
		t.Fatalf("refused after %s, want at once", d)
	}
}

// retryWatch counts the "waiting for a dependency" lines of a start and ends the start
// at the first one (cancel), so that a start that would wait out --start-timeout fails
// its test at once rather than after the timeout.
type retryWatch struct {
	slog.Handler
	seen *retrySeen
}

type retrySeen struct {
	n      atomic.Int32
	cancel context.CancelFunc
}

func (h retryWatch) Handle(ctx context.Context, r slog.Record) error {
	if r.Message == waitingMsg {
		h.seen.n.Add(1)
		h.seen.cancel()
	}
	return h.Handler.Handle(ctx, r)
}

func (h retryWatch) WithAttrs(as []slog.Attr) slog.Handler {
	return retryWatch{h.Handler.WithAttrs(as), h.seen}
}

func (h retryWatch) WithGroup(name string) slog.Handler {
	return retryWatch{h.Handler.WithGroup(name), h.seen}
}

// startOnce runs New with cfg and a minute of --start-timeout, and returns its error
// and how many times it logged that it waits for a dependency. It never waits longer
// than one attempt and its first retry line.
func startOnce(tb testing.TB, cfg Config) (err error, retries int) {
	tb.Helper()
	cfg.StartTimeout = time.Minute
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	seen := &retrySeen{cancel: cancel}
	log := slog.New(retryWatch{testutil.Logger(tb).Handler(), seen})
	d, err := New(ctx, cfg, WithLogger(log))
	if err == nil {
		tb.Cleanup(func() { _ = d.Close() })
	}
	return err, int(seen.n.Load())
}

// securedNATS starts a nats-server with JetStream from the configuration text conf
// (users, permissions, TLS) on a random loopback port and returns its client URL.
func securedNATS(tb testing.TB, conf string) string {
	tb.Helper()
	opts, err := server.ProcessConfigFile(writeConf(tb, conf))
	if err != nil {
		tb.Fatalf("nats-server configuration: %v\n%s", err, conf)
	}
	opts.Host, opts.Port = "127.0.0.1", server.RANDOM_PORT
	opts.JetStream, opts.StoreDir = true, tb.TempDir()
	opts.NoSigs, opts.NoLog = true, true
	srv, err := server.NewServer(opts)
	if err != nil {
		tb.Fatalf("nats-server: %v", err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		srv.Shutdown()
		tb.Fatal("nats-server not ready within 10s")
	}
	tb.Cleanup(func() {
		srv.Shutdown()
		srv.WaitForShutdown()
	})
	return fmt.Sprintf("nats://127.0.0.1:%d", srv.Addr().(*net.TCPAddr).Port)
}

// TestUnhealableFailsAtOnce: a mistake that no wait mends (credentials, certificates,
// permissions, replicas the servers cannot hold, a corrupt file in the data dir) ends
// the start after its first attempt, whatever --start-timeout allows, with a message
// that names the problem and the flag or file to check (issue 21). A dependency that
// is only coming up is still waited for (TestStartWaitsForJetStream).
func TestUnhealableFailsAtOnce(t *testing.T) {
	pki, otherPKI := newTestPKI(t), newTestPKI(t)
	users := securedNATS(t, `authorization { users: [
  { user: dispenser, password: right }
  { user: bystander, password: right, permissions: { publish: { allow: ["leaf.>"] }, subscribe: { allow: ["_INBOX.>"] } } }
] }`)
	tlsOnly := securedNATS(t, fmt.Sprintf("tls { cert_file: %q, key_file: %q }\n", pki.serverCert, pki.serverKey))
	tlsVerify := securedNATS(t, fmt.Sprintf("tls { cert_file: %q, key_file: %q, ca_file: %q, verify: true }\n", pki.serverCert, pki.serverKey, pki.ca))
	single := testenv.StartNATS(t)
	zkSrv, mdb := testenv.ZooKeeper(t), testenv.MariaDB(t)

	tests := []struct {
		name      string
		configure func(t *testing.T, c *Config)
		wantErr   error
		wantMsg   []string
	}{
		{"WrongPassword", func(t *testing.T, c *Config) {
			c.NATS, c.Conn.User, c.Conn.Password = users, "dispenser", "wrong"
		}, nats.ErrAuthorization, []string{`user "dispenser"`, "--user/--password"}},
		{"NoCredentials", func(t *testing.T, c *Config) { c.NATS = users },
			nats.ErrAuthorization, []string{"no credentials", "--user/--password, --creds, --nkey or --token"}},
		{"TLSWithoutCA", func(t *testing.T, c *Config) { c.NATS = tlsOnly },
			nil, []string{"certificate", "--tls-ca"}},
		{"TLSWrongCA", func(t *testing.T, c *Config) { c.NATS, c.Conn.TLSCA = tlsOnly, otherPKI.ca },
			nil, []string{"certificate", "--tls-ca " + otherPKI.ca}},
		{"TLSNoClientCertificate", func(t *testing.T, c *Config) { c.NATS, c.Conn.TLSCA = tlsVerify, pki.ca },
			nil, []string{"client certificate", "--tls-cert/--tls-key"}},
		{"NoPermission", func(t *testing.T, c *Config) {
			c.NATS, c.Conn.User, c.Conn.Password = users, "bystander", "right"
		}, nil, []string{"permission", `user "bystander"`, "deploy/nats-roles.conf"}},
		{"ReplicasBeyondEmbedded", func(t *testing.T, c *Config) { c.KVReplicas = 3 },
			nil, []string{"--kv-replicas 3"}},
		{"ReplicasBeyondServers", func(t *testing.T, c *Config) { c.NATS, c.KVReplicas = single.URL(), 3 },
			nil, []string{"--kv-replicas 3"}},
		{"CorruptCacheFile", func(t *testing.T, c *Config) {
			if err := os.WriteFile(c.cacheFile().Path, []byte("\x00garbage{"), 0o600); err != nil {
				t.Fatal(err)
			}
		}, workerid.ErrCorruptCacheFile, []string{"leaf-workerid-test-node.json", "--data-dir"}},
		{"ZooKeeperNoAuth", func(t *testing.T, c *Config) {
			c.WorkerRegistry, c.ZK, c.ZKName, c.Advertise = "zk", zkSrv.Addr(), lockedZKName(t, zkSrv), "127.0.0.1:7000"
		}, zk.ErrNoAuth, []string{"--zk-name", "ACL"}},
		{"MySQLNoPrivilege", func(t *testing.T, c *Config) {
			c.SegmentStore, c.MySQLDSN = "mysql", unprivilegedDSN(t, mdb)
		}, nil, []string{"--mysql-dsn", "1142"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := testConfig(t)
			tt.configure(t, &cfg)
			err, retries := startOnce(t, cfg)
			if err == nil {
				t.Fatal("New succeeded")
			}
			if retries != 0 {
				t.Errorf("New waited for a dependency (%d retry logged), want it to end after one attempt: %v", retries, err)
			}
			if tt.wantErr != nil && !errors.Is(err, tt.wantErr) {
				t.Errorf("New: %v, want an error wrapping %v", err, tt.wantErr)
			}
			for _, want := range tt.wantMsg {
				if !strings.Contains(err.Error(), want) {
					t.Errorf("New: %v\nwant the message to name %q", err, want)
				}
			}
			t.Logf("refused: %v", err)
		})
	}
}

// lockedZKName creates Leaf's node of a new --zk-name (/snowflake/<name>) with an ACL
// that lets only an authenticated user in, as another deployment's node would be, and
// returns the name.
func lockedZKName(tb testing.TB, srv *testenv.ZooKeeperServer) string {
	tb.Helper()
	conn := srv.Connect(tb)
	if err := conn.AddAuth("digest", []byte("owner:secret")); err != nil {
		tb.Fatalf("AddAuth: %v", err)
	}
	if _, err := conn.Create("/snowflake", nil, 0, zk.WorldACL(zk.PermAll)); err != nil && !errors.Is(err, zk.ErrNodeExists) {
		tb.Fatalf("create /snowflake: %v", err)
	}
	name := fmt.Sprintf("locked-%d", time.Now().UnixNano())
	path := "/snowflake/" + name
	if _, err := conn.Create(path, nil, 0, zk.DigestACL(zk.PermAll, "owner", "secret")); err != nil {
		tb.Fatalf("create %s: %v", path, err)
	}
	tb.Cleanup(func() { _ = conn.Delete(path, -1) })
	return name
}

// unprivilegedDSN creates a database with leaf_alloc and a user who may reach the
// database but not read or write leaf_alloc, and returns that user's DSN.
func unprivilegedDSN(tb testing.TB, srv *testenv.MariaDBServer) string {
	tb.Helper()
	rootDSN := srv.NewDatabase(tb)
	dc, err := mysql.ParseDSN(rootDSN)
	if err != nil {
		tb.Fatal(err)
	}
	db := testenv.OpenDB(tb, rootDSN)
	user := fmt.Sprintf("np%d", time.Now().UnixNano()%1e9)
	for _, q := range []string{
		segment.MySQLSchema,
		"CREATE TABLE other (id INT)",
		"CREATE USER '" + user + "'@'%' IDENTIFIED BY 'pw'",
		"GRANT SELECT ON `" + dc.DBName + "`.other TO '" + user + "'@'%'",
	} {
		if _, err := db.Exec(q); err != nil {
			tb.Fatalf("%s: %v", q, err)
		}
	}
	tb.Cleanup(func() { _, _ = db.Exec("DROP USER '" + user + "'@'%'") })
	dc.User, dc.Passwd = user, "pw"
	return dc.FormatDSN()
}

// TestClassify: each error the start can meet, as its library returns it (wrapped as
// the steps wrap it), is waited out or not (a running node's rejoin is workerid's,
// TestIsRefusal).
func TestClassify(t *testing.T) {
	wrap := func(err error) error { return fmt.Errorf("step: %w", fmt.Errorf("call: %w", err)) }
	tests := []struct {
		name string
		err  error
		want failure
	}{
		{"Plain", errors.New("connection refused"), transient},
		{"NoResponders", wrap(nats.ErrNoResponders), transient},
		{"Timeout", wrap(context.DeadlineExceeded), transient},
		{"NoSuitablePeers", wrap(&jetstream.APIError{Code: 500, ErrorCode: 10005, Description: "no suitable peers for placement"}), transient},
		{"TLSHandshakeTimeout", wrap(fmt.Errorf("%w: %w", nats.ErrTLS, os.ErrDeadlineExceeded)), transient},
		{"ZKNoServer", wrap(zk.ErrNoServer), transient},
		{"MySQLLockWait", wrap(&mysql.MySQLError{Number: 1205, Message: "Lock wait timeout exceeded"}), transient},
		{"MySQLGone", wrap(mysql.ErrInvalidConn), transient},
		{"ClockBehind", wrap(workerid.ErrClockBehindRecord), refused},
		{"StoreWentBack", wrap(segment.ErrStoreWentBack), refused},
		{"CorruptMarks", wrap(segment.ErrCorruptMarks), refused},
		{"Canceled", wrap(context.Canceled), refused},
		{"BadDSN", badDSN("--mysql-dsn does not parse"), refused},
		{"CorruptCacheFile", wrap(workerid.ErrCorruptCacheFile), corruptDataFile},
		{"Authorization", wrap(nats.ErrAuthorization), natsAuth},
		{"AuthExpired", wrap(nats.ErrAuthExpired), natsAuth},
		{"AuthRevoked", wrap(nats.ErrAuthRevoked), natsAuth},
		{"AccountAuthExpired", wrap(nats.ErrAccountAuthExpired), natsAuth},
		{"Permission", wrap(fmt.Errorf("%w: Permissions Violation for Publish to %q", nats.ErrPermissionViolation, "$JS.API.INFO")), natsPermission},
		{"TLSNotOffered", wrap(nats.ErrSecureConnWanted), natsNoTLS},
		{"UnknownAuthority", wrap(fmt.Errorf("%w: %w", nats.ErrTLS, &tls.CertificateVerificationError{Err: x509.UnknownAuthorityError{}})), serverCertificate},
		{"WrongHost", wrap(&tls.CertificateVerificationError{Err: x509.HostnameError{Host: "db"}}), serverCertificate},
		{"ClosedAfterHandshakeEPIPE", wrap(fmt.Errorf("%w: connection closed by remote after TLS handshake: %w", nats.ErrTLS, syscall.EPIPE)), clientCertificate},
		{"ClosedAfterHandshakeReset", wrap(fmt.Errorf("%w: connection closed by remote after TLS handshake: %w", nats.ErrTLS, syscall.ECONNRESET)), clientCertificate},
		{"ClosedAfterHandshakeEOF", wrap(fmt.Errorf("%w: connection closed by remote after TLS handshake: %w", nats.ErrTLS, io.EOF)), clientCertificate},
		{"EOFWithoutTLS", wrap(io.EOF), transient},
		{"ReplicasNotClustered", wrap(&jetstream.APIError{Code: 500, ErrorCode: 10074, Description: "replicas > 1 not supported in non-clustered mode"}), replicasBeyondServers},
		{"ZKNoAuth", wrap(zk.ErrNoAuth), zkDenied},
		{"ZKAuthFailed", wrap(zk.ErrAuthFailed), zkDenied},
		{"MySQLAccessDenied", wrap(&mysql.MySQLError{Number: 1045}), mysqlDenied},
		{"MySQLTableDenied", wrap(&mysql.MySQLError{Number: 1142}), mysqlDenied},
		{"MySQLUnknownDatabase", wrap(&mysql.MySQLError{Number: 1049}), mysqlDenied},
		{"MySQLAccountLocked", wrap(&mysql.MySQLError{Number: 4151}), mysqlDenied},
		{"MySQLNativePassword", wrap(mysql.ErrNativePassword), mysqlDenied},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := classify(tt.err); got != tt.want {
				t.Errorf("classify(%v) = %d, want %d", tt.err, got, tt.want)
			}
		})
	}
}

// TestCertificateAlert: the alerts a TLS server sends about a client's certificate, as
// crypto/tls hands them to the client, are told from other failures.
func TestCertificateAlert(t *testing.T) {
	pki, other := newTestPKI(t), newTestPKI(t)
	serverCert, err := tls.LoadX509KeyPair(pki.serverCert, pki.serverKey)
	if err != nil {
		t.Fatal(err)
	}
	clientCAs := x509.NewCertPool()
	caPEM, err := os.ReadFile(pki.ca)
	if err != nil {
		t.Fatal(err)
	}
	clientCAs.AppendCertsFromPEM(caPEM)
	ln, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{
		Certificates: []tls.Certificate{serverCert}, ClientCAs: clientCAs, ClientAuth: tls.RequireAndVerifyClientCert,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_ = c.(*tls.Conn).Handshake() // fails: sends the alert
			c.Close()
		}
	}()
	strangerCert, err := tls.LoadX509KeyPair(other.clientCert, other.clientKey)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name  string
		certs []tls.Certificate
	}{{"NoCertificate", nil}, {"UnknownCA", []tls.Certificate{strangerCert}}} {
		t.Run(tc.name, func(t *testing.T) {
			conn, err := tls.Dial("tcp", ln.Addr().String(), &tls.Config{InsecureSkipVerify: true, Certificates: tc.certs})
			if err != nil {
				t.Fatalf("Dial: %v", err)
			}
			defer conn.Close()
			_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
			_, err = conn.Read(make([]byte, 1))
			if !isCertificateAlert(err) {
				t.Fatalf("Read after the handshake: %v (%T), want a certificate alert", err, err)
			}
			if classify(fmt.Errorf("connect: %w", err)) != clientCertificate {
				t.Errorf("classify(%v) is not clientCertificate", err)
			}
		})
	}
	if isCertificateAlert(&net.OpError{Op: "read", Err: syscall.ECONNRESET}) {
		t.Error("a reset connection counts as a certificate alert")
	}
}

// TestUnhealableHints: a refused embedded start and the service connection's
// credentials name their own flags.
func TestUnhealableHints(t *testing.T) {
	cfg := rolesConfig(t)
	cfg.Conn.Password = "wrong"
	err, retries := startOnce(t, cfg)
	testutil.CheckErr(t, "New with a wrong --password", err, nats.ErrAuthorization, "--nats-config "+rolesConf)
	testutil.CheckErr(t, "New with a wrong --password", err, nil, `refuses user "dispenser": check --user/--password`)
	if retries != 0 {
		t.Errorf("New logged %d retries", retries)
	}

	cfg = rolesConfig(t)
	cfg.ServiceAuth.Password = "wrong"
	err, _ = startOnce(t, cfg)
	testutil.CheckErr(t, "New with a wrong --service-password", err, nats.ErrAuthorization, `refuses user "dispenser-service": check --service-user/--service-password`)
}
