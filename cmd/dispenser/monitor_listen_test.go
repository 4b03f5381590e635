package main

import (
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/leafbus/leafbus/internal/testutil"
)

// TestMonitorListen: with --monitor-listen the operator pages (/, /cache, /db,
// /metrics) are served on their own listener, with every tag's counters, and are 404 on
// --http, which keeps the ID API (404 on the monitor listener); both answer the probes.
// Without it, --http serves every page as before, but an opaque tag's counters (its
// buffers, max_id, step and tag-labelled series: its permutation's input) are not on
// it. Through the real listeners of a running dispenser.
func TestMonitorListen(t *testing.T) {
	keyFile := writeKeyFile(t, deploymentKey)
	// prepare adds an opaque tag and a plain one with max_ids that are easy to spot, and
	// takes IDs of both so that each has a buffer.
	prepare := func(t *testing.T, d *testDispenser) {
		url := d.ClientURL()
		for _, args := range [][]string{
			{"--tag", "inv", "--step", "100", "--max-id", "7777700", "--opaque"},
			{"--tag", "plain", "--step", "100", "--max-id", "5555500"},
		} {
			if code, out, errOut := run(t, append([]string{"tag", "add", "--nats", url}, args...)...); code != 0 {
				t.Fatalf("tag add %v: exit %d\n%s%s", args, code, out, errOut)
			}
		}
		c := d.client(t)
		ctx := testutil.Context(t, 30*time.Second)
		for _, tag := range []string{"inv", "plain"} {
			if _, err := c.SegmentN(ctx, tag, 10); err != nil {
				t.Fatalf("IDs of %s: %v", tag, err)
			}
		}
	}
	get := func(t *testing.T, base, path string) (int, string) {
		t.Helper()
		resp, err := http.Get(base + path)
		if err != nil {
			t.Fatalf("GET %s%s: %v", base, path, err)
		}
		defer resp.Body.Close()
		body, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatalf("GET %s%s: %v", base, path, err)
		}
		return resp.StatusCode, string(body)
	}
	// The opaque tag's counters as the pages show them: its segment's max_id (/cache,
	// /db, the status page group digits) and its metric series.
	opaqueCounters := []string{"7777800", "7,777,800", `tag="inv"`}
	pages := []string{"/", "/cache", "/db", "/metrics"}
	ids := []string{"/api/segment/get/plain", "/decodeSnowflakeId?snowflakeId=1"}
	probes := []string{"/healthz", "/readyz"}

	t.Run("TwoListeners", func(t *testing.T) {
		d := startDispenser(t, func(c *testConfig) { c.IDKeyFile = keyFile; c.MonitorListen = "127.0.0.1:0" })
		prepare(t, d)
		idBase, monBase := "http://"+d.HTTPAddr().String(), "http://"+d.MonitorAddr().String()
		for _, p := range pages {
			if code, body := get(t, idBase, p); code != http.StatusNotFound || !strings.Contains(body, "--monitor-listen") {
				t.Errorf("ID listener %s: %d %q, want 404 naming --monitor-listen", p, code, body)
			}
			code, body := get(t, monBase, p)
			if code != http.StatusOK {
				t.Errorf("monitor listener %s: %d, want 200:\n%s", p, code, body)
			}
			if p != "/metrics" && !plainShown(body) {
				t.Errorf("monitor listener %s does not show the plain tag's counter 5,555,600:\n%s", p, body)
			}
		}
		for _, p := range []string{"/cache", "/db", "/"} {
			if _, body := get(t, monBase, p); !strings.Contains(body, opaqueCounters[0]) && !strings.Contains(body, opaqueCounters[1]) {
				t.Errorf("monitor listener %s does not show the opaque tag's counter:\n%s", p, body)
			}
		}
		if _, body := get(t, monBase, "/metrics"); !strings.Contains(body, opaqueCounters[2]) {
			t.Errorf("monitor listener /metrics has no series of the opaque tag")
		}
		for _, p := range ids {
			if code, body := get(t, idBase, p); code != http.StatusOK {
				t.Errorf("ID listener %s: %d %q, want 200", p, code, body)
			}
			if code, body := get(t, monBase, p); code != http.StatusNotFound || !strings.Contains(body, "--http") {
				t.Errorf("monitor listener %s: %d %q, want 404 naming --http", p, code, body)
			}
		}
		for _, p := range probes {
			for _, base := range []string{idBase, monBase} {
				if code, body := get(t, base, p); code != http.StatusOK {
					t.Errorf("%s%s: %d %q, want 200", base, p, code, body)
				}
			}
		}
	})

	t.Run("OneListener", func(t *testing.T) {
		d := startDispenser(t, func(c *testConfig) { c.IDKeyFile = keyFile })
		prepare(t, d)
		base := "http://" + d.HTTPAddr().String()
		for _, p := range append(append(pages, ids...), probes...) {
			code, body := get(t, base, p)
			if code != http.StatusOK {
				t.Errorf("%s: %d, want 200:\n%s", p, code, body)
				continue
			}
			for _, c := range opaqueCounters {
				if strings.Contains(body, c) {
					t.Errorf("%s shows the opaque tag's counter (%q) on the ID listener:\n%s", p, c, body)
				}
			}
			if (p == "/cache" || p == "/db" || p == "/") && !plainShown(body) {
				t.Errorf("%s does not show the plain tag's counter 5,555,600:\n%s", p, body)
			}
		}
	})
}

// plainShown reports whether a page shows the plain tag's segment max_id, 5,555,600
// (Leaf's pages group the digits, the status page does not).
func plainShown(body string) bool {
	return strings.Contains(body, "5,555,600") || strings.Contains(body, "5555600")
}
