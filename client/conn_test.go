package client

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"log/slog"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/jwt/v2"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"github.com/leafbus/leafbus/internal/testutil"
)

// connBound bounds every connection attempt: a wrong credential must fail, not hang.
const connBound = 10 * time.Second

// startConnServer starts a plain nats-server (no JetStream: these tests only need
// request/reply) with opts on 127.0.0.1 and shuts it down at cleanup.
func startConnServer(tb testing.TB, opts *server.Options) *server.Server {
	tb.Helper()
	opts.Host = "127.0.0.1"
	if opts.Port == 0 {
		opts.Port = server.RANDOM_PORT
	}
	opts.NoLog = true
	opts.NoSigs = true
	srv, err := server.NewServer(opts)
	if err != nil {
		tb.Fatalf("configure nats-server: %v", err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		srv.Shutdown()
		tb.Fatalf("nats-server on %s:%d not ready within 10s", opts.Host, opts.Port)
	}
	tb.Cleanup(func() {
		srv.Shutdown()
		srv.WaitForShutdown()
	})
	return srv
}

// serverURL is srv's client URL with the nats:// scheme (TLS is negotiated after INFO).
func serverURL(srv *server.Server) string {
	return "nats://" + srv.Addr().String()
}

// connectBounded runs cfg.Connect and fails tb if it has not returned within connBound.
// A connection it returns is closed at cleanup.
func connectBounded(tb testing.TB, cfg ConnConfig, logger *slog.Logger) (*nats.Conn, error) {
	tb.Helper()
	type result struct {
		nc  *nats.Conn
		err error
	}
	done := make(chan result, 1)
	go func() {
		nc, err := cfg.Connect(logger)
		done <- result{nc, err}
	}()
	select {
	case r := <-done:
		if r.nc != nil {
			tb.Cleanup(r.nc.Close)
		}
		return r.nc, r.err
	case <-time.After(connBound):
		tb.Fatalf("Connect to %s did not return within %v", cfg.URLs, connBound)
		return nil, nil
	}
}

// roundTrip proves nc really works: it answers a subject of its own and requests it.
func roundTrip(tb testing.TB, nc *nats.Conn) {
	tb.Helper()
	subject := "conntest." + nats.NewInbox()[len(nats.InboxPrefix):]
	sub, err := nc.Subscribe(subject, func(m *nats.Msg) {
		_ = m.Respond(append([]byte("echo "), m.Data...))
	})
	if err != nil {
		tb.Fatalf("subscribe %s: %v", subject, err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	reply, err := nc.Request(subject, []byte("ping"), 5*time.Second)
	if err != nil {
		tb.Fatalf("request %s: %v", subject, err)
	}
	if got := string(reply.Data); got != "echo ping" {
		tb.Fatalf("reply = %q, want %q", got, "echo ping")
	}
}

// writeFile writes data to name under dir with owner-only permissions and returns its path.
func writeFile(tb testing.TB, dir, name string, data []byte) string {
	tb.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, data, 0o600); err != nil {
		tb.Fatalf("write %s: %v", path, err)
	}
	return path
}

// userSeedFile makes a fresh NKey user, writes its seed to a file and returns the path
// and the public key.
func userSeedFile(tb testing.TB, dir, name string) (path, public string) {
	tb.Helper()
	kp, err := nkeys.CreateUser()
	if err != nil {
		tb.Fatalf("create NKey user: %v", err)
	}
	seed, err := kp.Seed()
	if err != nil {
		tb.Fatalf("NKey seed: %v", err)
	}
	public, err = kp.PublicKey()
	if err != nil {
		tb.Fatalf("NKey public key: %v", err)
	}
	return writeFile(tb, dir, name, seed), public
}

// operatorSetup is a decentralized-auth world made in the test: one operator that signed
// one account, whose JWT sits in a memory resolver, and a .creds file for a user of it.
type operatorSetup struct {
	operator *jwt.OperatorClaims
	resolver *server.MemAccResolver
	creds    string // a user of the trusted account
	stranger string // a user of an account the operator never signed
}

func newOperatorSetup(tb testing.TB, dir string) operatorSetup {
	tb.Helper()
	must := func(err error) {
		tb.Helper()
		if err != nil {
			tb.Fatalf("operator setup: %v", err)
		}
	}
	opKP, err := nkeys.CreateOperator()
	must(err)
	opPub, err := opKP.PublicKey()
	must(err)
	operator := jwt.NewOperatorClaims(opPub)
	operator.Name = "conntest"
	// The server takes the operator as claims; encoding signs them, as nsc would.
	_, err = operator.Encode(opKP)
	must(err)

	account := func(signer nkeys.KeyPair) (nkeys.KeyPair, string, string) {
		accKP, err := nkeys.CreateAccount()
		must(err)
		accPub, err := accKP.PublicKey()
		must(err)
		claims := jwt.NewAccountClaims(accPub)
		claims.Name = "leaf"
		accJWT, err := claims.Encode(signer)
		must(err)
		return accKP, accPub, accJWT
	}
	userCreds := func(accKP nkeys.KeyPair, name string) string {
		uKP, err := nkeys.CreateUser()
		must(err)
		uPub, err := uKP.PublicKey()
		must(err)
		claims := jwt.NewUserClaims(uPub)
		claims.Name = name
		uJWT, err := claims.Encode(accKP)
		must(err)
		seed, err := uKP.Seed()
		must(err)
		creds, err := jwt.FormatUserConfig(uJWT, seed)
		must(err)
		return writeFile(tb, dir, name+".creds", creds)
	}

	accKP, accPub, accJWT := account(opKP)
	resolver := &server.MemAccResolver{}
	must(resolver.Store(accPub, accJWT))

	// An account signed by another operator: its users must be turned away.
	otherOp, err := nkeys.CreateOperator()
	must(err)
	strangerAcc, _, _ := account(otherOp)

	return operatorSetup{
		operator: operator,
		resolver: resolver,
		creds:    userCreds(accKP, "dispenser"),
		stranger: userCreds(strangerAcc, "stranger"),
	}
}

// tlsFiles are PEM files for mutual TLS on 127.0.0.1, all issued by one test CA.
type tlsFiles struct {
	ca, serverCert, serverKey, clientCert, clientKey string
	otherCA                                          string // a CA that signed nothing here
}

func newTLSFiles(tb testing.TB, dir string) tlsFiles {
	tb.Helper()
	must := func(err error) {
		tb.Helper()
		if err != nil {
			tb.Fatalf("TLS setup: %v", err)
		}
	}
	serial := int64(0)
	issue := func(tmpl *x509.Certificate, parent *x509.Certificate, parentKey *ecdsa.PrivateKey) (*x509.Certificate, *ecdsa.PrivateKey, []byte, []byte) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		must(err)
		serial++
		tmpl.SerialNumber = big.NewInt(serial)
		tmpl.NotBefore = time.Now().Add(-time.Hour)
		tmpl.NotAfter = time.Now().Add(time.Hour)
		if parent == nil { // self-signed CA
			parent, parentKey = tmpl, key
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
		must(err)
		cert, err := x509.ParseCertificate(der)
		must(err)
		keyDER, err := x509.MarshalPKCS8PrivateKey(key)
		must(err)
		return cert, key,
			pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
			pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: keyDER})
	}
	caTmpl := func(name string) *x509.Certificate {
		return &x509.Certificate{
			Subject:               pkix.Name{CommonName: name},
			IsCA:                  true,
			BasicConstraintsValid: true,
			KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
		}
	}
	ca, caKey, caPEM, _ := issue(caTmpl("conntest CA"), nil, nil)
	_, _, otherPEM, _ := issue(caTmpl("conntest other CA"), nil, nil)
	_, _, srvPEM, srvKeyPEM := issue(&x509.Certificate{
		Subject:     pkix.Name{CommonName: "nats-server"},
		IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}, ca, caKey)
	_, _, cliPEM, cliKeyPEM := issue(&x509.Certificate{
		Subject:     pkix.Name{CommonName: "dispenser"},
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}, ca, caKey)
	return tlsFiles{
		ca:         writeFile(tb, dir, "ca.pem", caPEM),
		serverCert: writeFile(tb, dir, "server.pem", srvPEM),
		serverKey:  writeFile(tb, dir, "server-key.pem", srvKeyPEM),
		clientCert: writeFile(tb, dir, "client.pem", cliPEM),
		clientKey:  writeFile(tb, dir, "client-key.pem", cliKeyPEM),
		otherCA:    writeFile(tb, dir, "other-ca.pem", otherPEM),
	}
}

