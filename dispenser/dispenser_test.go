package dispenser

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/leafbus/leafbus/client"
	"github.com/leafbus/leafbus/segment"
	"github.com/leafbus/leafbus/testenv"
)

// TestCloseWithoutRun: the service answers from the end of New, before Run; Close then
// gives the worker ID back with the highest timestamp it issued, so the next holder of
// the ID starts past it.
func TestCloseWithoutRun(t *testing.T) {
	srv := testenv.StartNATS(t)
	cfg := testConfig(t)
	cfg.NATS = srv.URL()
	d, err := newTest(t, cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	c, err := client.NewClient(srv.Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ids, err := c.SnowflakeN(ctx, "before-run", 5000)
	if err != nil {
		t.Fatalf("SnowflakeN before Run: %v", err)
	}
	last, err := c.Decode(ctx, ids[len(ids)-1])
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	lease := wantFree(t, nextTaker(t, otherNode(cfg)), last.WorkerID)
	if lease.Recorded() < last.Timestamp {
		t.Fatalf("the next holder of worker ID %d sees record %d, below the last timestamp issued (%d)", last.WorkerID, lease.Recorded(), last.Timestamp)
	}
}

// TestRunStopsOnClose: Close stops a running dispenser (Run returns nil), and the
// heartbeat's clean stop has given the worker ID back.
func TestRunStopsOnClose(t *testing.T) {
	srv := testenv.StartNATS(t)
	cfg := testConfig(t)
	cfg.NATS = srv.URL()
	var banner bytes.Buffer
	d, err := newTest(t, cfg, WithBanner(&banner))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	done := make(chan error, 1)
	go func() { done <- d.Run(context.Background()) }()
	select {
	case <-d.Ready():
	case err := <-done:
		t.Fatalf("Run stopped before Ready: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("not ready within 30s")
	}
	if err := d.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run after Close = %v, want nil (a clean stop)", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("Run did not return after Close")
	}
	if !strings.HasPrefix(banner.String(), "leafbus is serving on "+srv.URL()+".") {
		t.Errorf("banner %q", banner.String())
	}
	wantFree(t, nextTaker(t, otherNode(cfg)), 0)
	if err := d.Run(context.Background()); !errors.Is(err, ErrClosed) {
		t.Fatalf("Run after Close = %v, want ErrClosed", err)
	}
}

// TestNewRefuses: a bad configuration or option is refused before anything starts.
func TestNewRefuses(t *testing.T) {
	cfg := testConfig(t)
	cfg.WorkerRegistry = "etcd"
	if _, err := newTest(t, cfg); err == nil || !strings.Contains(err.Error(), `--worker-registry "etcd"`) {
		t.Errorf("New with --worker-registry etcd = %v, want a message naming the flag", err)
	}
	if _, err := newTest(t, testConfig(t), WithClock(nil)); err == nil {
		t.Error("New with WithClock(nil) succeeded")
	}
	if _, err := newTest(t, testConfig(t), WithTags(segment.Tag{Name: "no\ncontrol", Step: 1})); err == nil {
		t.Error(`New with WithTags of a tag holding a newline succeeded`)
	}
}

// TestBanner: the start-up lines are byte for byte what they have always been; scripts
// read them.
func TestBanner(t *testing.T) {
	tests := []struct {
		name, url, prefix, status, want string
	}{
		{"DefaultURL", nats.DefaultURL, "leaf", "", "leafbus is serving on nats://127.0.0.1:4222. Ask for IDs with the nats CLI:\n" +
			"  nats req leaf.segment.leaf-segment-test \"\"\n" +
			"  nats req leaf.snowflake.any \"\"\n" +
			"  nats req leaf.segment.leaf-segment-test 5      (five IDs)\n"},
		{"OtherURL", "nats://127.0.0.1:41234", "acme", "", "leafbus is serving on nats://127.0.0.1:41234. Ask for IDs with the nats CLI:\n" +
			"  nats --server nats://127.0.0.1:41234 req acme.segment.leaf-segment-test \"\"\n" +
			"  nats --server nats://127.0.0.1:41234 req acme.snowflake.any \"\"\n" +
			"  nats --server nats://127.0.0.1:41234 req acme.segment.leaf-segment-test 5      (five IDs)\n"},
		{"StatusPage", nats.DefaultURL, "leaf", "http://127.0.0.1:8080/", "leafbus is serving on nats://127.0.0.1:4222. Ask for IDs with the nats CLI:\n" +
			"  nats req leaf.segment.leaf-segment-test \"\"\n" +
			"  nats req leaf.snowflake.any \"\"\n" +
			"  nats req leaf.segment.leaf-segment-test 5      (five IDs)\n" +
			"status page: http://127.0.0.1:8080/\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var b bytes.Buffer
			writeBanner(&b, tt.url, tt.prefix, tt.status)
			if b.String() != tt.want {
				t.Errorf("writeBanner(%q, %q, %q) =\n%q\nwant\n%q", tt.url, tt.prefix, tt.status, b.String(), tt.want)
			}
		})
	}
}
