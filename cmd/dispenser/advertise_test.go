package main

import "testing"

// TestAdvertiseIdentity: with the zk and mysql registries --advertise is the identity a
// dispenser keeps its worker ID under. Where its default (the first IPv4 address and
// --listen's port) is no identity, the start is a usage error that names --advertise:
// with --nats there is no listen port of its own, and with --listen host:0 the port is
// a new one at every start and the same string for every such dispenser on the host.
// Given, or derived from a --listen port the dispenser holds, it starts.
func TestAdvertiseIdentity(t *testing.T) {
	const dsn = "u:p@tcp(127.0.0.1:3306)/leaf"
	tests := []struct {
		name    string
		args    []string
		wantErr string // "" for a configuration that parses
	}{
		{"ErrZKWithNATS", []string{"--nats", "nats://n1:4222", "--worker-registry", "zk", "--zk", "zk1:2181"}, "--worker-registry zk with --nats needs --advertise"},
		{"ErrMySQLWithNATS", []string{"--nats", "nats://n1:4222", "--worker-registry", "mysql", "--mysql-dsn", dsn}, "--worker-registry mysql with --nats needs --advertise"},
		{"ErrZKRandomPort", []string{"--listen", "127.0.0.1:0", "--worker-registry", "zk", "--zk", "zk1:2181"}, "--listen 127.0.0.1:0 needs --advertise"},
		{"ErrMySQLRandomPort", []string{"--listen", "127.0.0.1:0", "--worker-registry", "mysql", "--mysql-dsn", dsn}, "--listen 127.0.0.1:0 needs --advertise"},
		{"ZKWithNATSAndAdvertise", []string{"--nats", "nats://n1:4222", "--worker-registry", "zk", "--zk", "zk1:2181", "--advertise", "10.0.0.5:8081"}, ""},
		{"ZKRandomPortAndAdvertise", []string{"--listen", "127.0.0.1:0", "--worker-registry", "zk", "--zk", "zk1:2181", "--advertise", "10.0.0.5:8081"}, ""},
		{"ZKEmbeddedListenPort", []string{"--listen", "127.0.0.1:4223", "--worker-registry", "zk", "--zk", "zk1:2181"}, ""},
		{"KVRandomPort", []string{"--listen", "127.0.0.1:0"}, ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := parseWith(tt.args, nil)
			if tt.wantErr != "" {
				wantUsageError(t, tt.args, err, tt.wantErr)
				return
			}
			if err != nil {
				t.Fatalf("parse(%q): %v", tt.args, err)
			}
		})
	}
}
