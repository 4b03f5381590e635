package bus

import (
	"testing"
	"time"
)

// TestEmbeddedLiveness: the embedded server drops a connection whose other end stopped
// (a SIGSTOPped dispenser) within seconds: it pings every 2 s, drops a connection after
// 2 pings without an answer and after a write blocked for 2 s; a --nats-config that sets
// these values wins.
func TestEmbeddedLiveness(t *testing.T) {
	e, err := StartEmbedded(EmbeddedConfig{Listen: "127.0.0.1:0", DataDir: t.TempDir(), Name: "liveness"})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Shutdown()
	v, err := e.Varz()
	if err != nil {
		t.Fatal(err)
	}
	if v.PingInterval != 2*time.Second || v.MaxPingsOut != 2 || v.WriteDeadline != 2*time.Second {
		t.Errorf("running embedded server: ping_interval %v, ping_max %d, write_deadline %v; want 2s, 2, 2s", v.PingInterval, v.MaxPingsOut, v.WriteDeadline)
	}

	c := EmbeddedConfig{Listen: "127.0.0.1:0", DataDir: t.TempDir(), ConfigFile: writeConf(t, "ping_interval: 30s\nping_max: 5\nwrite_deadline: 7s\n")}
	opts, _, err := c.serverOptions()
	if err != nil {
		t.Fatal(err)
	}
	if opts.PingInterval != 30*time.Second || opts.MaxPingsOut != 5 || opts.WriteDeadline != 7*time.Second {
		t.Errorf("--nats-config with its own values: ping_interval %v, ping_max %d, write_deadline %v; want the file's 30s, 5, 7s", opts.PingInterval, opts.MaxPingsOut, opts.WriteDeadline)
	}
}