// serverTLS is a server TLS configuration that demands a client certificate from f's CA.
func (f tlsFiles) serverTLS(tb testing.TB) *tls.Config {
	tb.Helper()
	cert, err := tls.LoadX509KeyPair(f.serverCert, f.serverKey)
	if err != nil {
		tb.Fatalf("load server key pair: %v", err)
	}
	caPEM, err := os.ReadFile(f.ca)
	if err != nil {
		tb.Fatalf("read CA: %v", err)
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		tb.Fatal("CA PEM holds no certificate")
	}
	return &tls.Config{
		Certificates: []tls.Certificate{cert},
		ClientCAs:    pool,
		ClientAuth:   tls.RequireAndVerifyClientCert,
		MinVersion:   tls.VersionTLS12,
	}
}

// rejected is a configuration a server must turn away.
type rejected struct {
	name string
	cfg  ConnConfig // URLs is filled in by the test
	want string     // appears in the error, case-insensitively
	is   error      // when set, errors.Is(err, is) must hold
}

// TestConnAuthMethods connects to a real server per authentication method: the right
// credentials connect and carry a request/reply; wrong or missing ones fail promptly with
// an error that says what was refused.
func TestConnAuthMethods(t *testing.T) {
	t.Parallel()
	// Each case builds both sides, because the server must trust exactly the key, JWT or
	// certificate that the accepted client holds.
	tests := []struct {
		name  string
		setup func(t *testing.T, dir string) (*server.Options, ConnConfig, []rejected)
	}{
		{"user and password", func(*testing.T, string) (*server.Options, ConnConfig, []rejected) {
			return &server.Options{Username: "leaf", Password: "s3cret"},
				ConnConfig{User: "leaf", Password: "s3cret"},
				[]rejected{
					{"wrong password", ConnConfig{User: "leaf", Password: "guess"}, "authorization", nats.ErrAuthorization},
					{"unknown user", ConnConfig{User: "root", Password: "s3cret"}, "authorization", nats.ErrAuthorization},
					{"no credentials", ConnConfig{}, "authorization", nats.ErrAuthorization},
				}
		}},
		{"token", func(*testing.T, string) (*server.Options, ConnConfig, []rejected) {
			return &server.Options{Authorization: "t0ken-for-leaf"},
				ConnConfig{Token: "t0ken-for-leaf"},
				[]rejected{
					{"wrong token", ConnConfig{Token: "t0ken"}, "authorization", nats.ErrAuthorization},
					{"user instead of token", ConnConfig{User: "leaf", Password: "t0ken-for-leaf"}, "authorization", nats.ErrAuthorization},
					{"no credentials", ConnConfig{}, "authorization", nats.ErrAuthorization},
				}
		}},
		{"nkey", func(t *testing.T, dir string) (*server.Options, ConnConfig, []rejected) {
			seed, pub := userSeedFile(t, dir, "dispenser.nk")
			other, _ := userSeedFile(t, dir, "stranger.nk")
			return &server.Options{Nkeys: []*server.NkeyUser{{Nkey: pub}}},
				ConnConfig{NKeySeedFile: seed},
				[]rejected{
					{"unknown key", ConnConfig{NKeySeedFile: other}, "authorization", nats.ErrAuthorization},
					{"missing seed file", ConnConfig{NKeySeedFile: filepath.Join(dir, "absent.nk")}, "absent.nk", os.ErrNotExist},
					{"no credentials", ConnConfig{}, "authorization", nats.ErrAuthorization},
				}
		}},
		{"creds", func(t *testing.T, dir string) (*server.Options, ConnConfig, []rejected) {
			op := newOperatorSetup(t, dir)
			return &server.Options{
					TrustedOperators: []*jwt.OperatorClaims{op.operator},
					AccountResolver:  op.resolver,
				},
				ConnConfig{CredsFile: op.creds},
				[]rejected{
					{"account of another operator", ConnConfig{CredsFile: op.stranger}, "authorization", nats.ErrAuthorization},
					{"missing creds file", ConnConfig{CredsFile: filepath.Join(dir, "absent.creds")}, "absent.creds", os.ErrNotExist},
					{"no credentials", ConnConfig{}, "authorization", nats.ErrAuthorization},
				}
		}},
		{"mutual TLS", func(t *testing.T, dir string) (*server.Options, ConnConfig, []rejected) {
			f := newTLSFiles(t, dir)
			return &server.Options{TLSConfig: f.serverTLS(t), TLSVerify: true, TLSTimeout: 2},
				ConnConfig{TLSCA: f.ca, TLSCert: f.clientCert, TLSKey: f.clientKey},
				[]rejected{
					{"no client certificate", ConnConfig{TLSCA: f.ca}, "tls", nil},
					{"server from an unknown CA", ConnConfig{TLSCA: f.otherCA, TLSCert: f.clientCert, TLSKey: f.clientKey}, "certificate", nil},
					// nats.go upgrades to TLS by itself when the server requires it, but then
					// trusts only the system roots.
					{"no TLS settings", ConnConfig{}, "certificate", nil},
					{"missing CA file", ConnConfig{TLSCA: filepath.Join(dir, "absent-ca.pem")}, "absent-ca.pem", os.ErrNotExist},
				}
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			dir := t.TempDir()
			opts, ok, bad := tt.setup(t, dir)
			url := serverURL(startConnServer(t, opts))

			ok.URLs, ok.Name = url, "conntest-"+tt.name
			nc, err := connectBounded(t, ok, nil)
			if err != nil {
				t.Fatalf("Connect with the right credentials: %v", err)
			}
			roundTrip(t, nc)

			for _, r := range bad {
				r.cfg.URLs = url
				nc, err := connectBounded(t, r.cfg, nil)
				if err == nil {
					nc.Close()
					t.Errorf("%s: Connect succeeded, want an error", r.name)
					continue
				}
				if !strings.Contains(strings.ToLower(err.Error()), strings.ToLower(r.want)) {
					t.Errorf("%s: error %q does not mention %q", r.name, err, r.want)
				}
				if r.is != nil && !errors.Is(err, r.is) {
					t.Errorf("%s: error %q is not %v", r.name, err, r.is)
				}
				t.Logf("%s: %v", r.name, err)
			}
		})
	}
}

