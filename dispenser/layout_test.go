package dispenser

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/micro"

	"github.com/leafbus/leafbus/snowflake"
	"github.com/leafbus/leafbus/testenv"
	"github.com/leafbus/leafbus/wire"
	"github.com/leafbus/leafbus/workerid"
)

// TestSnowflakeLayoutJS53: a dispenser started with --snowflake-layout js53 hands out
// snowflake IDs a JavaScript Number holds exactly (at most 2^53-1), from a worker ID of
// the layout's (the default --worker-id-max 1023 means its highest, 31), decodes them with
// the same layout, says so in $SRV.INFO, and records the layout in the deployment
// record: a dispenser of Leaf's layout on the same NATS is refused, naming the flag.
func TestSnowflakeLayoutJS53(t *testing.T) {
	t.Parallel()
	srv := testenv.StartNATS(t)
	cfg := fleetNode(t, srv.URL(), "js-1")
	cfg.SnowflakeLayout = snowflake.LayoutJS53
	d, err := newTest(t, cfg)
	if err != nil {
		t.Fatal(err)
	}
	runNode(t, d)
	if d.cfg.WorkerIDMax != 31 {
		t.Fatalf("--worker-id-max left at 1023 with js53 = %d, want the layout's highest, 31", d.cfg.WorkerIDMax)
	}
	nc, c := exactClient(t, d)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ids, err := c.SnowflakeN(ctx, "web", 5000)
	if err != nil {
		t.Fatal(err)
	}
	js, _ := snowflake.NamedLayout(snowflake.LayoutJS53)
	for _, id := range ids {
		if id > 1<<53-1 {
			t.Fatalf("js53 handed out %d, above 2^53-1", id)
		}
	}
	dec, err := c.Decode(ctx, ids[len(ids)-1])
	if err != nil {
		t.Fatal(err)
	}
	want, _ := js.Decode(ids[len(ids)-1])
	if dec.WorkerID != want.WorkerID || dec.Sequence != want.Sequence || dec.Timestamp != want.Timestamp {
		t.Fatalf("leaf.decode.snowflake = %+v, want the js53 layout's reading %+v", dec, want)
	}
	if time.Since(time.UnixMilli(dec.Timestamp)).Abs() > time.Minute {
		t.Fatalf("decoded timestamp %v is not about now", time.UnixMilli(dec.Timestamp))
	}
	info, err := micro.ControlSubject(micro.InfoVerb, "leaf", "")
	if err != nil {
		t.Fatal(err)
	}
	m, err := nc.Request(info, nil, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	for _, kv := range []string{`"snowflake_layout":"js53"`, `"snowflake_workers":"32"`, `"snowflake_ids_per_ms":"128"`, `"worker_id_max":"31"`} {
		if !strings.Contains(string(m.Data), kv) {
			t.Errorf("$SRV.INFO %s\nwant %s", m.Data, kv)
		}
	}
	// A dispenser of Leaf's layout is refused while js-1 runs (it sees it through $SRV)
	// and after it stopped (by the deployment record), naming the flag each time.
	if _, err := newTest(t, fleetNode(t, srv.URL(), "leaf-1")); !errors.Is(err, workerid.ErrPeerLayout) || !strings.Contains(err.Error(), `runs "js53"`) {
		t.Fatalf("New(leaf-1) beside js-1 = %v, want ErrPeerLayout naming js53", err)
	}
	d.Close()
	wantRefused(t, fleetNode(t, srv.URL(), "leaf-1"), "snowflake layout", "--snowflake-layout js53")
}

// TestPeerLayoutRefused: a dispenser whose layout differs from a live peer's, seen
// through $SRV, does not start, even with no deployment record to tell it (a fleet of
// dispensers from before the record, the flag and its metadata: Leaf's layout).
func TestPeerLayoutRefused(t *testing.T) {
	t.Parallel()
	srv := testenv.StartNATS(t)
	// An older dispenser: a service "leaf" whose $SRV.INFO says nothing of its layout.
	old, err := micro.AddService(srv.Connect(t), micro.Config{Name: "leaf", Version: "0.9.0",
		Metadata: map[string]string{wire.MetaNodeID: "old-1", wire.MetaWorkerID: "0"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = old.Stop() })
	cfg := fleetNode(t, srv.URL(), "js-1")
	cfg.SnowflakeLayout = snowflake.LayoutJS53
	_, err = newTest(t, cfg)
	if !errors.Is(err, workerid.ErrPeerLayout) || !strings.Contains(err.Error(), `node "old-1"`) || !strings.Contains(err.Error(), `runs "leaf"`) {
		t.Fatalf("New with js53 beside an older (leaf) dispenser = %v, want ErrPeerLayout naming node old-1 and its layout", err)
	}
	// The same layout as the peer's starts.
	d, err := newTest(t, fleetNode(t, srv.URL(), "leaf-1"))
	if err != nil {
		t.Fatalf("New with the peer's layout: %v", err)
	}
	d.Close()
}
