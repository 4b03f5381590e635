package bus

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"
)

// writeConf writes a nats-server configuration file for a test.
func writeConf(tb testing.TB, text string) string {
	tb.Helper()
	p := filepath.Join(tb.TempDir(), "nats.conf")
	if err := os.WriteFile(p, []byte(text), 0o600); err != nil {
		tb.Fatal(err)
	}
	return p
}

// TestCheckExposure: which listen hosts and configurations count as exposed without
// authentication.
func TestCheckExposure(t *testing.T) {
	tests := []struct {
		name, listen, conf string
		insecure           bool
		wantErr            bool
		wantWarn           bool
	}{
		{"Loopback", "127.0.0.1:4222", "", false, false, false},
		{"LoopbackOther", "127.0.0.9:4222", "", false, false, false},
		{"IPv6Loopback", "[::1]:4222", "", false, false, false},
		{"Localhost", "localhost:4222", "", false, false, false},
		{"EveryInterface", "0.0.0.0:4222", "", false, true, false},
		{"EveryInterfaceInsecure", "0.0.0.0:4222", "", true, false, true},
		{"PrivateIP", "10.0.0.5:4222", "", false, true, false},
		{"Users", "0.0.0.0:4222", "authorization { users: [{user: a, password: b}] }", false, false, false},
		{"Token", "0.0.0.0:4222", "authorization { token: s3cret }", false, false, false},
		{"SingleUser", "0.0.0.0:4222", "authorization { user: a, password: b }", false, false, false},
		{"Accounts", "0.0.0.0:4222", "accounts { A { users: [{user: a, password: b}] } }", false, false, false},
		{"NoAuthUser", "0.0.0.0:4222", "accounts { A { users: [{user: a, password: b}] } }\nno_auth_user: a", false, false, false},
		{"JetStreamOnly", "0.0.0.0:4222", "jetstream {}", false, true, false},
		{"UsersInsecure", "0.0.0.0:4222", "authorization { token: s3cret }", true, false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := EmbeddedConfig{Listen: tt.listen, DataDir: t.TempDir(), InsecureListen: tt.insecure}
			if tt.conf != "" {
				c.ConfigFile = writeConf(t, tt.conf)
			}
			opts, _, err := c.serverOptions()
			if err != nil {
				t.Fatalf("serverOptions: %v", err)
			}
			warn, err := c.checkExposure(opts)
			if (err != nil) != tt.wantErr {
				t.Errorf("checkExposure(%s, %q) error %v, want error %v", tt.listen, tt.conf, err, tt.wantErr)
			}
			if (warn != "") != tt.wantWarn {
				t.Errorf("checkExposure(%s, %q) warning %q, want warning %v", tt.listen, tt.conf, warn, tt.wantWarn)
			}
		})
	}
}

// TestServerOptionsFromFile: with --nats-config the flags still decide the client
// address, the store and monitoring, and say so; the file's users and server name stay.
func TestServerOptionsFromFile(t *testing.T) {
	conf := writeConf(t, `
server_name: from-file
host: 0.0.0.0
port: 4333
http_port: 8333
jetstream { store_dir: /somewhere/else }
authorization { users: [{user: a, password: b}] }
`)
	dir := t.TempDir()
	c := EmbeddedConfig{Listen: "127.0.0.1:0", DataDir: dir, Monitor: "127.0.0.1:8444", Name: "node", ConfigFile: conf}
	opts, notes, err := c.serverOptions()
	if err != nil {
		t.Fatal(err)
	}
	if opts.Host != "127.0.0.1" || opts.Port != server.RANDOM_PORT || opts.StoreDir != dir || !opts.JetStream ||
		opts.HTTPHost != "127.0.0.1" || opts.HTTPPort != 8444 || opts.ServerName != "from-file" || len(opts.Users) != 1 || !opts.NoSigs {
		t.Errorf("serverOptions = host %q port %d store %q jetstream %v monitor %s:%d name %q users %d nosigs %v",
			opts.Host, opts.Port, opts.StoreDir, opts.JetStream, opts.HTTPHost, opts.HTTPPort, opts.ServerName, len(opts.Users), opts.NoSigs)
	}
	all := strings.Join(notes, "\n")
	for _, want := range []string{"--listen 127.0.0.1:0 wins over the client address 0.0.0.0:4333", "--data-dir " + dir + " wins over the JetStream store_dir /somewhere/else", "--monitor 127.0.0.1:8444 wins"} {
		if !strings.Contains(all, want) {
			t.Errorf("notes %q: want one saying %q", notes, want)
		}
	}

	c.ConfigFile = writeConf(t, "this is { not a config")
	if _, _, err := c.serverOptions(); err == nil || !strings.Contains(err.Error(), "--nats-config "+c.ConfigFile) {
		t.Errorf("serverOptions with a broken file: %v, want an error naming --nats-config and the file", err)
	}
}