// TestConnValidate checks that every contradictory or incomplete configuration is refused
// before any connection attempt, with a message naming the flags involved.
func TestConnValidate(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	seed, _ := userSeedFile(t, dir, "user.nk")
	creds := newOperatorSetup(t, dir).creds
	f := newTLSFiles(t, dir)
	absent := filepath.Join(dir, "absent")
	const url = "nats://127.0.0.1:4222"

	tests := []struct {
		name string
		cfg  ConnConfig
		want []string // nil: valid; else each appears in the error
	}{
		{name: "url only", cfg: ConnConfig{URLs: url}},
		{name: "several urls", cfg: ConnConfig{URLs: url + ",nats://127.0.0.2:4222"}},
		{name: "user and password", cfg: ConnConfig{URLs: url, User: "leaf", Password: "pw"}},
		{name: "user without password", cfg: ConnConfig{URLs: url, User: "leaf"}},
		{name: "token", cfg: ConnConfig{URLs: url, Token: "tok"}},
		{name: "nkey", cfg: ConnConfig{URLs: url, NKeySeedFile: seed}},
		{name: "creds", cfg: ConnConfig{URLs: url, CredsFile: creds}},
		{name: "tls ca", cfg: ConnConfig{URLs: url, TLSCA: f.ca}},
		{name: "mutual tls", cfg: ConnConfig{URLs: url, TLSCA: f.ca, TLSCert: f.clientCert, TLSKey: f.clientKey}},
		{name: "client cert, system roots", cfg: ConnConfig{URLs: url, TLSCert: f.clientCert, TLSKey: f.clientKey}},
		{name: "tls with user", cfg: ConnConfig{URLs: url, User: "leaf", Password: "pw", TLSCA: f.ca}},

		{name: "no url", cfg: ConnConfig{}, want: []string{"URL"}},
		{name: "blank url", cfg: ConnConfig{URLs: "  "}, want: []string{"URL"}},
		{name: "password without user", cfg: ConnConfig{URLs: url, Password: "pw"}, want: []string{"--password", "--user"}},
		{name: "user and token", cfg: ConnConfig{URLs: url, User: "leaf", Password: "pw", Token: "tok"}, want: []string{"--user", "--token"}},
		{name: "token and nkey", cfg: ConnConfig{URLs: url, Token: "tok", NKeySeedFile: seed}, want: []string{"--token", "--nkey"}},
		{name: "nkey and creds", cfg: ConnConfig{URLs: url, NKeySeedFile: seed, CredsFile: creds}, want: []string{"--nkey", "--creds"}},
		{name: "user and creds", cfg: ConnConfig{URLs: url, User: "leaf", CredsFile: creds}, want: []string{"--user", "--creds"}},
		{name: "all four", cfg: ConnConfig{URLs: url, User: "leaf", Token: "tok", NKeySeedFile: seed, CredsFile: creds},
			want: []string{"--user", "--token", "--nkey", "--creds"}},
		{name: "tls cert without key", cfg: ConnConfig{URLs: url, TLSCA: f.ca, TLSCert: f.clientCert}, want: []string{"--tls-cert", "--tls-key"}},
		{name: "tls key without cert", cfg: ConnConfig{URLs: url, TLSCA: f.ca, TLSKey: f.clientKey}, want: []string{"--tls-cert", "--tls-key"}},

		{name: "missing nkey file", cfg: ConnConfig{URLs: url, NKeySeedFile: absent}, want: []string{"--nkey", absent}},
		{name: "missing creds file", cfg: ConnConfig{URLs: url, CredsFile: absent}, want: []string{"--creds", absent}},
		{name: "missing tls ca", cfg: ConnConfig{URLs: url, TLSCA: absent}, want: []string{"--tls-ca", absent}},
		{name: "missing tls cert", cfg: ConnConfig{URLs: url, TLSCert: absent, TLSKey: f.clientKey}, want: []string{"--tls-cert", absent}},
		{name: "missing tls key", cfg: ConnConfig{URLs: url, TLSCert: f.clientCert, TLSKey: absent}, want: []string{"--tls-key", absent}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			if tt.want == nil {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Validate() = nil, want an error naming %q", tt.want)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("Validate() = %q, does not name %q", err, w)
				}
			}
			// Options and Connect validate first, so they refuse the same configurations.
			if _, oerr := tt.cfg.Options(nil); oerr == nil {
				t.Errorf("Options() accepted what Validate refused: %v", err)
			}
		})
	}
}

