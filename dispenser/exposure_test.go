package dispenser

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/leafbus/leafbus/bus"
	"github.com/leafbus/leafbus/internal/testutil"
)

// withLoopback decides which --listen hosts count as loopback, so that a test can play
// an exposed server on 127.0.0.1 instead of opening a port on every interface.
func withLoopback(f func(host string) bool) Option {
	return func(o *options) error {
		o.loopback = f
		return nil
	}
}

func withInsecureWarnEvery(d time.Duration) Option {
	return func(o *options) error {
		o.insecureWarnEvery = d
		return nil
	}
}

func nothingIsLoopback(string) bool { return false }

// writeConf writes a nats-server configuration file for a test.
func writeConf(tb testing.TB, text string) string {
	tb.Helper()
	p := filepath.Join(tb.TempDir(), "nats.conf")
	if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
		tb.Fatal(err)
	}
	return p
}

// TestExposedWithoutAuthRefused: an embedded server that others could reach and that
// asks nobody for credentials does not start; the message names both ways out. Every
// refusal comes before the server listens anywhere.
func TestExposedWithoutAuthRefused(t *testing.T) {
	noUsers := writeConf(t, "jetstream {}\n")
	tests := []struct {
		name     string
		listen   string
		conf     string
		loopback func(string) bool
		wantMsg  string
	}{
		{"EveryInterface", "0.0.0.0:0", "", nil, "give --nats-config with a configuration that has users"},
		{"IPv6EveryInterface", "[::]:0", "", nil, "--insecure-listen"},
		{"HostName", "leafbus.example:0", "", nil, "--listen leafbus.example:0 is reachable from other hosts"},
		{"ConfigWithoutUsers", "0.0.0.0:0", noUsers, nil, "add users (or a token, nkeys, TLS client verification) to " + noUsers},
		{"ExposedLoopbackStandIn", "127.0.0.1:0", "", nothingIsLoopback, "or add --insecure-listen to run it like this anyway"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := testConfig(t)
			cfg.Listen, cfg.NATSConfig = tt.listen, tt.conf
			_, err := newTest(t, cfg, withLoopback(tt.loopback))
			testutil.CheckErr(t, "New", err, bus.ErrUnauthenticatedListen, tt.wantMsg)
		})
	}
}

// TestInsecureListenWarns: --insecure-listen starts the exposed server anyway, warns at
// start, and warns again at every interval (a minute in production) while it runs.
func TestInsecureListenWarns(t *testing.T) {
	var logs testutil.SyncBuffer
	cfg := testConfig(t)
	cfg.InsecureListen = true
	d, err := newTest(t, cfg, WithLogger(testLogger(t, &logs)), withLoopback(nothingIsLoopback), withInsecureWarnEvery(50*time.Millisecond))
	if err != nil {
		t.Fatalf("New with --insecure-listen: %v", err)
	}
	startWarnings := strings.Count(logs.String(), "INSECURE")
	if startWarnings != 1 {
		t.Fatalf("%d warnings at start, want 1; logs:\n%s", startWarnings, logs.String())
	}
	line := logs.Line("INSECURE")
	for _, want := range []string{"level=WARN", "--insecure-listen", "127.0.0.1:0", "make IDs repeat", "--nats-config"} {
		if !strings.Contains(line, want) {
			t.Errorf("start warning %q: want it to contain %q", line, want)
		}
	}
	runReady(t, d)
	testutil.Eventually(t, 10*time.Second, "three more warnings while running", func() bool {
		return strings.Count(logs.String(), "INSECURE") >= 4
	})
}

// TestNoInsecureWarning: on loopback, or with users, there is nothing to warn about,
// --insecure-listen or not.
func TestNoInsecureWarning(t *testing.T) {
	var logs testutil.SyncBuffer
	cfg := testConfig(t)
	cfg.InsecureListen = true
	d, err := newTest(t, cfg, WithLogger(testLogger(t, &logs)), withInsecureWarnEvery(time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	runReady(t, d)
	time.Sleep(50 * time.Millisecond)
	if line := logs.Line("INSECURE"); line != "" {
		t.Errorf("on 127.0.0.1: %q, want no warning", line)
	}
}

// testLogger logs to both the test log and w.
func testLogger(tb testing.TB, w *testutil.SyncBuffer) *slog.Logger {
	return slog.New(slog.NewTextHandler(io.MultiWriter(testutil.LogWriter(tb), w), &slog.HandlerOptions{Level: slog.LevelDebug}))
}
