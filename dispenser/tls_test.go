package dispenser

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/leafbus/leafbus/client"
	"github.com/leafbus/leafbus/internal/testutil"
)

// testPKI is a CA and a server and a client certificate it signed, as PEM files.
type testPKI struct{ ca, serverCert, serverKey, clientCert, clientKey string }

func newTestPKI(tb testing.TB) testPKI {
	tb.Helper()
	dir := tb.TempDir()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		tb.Fatal(err)
	}
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "leafbus test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		tb.Fatal(err)
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		tb.Fatal(err)
	}
	p := testPKI{ca: filepath.Join(dir, "ca.pem")}
	writePEM(tb, p.ca, "CERTIFICATE", caDER)
	issue := func(serial int64, name string, usage x509.ExtKeyUsage) (certFile, keyFile string) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			tb.Fatal(err)
		}
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
			IPAddresses: []net.IP{net.IPv4(127, 0, 0, 1)},
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
		if err != nil {
			tb.Fatal(err)
		}
		keyDER, err := x509.MarshalECPrivateKey(key)
		if err != nil {
			tb.Fatal(err)
		}
		certFile, keyFile = filepath.Join(dir, name+".pem"), filepath.Join(dir, name+"-key.pem")
		writePEM(tb, certFile, "CERTIFICATE", der)
		writePEM(tb, keyFile, "EC PRIVATE KEY", keyDER)
		return certFile, keyFile
	}
	p.serverCert, p.serverKey = issue(2, "server", x509.ExtKeyUsageServerAuth)
	p.clientCert, p.clientKey = issue(3, "client", x509.ExtKeyUsageClientAuth)
	return p
}

func writePEM(tb testing.TB, path, kind string, der []byte) {
	tb.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600); err != nil {
		tb.Fatal(err)
	}
}

// TestNATSConfigTLSMappedUser: with a configuration whose users are the subjects of
// client certificates (verify_and_map), the dispenser's in-process connections present
// the certificate of the TLS flags, as a TCP client does; without it they are refused.
// (A configuration that only verifies certificates, with no users, lets in-process
// connections in without one: nats-server trusts the process it runs in.)
func TestNATSConfigTLSMappedUser(t *testing.T) {
	p := newTestPKI(t)
	conf := writeConf(t, fmt.Sprintf(`tls {
  cert_file: %q
  key_file: %q
  ca_file: %q
  verify_and_map: true
}
authorization { users: [ { user: "CN=client" } ] }
`, p.serverCert, p.serverKey, p.ca))

	cfg := testConfig(t)
	cfg.NATSConfig = conf
	_, err := newTest(t, cfg)
	testutil.CheckErr(t, "New without a client certificate", err, nats.ErrAuthorization, "")

	cfg = testConfig(t)
	cfg.NATSConfig = conf
	cfg.Conn.TLSCA, cfg.Conn.TLSCert, cfg.Conn.TLSKey = p.ca, p.clientCert, p.clientKey
	d, err := newTest(t, cfg)
	if err != nil {
		t.Fatalf("New with a client certificate: %v", err)
	}
	runReady(t, d)
	nc, err := nats.Connect(d.ClientURL(), nats.RootCAs(p.ca), nats.ClientCert(p.clientCert, p.clientKey), nats.MaxReconnects(0))
	if err != nil {
		t.Fatalf("connect over TCP with the client certificate: %v", err)
	}
	defer nc.Close()
	c, err := client.NewClient(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Segment(testutil.Context(t, 10*time.Second), SampleTagName); err != nil {
		t.Fatalf("Segment as the certificate's user: %v", err)
	}
}