// restartOnPort starts a fresh server with opts on port, retrying while the previous
// server's socket is still being released.
func restartOnPort(tb testing.TB, opts server.Options, port int) *server.Server {
	tb.Helper()
	var lastErr error
	for range 50 {
		ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err == nil {
			_ = ln.Close()
			o := opts
			o.Port = port
			return startConnServer(tb, &o)
		}
		lastErr = err
		time.Sleep(50 * time.Millisecond)
	}
	tb.Fatalf("port %d not free again: %v", port, lastErr)
	return nil
}

// TestConnReconnectLogged stops the server under a connection and starts a new one on the
// same port: the connection comes back by itself and the log shows both the loss and the
// return, which is what an operator reads during an outage.
func TestConnReconnectLogged(t *testing.T) {
	t.Parallel()
	srv := startConnServer(t, &server.Options{})
	port := srv.Addr().(*net.TCPAddr).Port
	logs := &testutil.SyncBuffer{}
	logger := slog.New(slog.NewTextHandler(logs, nil))

	nc, err := connectBounded(t, ConnConfig{URLs: serverURL(srv), Name: "conntest-reconnect"}, logger)
	if err != nil {
		t.Fatalf("Connect: %v", err)
	}
	roundTrip(t, nc)

	srv.Shutdown()
	srv.WaitForShutdown()
	down := logs.WaitLine(t, 5*time.Second, "NATS disconnected")
	if !strings.Contains(down, "level=WARN") {
		t.Errorf("disconnect logged as %q, want a warning", down)
	}

	restartOnPort(t, server.Options{}, port)
	up := logs.WaitLine(t, 10*time.Second, "NATS reconnected")
	// The error text may hold the address too, so look for the attribute itself.
	named := "server=nats://127.0.0.1:" + strconv.Itoa(port)
	if want := named; !strings.Contains(up, want) {
		t.Errorf("reconnect line %q does not name the server %s", up, want)
	}
	roundTrip(t, nc)

	t.Run("disconnect names the server", func(t *testing.T) {
		want := named
		if !strings.Contains(down, want) {
			t.Errorf("disconnect line %q does not name the server %s", down, want)
		}
	})

	nc.Close()
	logs.WaitLine(t, 5*time.Second, "NATS connection closed")
	if l := logs.Line("NATS asynchronous error"); l != "" {
		t.Errorf("unexpected asynchronous error: %s", l)
	}
}

