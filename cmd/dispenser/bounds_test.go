package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/leafbus/leafbus/internal/testutil"
)

// TestBinaryFileInputsBounded: every file the dispenser reads itself, given something
// that is no regular file (/dev/zero, a named pipe, a directory) or a file that is not
// what the flag takes (an NKey seed, a .creds file), is refused at once with an error
// that names the flag and the file: no memory eaten, no open that waits for a writer,
// no connection attempt that waits out --start-timeout. Each run joins a closed port
// with a start timeout of a minute, so a run that tried to connect would not exit
// within the bound.
func TestBinaryFileInputsBounded(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	t.Parallel()
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	notSeed := filepath.Join(dir, "not-a-seed.nk")
	if err := os.WriteFile(notSeed, []byte("SUthis-is-no-seed\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	seed, _ := testutil.NKeySeedFile(t, dir)
	closed := fmt.Sprintf("nats://127.0.0.1:%d", freePort(t))
	for _, tt := range []struct {
		name string
		args []string
		want string
	}{
		{"ConfigDevZero", []string{"--config", "/dev/zero"}, "--config /dev/zero: not a regular file"},
		{"ConfigFIFO", []string{"--config", fifo}, "--config " + fifo + ": not a regular file (a named pipe)"},
		{"LeafPropertiesDevZero", []string{"--leaf-properties", "/dev/zero"}, "--leaf-properties /dev/zero: not a regular file"},
		{"LeafPropertiesFIFO", []string{"--leaf-properties", fifo}, "--leaf-properties " + fifo + ": not a regular file"},
		{"LeafPropertiesDir", []string{"--leaf-properties", dir}, "--leaf-properties " + dir + ": not a regular file (a directory)"},
		{"IDKeyDevZero", []string{"--id-key-file", "/dev/zero"}, "--id-key-file /dev/zero: not a regular file"},
		{"IDKeyFIFO", []string{"--id-key-file", fifo}, "--id-key-file " + fifo + ": not a regular file"},
		{"NKeyNotASeed", []string{"--nkey", notSeed}, "--nkey " + notSeed + ": no NKey user seed"},
		{"NKeyDevZero", []string{"--nkey", "/dev/zero"}, "--nkey /dev/zero: not a regular file"},
		{"CredsNotCreds", []string{"--creds", seed}, "--creds " + seed + ": not a .creds file"},
		{"CredsFIFO", []string{"--creds", fifo}, "--creds " + fifo + ": not a regular file"},
		{"ServiceCredsNotCreds", []string{"--service-creds", notSeed}, "--service-creds " + notSeed + ": not a .creds file"},
		{"NATSConfigFIFO", []string{"--nats-config", fifo}, "--nats-config " + fifo + ": not a regular file"},
		{"TLSCAFIFO", []string{"--tls-ca", fifo}, "--tls-ca " + fifo + ": not a regular file"},
		{"ServiceNKeyNotASeed", []string{"--service-nkey", notSeed}, "--service-nkey " + notSeed + ": no NKey user seed"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			args := append([]string{"--data-dir", t.TempDir(), "--node-id", "bounds", "--http", "",
				"--nats", closed, "--start-timeout", "1m"}, tt.args...)
			code, stderr, _ := runToExit(t, 30*time.Second, nil, args...)
			if code == 0 || !strings.Contains(stderr, tt.want) {
				t.Fatalf("exit %d, want an error naming %q; stderr:\n%s", code, tt.want, stderr)
			}
			if strings.Contains(stderr, "connect to NATS") || strings.Contains(stderr, "retry") {
				t.Errorf("a connection was attempted; stderr:\n%s", stderr)
			}
		})
	}
}
