package main

import (
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/leafbus/leafbus/dispenser"
	"github.com/leafbus/leafbus/internal/testutil"
	"github.com/leafbus/leafbus/testenv"
	"github.com/leafbus/leafbus/workerid"
)

// TestForgedWorkerRecordStream is issue 30's stream of bad writes: a dispenser with a
// static worker ID whose worker record in leaf_forever is overwritten every 300 ms for
// 3 s (marked released, deleted, not a record, without a holder, another run's with a
// lower ceiling) stays up, serves segment IDs throughout and snowflake IDs after (none
// twice), and logs the writes rate-limited. (Before: it gave the worker ID up at the
// first write and exited when it could not take it back.)
func TestForgedWorkerRecordStream(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	srv := testenv.StartNATS(t)
	port := freePort(t)
	base := fmt.Sprintf("http://127.0.0.1:%d", port)
	p := startBinary(t, t.TempDir(), "--nats", srv.URL(), "--node-id", "disp-1",
		"--worker-registry", "static", "--worker-id", "9", "--http", fmt.Sprintf("127.0.0.1:%d", port))
	ids, stop := loadFleet(map[string]string{"disp-1": base})
	ids.servesOn(t, "disp-1", 20*time.Second)

	ctx := testutil.Context(t, 60*time.Second)
	js, err := jetstream.New(srv.Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	kv, err := js.KeyValue(ctx, workerid.ForeverBucket("leaf"))
	if err != nil {
		t.Fatal(err)
	}
	key := workerid.WorkerKey(9)
	old := time.Now().Add(-time.Minute).UnixMilli()
	record := func(r workerid.Record) func() error {
		return func() error {
			b, _ := json.Marshal(r)
			_, err := kv.Put(ctx, key, b)
			return err
		}
	}
	forgeries := []func() error{
		record(workerid.Record{WorkerID: 9, Timestamp: old, NodeID: "disp-1", Released: true}),
		func() error { return kv.Delete(ctx, key) },
		func() error { _, err := kv.Put(ctx, key, []byte("garbage")); return err },
		record(workerid.Record{WorkerID: 9, Timestamp: old}),
		record(workerid.Record{WorkerID: 9, Timestamp: old, Ceiling: old, NodeID: "intruder", Instance: "forged"}),
	}
	segment := base + "/api/segment/get/" + dispenser.SampleTagName
	hc := &http.Client{Timeout: 5 * time.Second}
	tick := time.NewTicker(300 * time.Millisecond)
	defer tick.Stop()
	writes := 0
	for end := time.Now().Add(3 * time.Second); time.Now().Before(end); writes++ {
		if err := forgeries[writes%len(forgeries)](); err != nil {
			t.Fatalf("forged write %d: %v", writes, err)
		}
		resp, err := hc.Get(segment)
		if err != nil {
			t.Fatalf("segment ID during the forged writes: %v", err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("segment ID during the forged writes: status %d, want 200", resp.StatusCode)
		}
		<-tick.C
	}
	select {
	case err := <-p.done:
		p.done <- err
		t.Fatalf("the dispenser exited (%v) under %d forged writes\nstderr:\n%s", err, writes, lastLines(p.stderr.String(), 20))
	default:
	}
	ids.servesOn(t, "disp-1", 20*time.Second)
	if code, body := httpGet(t, segment); code != http.StatusOK {
		t.Fatalf("segment ID after the forged writes: %d %s", code, body)
	}
	checkFleet(t, stop(), "disp-1")
	logged := strings.Count(p.stderr.String(), "taken back at once")
	t.Logf("%d forged writes, %d log lines about them", writes, logged)
	if logged == 0 || logged >= writes {
		t.Errorf("%d log lines for %d forged writes, want some, rate-limited", logged, writes)
	}
}
