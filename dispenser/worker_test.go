package dispenser

import (
	"context"
	"encoding/json"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"

	"github.com/leafbus/leafbus/client"
	"github.com/leafbus/leafbus/snowflake"
	"github.com/leafbus/leafbus/testenv"
	"github.com/leafbus/leafbus/wire"
)

// runTest runs d until the test ends and waits until it serves; the returned channel
// gets Run's result.
func runTest(tb testing.TB, d *Dispenser) <-chan error {
	tb.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	tb.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
			tb.Error("Run did not return within 30s of its context ending")
		}
	})
	select {
	case <-d.Ready():
	case err := <-done:
		tb.Fatalf("Run stopped before Ready: %v", err)
	case <-time.After(30 * time.Second):
		tb.Fatal("not ready within 30s")
	}
	return done
}

// A node whose worker ID is taken from under it stops issuing with it, takes a new one
// and serves on, without exiting (issue 13).
func TestLostWorkerIDTakesANewOne(t *testing.T) {
	srv := testenv.StartNATS(t)
	cfg := testConfig(t)
	cfg.NATS = srv.URL()
	d, err := newTest(t, cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	done := runTest(t, d)
	nc := srv.Connect(t)
	c, err := client.NewClient(nc)
	if err != nil {
		t.Fatalf("NewClient: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	workerOf := func() (int64, error) {
		id, err := c.Snowflake(ctx, "rejoin")
		if err != nil {
			return 0, err
		}
		dec, err := snowflake.DefaultLayout().Decode(id)
		return dec.WorkerID, err
	}
	first, err := workerOf()
	if err != nil {
		t.Fatalf("Snowflake: %v", err)
	}

	// Another node's lease on the same key: the holder's watch sees it rewritten.
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatalf("jetstream.New: %v", err)
	}
	leases, err := js.KeyValue(ctx, cfg.Prefix+"_leases")
	if err != nil {
		t.Fatalf("bind leases bucket: %v", err)
	}
	if _, err := leases.Put(ctx, fmt.Sprint(first), []byte(`{"node_id":"thief","token":"not-the-holders"}`)); err != nil {
		t.Fatalf("rewrite the lease: %v", err)
	}
	start := time.Now()
	var second int64
	for {
		w, err := workerOf()
		if err == nil && w != first {
			second = w
			break
		}
		select {
		case err := <-done:
			t.Fatalf("Run returned after the loss: %v", err)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Since(start) > 20*time.Second {
			t.Fatalf("no snowflake ID with a new worker ID 20s after the loss (last: worker %d, %v)", w, err)
		}
	}
	t.Logf("worker ID %d lost, serving with %d %s later", first, second, time.Since(start).Round(time.Millisecond))
	if n, why := d.heartbeat.Rejoins(); n != 1 || why == "" {
		t.Fatalf("Rejoins() = %d, %q; want 1 and the loss", n, why)
	}
	if got := d.heartbeat.WorkerID(); got != second {
		t.Fatalf("the held lease says worker ID %d, want %d", got, second)
	}
	if st := d.heartbeat.Stats(); st.LeaseLost || st.Suspended || st.WorkerID != second {
		t.Fatalf("heartbeat Stats() = %+v, want worker ID %d held and issuing", st, second)
	}
	// Discovery (and the peers' range check) reads the worker ID from $SRV.INFO.
	msg, err := nc.RequestWithContext(ctx, "$SRV.INFO."+cfg.Prefix, nil)
	if err != nil {
		t.Fatalf("$SRV.INFO: %v", err)
	}
	var info micro.Info
	if err := json.Unmarshal(msg.Data, &info); err != nil {
		t.Fatalf("$SRV.INFO answer %q: %v", msg.Data, err)
	}
	if got := info.Metadata[wire.MetaWorkerID]; got != fmt.Sprint(second) {
		t.Fatalf("$SRV.INFO metadata worker_id %q after the replacement, want %d (metadata %v)", got, second, info.Metadata)
	}
}