// TestConnSurvivesRejectingServer restarts the server first with a configuration that
// rejects the dispenser's credentials (a credential rotation caught half way, a botched
// reload), then fixed. ConnConfig promises to reconnect forever, so the connection must
// come back once the server accepts it again.
func TestConnSurvivesRejectingServer(t *testing.T) {
	t.Parallel()
	srv := startConnServer(t, &server.Options{Username: "leaf", Password: "s3cret"})
	port := srv.Addr().(*net.TCPAddr).Port
	logs := &testutil.SyncBuffer{}
	logger := slog.New(slog.NewTextHandler(logs, nil))
	nc, err := connectBounded(t, ConnConfig{URLs: serverURL(srv), User: "leaf", Password: "s3cret"}, logger)
	if err != nil {
		t.Fatalf("Connect: %v", err)
	}
	roundTrip(t, nc)

	srv.Shutdown()
	srv.WaitForShutdown()
	logs.WaitLine(t, 5*time.Second, "NATS disconnected")

	wrong := restartOnPort(t, server.Options{Username: "leaf", Password: "rotated"}, port)
	// Two refusals in a row is when nats.go gives up by default.
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("connection log:\n%s", logs)
		}
	})
	testutil.Eventually(t, 10*time.Second, "two refused attempts (or a closed connection)", func() bool {
		return strings.Count(strings.ToLower(logs.String()), "authorization violation") >= 2 || logs.Line("NATS connection closed") != ""
	})
	wrong.Shutdown()
	wrong.WaitForShutdown()

	restartOnPort(t, server.Options{Username: "leaf", Password: "s3cret"}, port)
	l := logs.WaitLine(t, 10*time.Second, "NATS reconnected", "NATS connection closed")
	if closed := logs.Line("NATS connection closed"); closed != "" {
		t.Fatalf("connection closed after auth errors instead of retrying: %s\nlog:\n%s", closed, logs)
	}
	if !strings.Contains(l, "NATS reconnected") {
		t.Fatalf("want a reconnect, log:\n%s", logs)
	}
	roundTrip(t, nc)
}

