package httpapi_test

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/leafbus/leafbus/core"
	"github.com/leafbus/leafbus/httpapi"
	"github.com/leafbus/leafbus/internal/testutil"
)

// now is the clock of the readiness tests.
var now = time.Date(2026, 11, 23, 10, 0, 0, 0, time.UTC)

// healthy is a node that serves both kinds safely.
func healthy() core.Health {
	return core.Health{TagsLoaded: true, WorkerIDHeld: true, LastBeat: now.Add(-2 * time.Second)}
}

func probeServer(tb testing.TB, h func() core.Health) string {
	tb.Helper()
	cfg := httpapi.DefaultConfig()
	cfg.Now = func() time.Time { return now }
	if h != nil {
		cfg.Readiness = core.ReadinessFunc(h)
	}
	_, addr := startServer(tb, cfg)
	return "http://" + addr
}

func TestReadyz(t *testing.T) {
	for _, c := range []struct {
		name   string
		health func(*core.Health)
		want   string // in the body
	}{
		{"TagsNotLoaded", func(h *core.Health) { h.TagsLoaded = false }, "segment tags not loaded yet"},
		{"NoWorkerID", func(h *core.Health) { h.WorkerIDHeld = false }, "no worker ID held (lease lost or not acquired)"},
		{"NoRecordYet", func(h *core.Health) { h.LastBeat = time.Time{} }, "heartbeat: no clock record written yet"},
		{"HeartbeatStale", func(h *core.Health) { h.LastBeat = now.Add(-11 * time.Second) },
			"heartbeat stale: last clock record written 11s ago (limit 10s)"},
		{"Suspended", func(h *core.Health) { h.Suspended = "worker ID lease lost" }, "snowflake IDs suspended: worker ID lease lost"},
		{"ClockBehind", func(h *core.Health) { h.ClockBehind = 40 * time.Millisecond },
			"clock behind: it reads 40ms earlier than its highest reading (waited out up to 5ms)"},
	} {
		t.Run(c.name, func(t *testing.T) {
			url := probeServer(t, func() core.Health { h := healthy(); c.health(&h); return h })
			status, body := get(t, url+"/readyz")
			if status != http.StatusServiceUnavailable || body != "not ready: "+c.want+"\n" {
				t.Errorf("GET /readyz: %d %q, want 503 %q", status, body, "not ready: "+c.want+"\n")
			}
			if status, body := get(t, url+"/healthz"); status != http.StatusOK || body != "ok\n" {
				t.Errorf("GET /healthz while not ready: %d %q, want 200 ok", status, body)
			}
		})
	}
	t.Run("OK", func(t *testing.T) {
		url := probeServer(t, healthy)
		if status, body := get(t, url+"/readyz"); status != http.StatusOK || body != "ready\n" {
			t.Errorf("GET /readyz: %d %q, want 200 ready", status, body)
		}
	})
	t.Run("Warning", func(t *testing.T) {
		// Wrong, but served safely (a deployment record refused): 200, and the detail.
		url := probeServer(t, func() core.Health { h := healthy(); h.Warning = "deployment record revision 7 refused"; return h })
		if status, body := get(t, url+"/readyz"); status != http.StatusOK || body != "ready\nwarning: deployment record revision 7 refused\n" {
			t.Errorf("GET /readyz: %d %q, want 200 ready with the warning", status, body)
		}
		if status, body := get(t, url+"/"); status != http.StatusOK || !strings.Contains(body, "deployment record revision 7 refused") {
			t.Errorf("the status page: %d, without the warning", status)
		}
	})
	t.Run("EveryReasonAtOnce", func(t *testing.T) {
		url := probeServer(t, func() core.Health { return core.Health{} })
		_, body := get(t, url+"/readyz")
		if n := strings.Count(body, "; ") + 1; n != 3 || strings.Count(body, "\n") != 1 {
			t.Errorf("GET /readyz of a node with nothing: %q, want 3 reasons on one line", body)
		}
	})
	t.Run("NoReadinessSource", func(t *testing.T) {
		url := probeServer(t, nil)
		if status, body := get(t, url+"/readyz"); status != http.StatusServiceUnavailable || body != "not ready: no readiness source is configured\n" {
			t.Errorf("GET /readyz: %d %q", status, body)
		}
	})
}

// TestReadyzWhileShuttingDown: once Run's context ends the node says it is going, even
// to a request that still reaches its handler.
func TestReadyzWhileShuttingDown(t *testing.T) {
	cfg := httpapi.DefaultConfig()
	cfg.Now = func() time.Time { return now }
	cfg.Readiness = core.ReadinessFunc(healthy)
	cfg.Logger = testutil.Logger(t)
	cfg.Core = coreOf(t, nil)
	srv, err := httpapi.New("127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	stop := testutil.Run(t, "http server", srv.Run)
	ts := httptest.NewServer(srv.Handler())
	defer ts.Close()
	if status, _ := get(t, ts.URL+"/readyz"); status != http.StatusOK {
		t.Fatalf("GET /readyz before the stop: %d, want 200", status)
	}
	stop()
	if status, body := get(t, ts.URL+"/readyz"); status != http.StatusServiceUnavailable || body != "not ready: shutting down\n" {
		t.Errorf("GET /readyz after the stop: %d %q, want 503 shutting down", status, body)
	}
}
