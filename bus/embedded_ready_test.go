package bus

import (
	"net"
	"strings"
	"testing"
	"time"
)

// TestEmbeddedPortTaken: a --listen port another process holds fails the start at once
// with the server's own reason, instead of after the 30 s readiness wait.
func TestEmbeddedPortTaken(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	start := time.Now()
	e, err := StartEmbedded(EmbeddedConfig{Listen: l.Addr().String(), DataDir: t.TempDir()})
	took := time.Since(start)
	if err == nil {
		e.Shutdown()
		t.Fatalf("StartEmbedded on a taken port succeeded")
	}
	if !strings.Contains(err.Error(), "address already in use") || !strings.Contains(err.Error(), l.Addr().String()) {
		t.Errorf("StartEmbedded on a taken port = %v, want the address and \"address already in use\"", err)
	}
	if took > 2*time.Second {
		t.Errorf("refusal took %v, want under 2s", took)
	}
}
