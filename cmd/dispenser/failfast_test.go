package main

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
)

// waitingLine is what the dispenser logs each time its start waits for a dependency.
const waitingLine = "waiting for a dependency to become ready"

// TestBinaryUnhealableExitsAtOnce runs the real binary with mistakes that no wait
// mends, each with 20 s of --start-timeout to wait for dependencies: each exits 1 after
// its first attempt (no wait logged), naming the flag or file to check (issue 21).
func TestBinaryUnhealableExitsAtOnce(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	secured := natsWithUsers(t)
	garbage := t.TempDir()
	const node = "unhealable"
	if err := os.WriteFile(filepath.Join(garbage, "leaf-workerid-"+node+".json"), []byte("garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		dataDir string
		args    []string
		want    []string
	}{
		{"WrongPassword", "", []string{"--nats", secured, "--user", "dispenser", "--password", "wrong"},
			[]string{`refuses user "dispenser": check --user/--password`, "Authorization Violation"}},
		{"NoCredentials", "", []string{"--nats", secured},
			[]string{"refuses a connection with no credentials", "--user/--password, --creds, --nkey or --token"}},
		{"KVReplicasEmbedded", "", []string{"--kv-replicas", "3"},
			[]string{"--kv-replicas 3: the embedded NATS server is not clustered", "use --kv-replicas 1"}},
		{"CorruptCacheFile", garbage, nil,
			[]string{"--data-dir " + garbage + " holds a corrupt file", filepath.Join(garbage, "leaf-workerid-"+node+".json")}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := tt.dataDir
			if dir == "" {
				dir = t.TempDir()
			}
			args := append([]string{"--data-dir", dir, "--node-id", node, "--http", "", "--start-timeout", "20s"}, tt.args...)
			if !strings.Contains(strings.Join(tt.args, " "), "--nats ") {
				args = append([]string{"--listen", fmt.Sprintf("127.0.0.1:%d", freePort(t))}, args...)
			}
			code, stderr, took := runToExit(t, 40*time.Second, nil, args...)
			if code != 1 {
				t.Fatalf("exit %d, want 1\nstderr:\n%s", code, stderr)
			}
			if strings.Contains(stderr, waitingLine) {
				t.Errorf("the start waited for a dependency, want it to end after one attempt:\n%s", stderr)
			}
			line := stderr[strings.LastIndex(stderr, "dispenser: "):]
			for _, want := range tt.want {
				if !strings.Contains(line, want) {
					t.Errorf("last message %q does not contain %q", line, want)
				}
			}
			t.Logf("exit %d after %v: %s", code, took.Round(time.Millisecond), strings.TrimSpace(line))
		})
	}
}

// natsWithUsers starts a nats-server with JetStream that lets in user dispenser with
// password "right" only, and returns its URL.
func natsWithUsers(tb testing.TB) string {
	tb.Helper()
	srv, err := server.NewServer(&server.Options{
		Host: "127.0.0.1", Port: server.RANDOM_PORT, JetStream: true, StoreDir: tb.TempDir(),
		NoLog: true, NoSigs: true,
		Users: []*server.User{{Username: "dispenser", Password: "right"}},
	})
	if err != nil {
		tb.Fatal(err)
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
