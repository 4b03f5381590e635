package main

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/leafbus/leafbus/dispenser"
	"github.com/leafbus/leafbus/testenv"
)

// TestBinaryCleanStopLogsInfoOnly: a dispenser stopped by SIGTERM or SIGINT while
// requests arrive over NATS and HTTP exits 0 and logs nothing at WARN or ERROR, which
// alerts fire on. Embedded, and joined to a NATS server of its own (--nats).
func TestBinaryCleanStopLogsInfoOnly(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	t.Parallel()
	srv := testenv.StartNATS(t)
	for _, tt := range []struct {
		name string
		sig  syscall.Signal
		args []string
	}{
		{"EmbeddedSIGTERM", syscall.SIGTERM, nil},
		{"JoinedSIGINT", syscall.SIGINT, []string{"--nats", srv.URL(), "--pool", "segment:" + dispenser.SampleTagName + ":10:2"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			httpAddr := fmt.Sprintf("127.0.0.1:%d", freePort(t))
			p := startBinary(t, t.TempDir(), append([]string{"--http", httpAddr}, tt.args...)...)
			nc, err := nats.Connect(p.url)
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			// Requests on both faces until the process has exited.
			ctx, cancel := context.WithCancel(context.Background())
			var wg sync.WaitGroup
			answered := make(chan struct{}, 1)
			wg.Add(2)
			go func() {
				defer wg.Done()
				for ctx.Err() == nil {
					if _, err := nc.Request("leaf.segment."+dispenser.SampleTagName, nil, time.Second); err == nil {
						select {
						case answered <- struct{}{}:
						default:
						}
					}
				}
			}()
			go func() {
				defer wg.Done()
				hc := &http.Client{Timeout: time.Second}
				for ctx.Err() == nil {
					if resp, err := hc.Get("http://" + httpAddr + "/api/segment/get/" + dispenser.SampleTagName); err == nil {
						resp.Body.Close()
					}
				}
			}()
			defer func() { cancel(); wg.Wait() }()
			select {
			case <-answered:
			case <-time.After(30 * time.Second):
				t.Fatal("no request answered within 30s")
			}
			if err := p.cmd.Process.Signal(tt.sig); err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-p.done:
				p.done <- err
				if err != nil {
					t.Fatalf("exit after %v: %v, want code 0\nstderr:\n%s", tt.sig, err, p.stderr.String())
				}
			case <-time.After(30 * time.Second):
				t.Fatalf("no exit within 30s of %v\nstderr:\n%s", tt.sig, p.stderr.String())
			}
			for _, line := range strings.Split(p.stderr.String(), "\n") {
				if strings.Contains(line, "level=WARN") || strings.Contains(line, "level=ERROR") {
					t.Errorf("a clean stop logged: %s", line)
				}
			}
		})
	}
}