// TestReconnectDelay: the reconnect delay is 250ms doubling to 5s, plus up to half
// again at random, from the first attempt (nats.go may count from 0 or 1) on.
func TestReconnectDelay(t *testing.T) {
	for attempt := 0; attempt <= 12; attempt++ {
		base := min(250*time.Millisecond<<max(attempt-1, 0), 5*time.Second)
		lo, hi := time.Duration(1<<63-1), time.Duration(0)
		for range 500 {
			d := reconnectPolicy.Delay(attempt)
			lo, hi = min(lo, d), max(hi, d)
		}
		if lo < base || hi > base*3/2 {
			t.Errorf("Delay(%d) ranged over [%v, %v], want within [%v, %v]", attempt, lo, hi, base, base*3/2)
		}
	}
}

// TestConnectErrorKeepsCredentialsOut: a connection that fails names the servers without
// the user information a URL may carry (a password, a token).
func TestConnectErrorKeepsCredentialsOut(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ln := l.Addr().String()
	l.Close() // nothing listens there now: the connect is refused
	cfg := ConnConfig{URLs: "nats://app:s3cret-pw@" + ln + ", nats://t0ken-value@" + ln}
	_, err = cfg.Connect(nil)
	if err == nil {
		t.Fatal("Connect to a closed port succeeded")
	}
	for _, secret := range []string{"s3cret-pw", "t0ken-value", "app:"} {
		if strings.Contains(err.Error(), secret) {
			t.Errorf("Connect error %q carries %q", err, secret)
		}
	}
	if !strings.Contains(err.Error(), ln) {
		t.Errorf("Connect error %q does not name the server %s", err, ln)
	}
	if got, want := RedactURLs(" nats://a:b@h1:4222 ,nats://h2:4222,"), "nats://h1:4222,nats://h2:4222"; got != want {
		t.Errorf("RedactURLs = %q, want %q", got, want)
	}
	for in, want := range map[string]string{
		"a:s3cret@h1:4222":            "h1:4222",
		"nats://a:s3cret%zz@h1:4222":  "nats://h1:4222",
		"nats://a:s3c#ret@h1:4222":    "nats://h1:4222",
		"tls://t0ken@h1:4222,h2:4222": "tls://h1:4222,h2:4222",
		"nats://a:p@ss@h1:4222":       "nats://h1:4222",
		"nats://a:s3c,ret@h1:4222":    "nats://h1:4222",
		"nats://h0:4222,a:s,3,c@h1":   "nats://h1", // one URL or two: either way no password
		"nats://h0,nats://a:s3c@h1":   "nats://h0,nats://h1",
	} {
		if got := RedactURLs(in); got != want {
			t.Errorf("RedactURLs(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestValidateURLsKeepsCredentialsOut: a URL whose password nats.go would misread (it
// does not parse, or part of it lands in the host, path or next URL) is refused by
// Validate, naming the URL without the password; a percent-encoded one passes.
func TestValidateURLsKeepsCredentialsOut(t *testing.T) {
	for _, pw := range []string{"s3c%ret", "s3c ret", "s3c,ret", "s3c/ret", "s3c?ret", "s3c#ret", "s3c%zzret"} {
		for _, urls := range []string{"nats://bob:" + pw + "@h1:4222", "bob:" + pw + "@h1:4222", "nats://h0:4222,nats://" + pw + "@h1:4222"} {
			err := ConnConfig{URLs: urls}.Validate()
			if err == nil || strings.Contains(err.Error(), "s3c") || !strings.Contains(err.Error(), "h1:4222") {
				t.Errorf("Validate(%q) = %v: want an error naming h1:4222 without the password", urls, err)
			}
		}
		enc := strings.ReplaceAll(url.UserPassword("bob", pw).String(), ",", "%2C") // a comma is the list's
		if err := (ConnConfig{URLs: "nats://" + enc + "@h1:4222,nats://h0:4222,nats://bob:pw@h2,h3"}).Validate(); err != nil {
			t.Errorf("the password %q percent-encoded: %v", pw, err)
		}
	}
}

// TestEveryMinute: the slow consumer line, which anyone who floods an inbox can cause,
// is let through once a minute with the count of those held back.
func TestEveryMinute(t *testing.T) {
	var e everyMinute
	t0 := time.Unix(1_763_790_000, 0)
	for i, step := range []struct {
		at      time.Duration
		wantOK  bool
		wantHid int
	}{{0, true, 0}, {time.Second, false, 0}, {59 * time.Second, false, 0}, {time.Minute, true, 2}, {61 * time.Second, false, 0}, {3 * time.Minute, true, 1}} {
		if n, ok := e.due(t0.Add(step.at)); ok != step.wantOK || n != step.wantHid {
			t.Errorf("step %d at %v: due = %d, %v; want %d, %v", i, step.at, n, ok, step.wantHid, step.wantOK)
		}
	}
}
