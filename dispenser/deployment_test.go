package dispenser

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/leafbus/leafbus/client"
	"github.com/leafbus/leafbus/deployment"
	"github.com/leafbus/leafbus/internal/testutil"
	"github.com/leafbus/leafbus/segment"
	"github.com/leafbus/leafbus/testenv"
	"github.com/leafbus/leafbus/wire"
)

// fleetNode is the configuration of one dispenser of a deployment on the NATS at url:
// a data dir and a node ID of its own.
func fleetNode(tb testing.TB, url, node string) Config {
	cfg := testConfig(tb)
	cfg.NATS, cfg.NodeID, cfg.HTTP = url, node, ""
	cfg.StartTimeout = 5 * time.Second
	return cfg
}

// withMySQL puts cfg's segments in leaf_alloc of dsn.
func withMySQL(cfg Config, dsn string) Config {
	cfg.SegmentStore, cfg.MySQLDSN, cfg.MySQLCreateTable, cfg.SampleTag = "mysql", dsn, true, false
	return cfg
}

// runNode runs d until the test ends and waits until it serves; the returned channel
// gets Run's result (the cleanup does not need it).
func runNode(t *testing.T, d *Dispenser) <-chan error {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done, stopped := make(chan error, 1), make(chan struct{})
	go func() {
		defer close(stopped)
		done <- d.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-stopped:
		case <-time.After(30 * time.Second):
			t.Errorf("Run did not stop within 30s")
		}
	})
	select {
	case <-d.Ready():
	case err := <-done:
		t.Fatalf("Run ended before the dispenser was ready: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatalf("dispenser not ready within 30s")
	}
	return done
}

// wantRefused checks that New refused cfg because it does not fit the deployment,
// naming each of fixes, and quickly (a refusal is not waited out).
func wantRefused(t *testing.T, cfg Config, fixes ...string) {
	t.Helper()
	began := time.Now()
	d, err := newTest(t, cfg)
	if err == nil {
		t.Fatalf("New(%s) started a dispenser that does not fit the deployment (%v)", cfg.NodeID, d.ClientURL())
	}
	if !errors.Is(err, deployment.ErrMismatch) {
		t.Fatalf("New(%s) = %v, want ErrMismatch", cfg.NodeID, err)
	}
	for _, fix := range fixes {
		if !strings.Contains(err.Error(), fix) {
			t.Errorf("New(%s) = %v\nwant it to name %q", cfg.NodeID, err, fix)
		}
	}
	if took := time.Since(began); took > cfg.StartTimeout {
		t.Errorf("the refusal took %v: it was waited out like a dependency", took)
	}
}

// TestDeploymentDefaultFlagsInMySQLDeployment is issue 21's first scenario: on the NATS
// of a MySQL deployment, a dispenser started with default flags (KV segments) would
// create the sample tag at max_id 1 in a KV bucket of its own and serve the same tags
// as the others from there (77,874 duplicates in 155,782 IDs). It is refused before it
// serves, naming --segment-store mysql, and has created no tag.
func TestDeploymentDefaultFlagsInMySQLDeployment(t *testing.T) {
	t.Parallel()
	srv := testenv.StartNATS(t)
	dsn := testenv.MariaDB(t).NewDatabase(t)
	first, err := newTest(t, withMySQL(fleetNode(t, srv.URL(), "disp-1"), dsn), WithTags(sampleTag()))
	if err != nil {
		t.Fatalf("first dispenser: %v", err)
	}
	runNode(t, first)
	second, err := newTest(t, withMySQL(fleetNode(t, srv.URL(), "disp-2"), dsn))
	if err != nil {
		t.Fatalf("second dispenser with the same flags: %v", err)
	}
	second.Close() // it never ran: its service would answer 503 to the client below

	defaults := fleetNode(t, srv.URL(), "newcomer")
	wantRefused(t, defaults, "--segment-store mysql", "segment store")
	js, err := jetstream.New(srv.Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx := testutil.Context(t, 10*time.Second)
	if kv, err := js.KeyValue(ctx, "leaf_segments"); err == nil {
		if _, err := kv.Get(ctx, SampleTagName); !errors.Is(err, jetstream.ErrKeyNotFound) {
			t.Errorf("the refused dispenser created the sample tag in KV (%v)", err)
		}
	}
	// The deployment serves on, from MySQL.
	_, c := exactClient(t, first)
	if _, err := c.Segment(ctx, SampleTagName); err != nil {
		t.Errorf("the first dispenser after the refusal: %v", err)
	}
}

func sampleTag() segment.Tag {
	return segment.Tag{Name: SampleTagName, Step: SampleTagStep, MaxID: 1}
}

// TestDeploymentTwoZKNames is issue 21's "two ZooKeeper names in one deployment": one
// dispenser on README's production name, one on Leaf's default; both held worker ID 0
// and shared 21,689 of 60,000 snowflake IDs. The second is refused, naming --zk-name,
// before it takes a worker ID (no node under its path).
func TestDeploymentTwoZKNames(t *testing.T) {
	t.Parallel()
	srv := testenv.StartNATS(t)
	zk := testenv.ZooKeeper(t)
	root := strings.TrimPrefix(zk.NewRoot(t), "/")
	withZK := func(cfg Config, name, advertise string) Config {
		cfg.WorkerRegistry, cfg.ZK, cfg.ZKName, cfg.Advertise = "zk", zk.Addr(), name, advertise
		return cfg
	}
	prod, leaf := root+"/leaf-prod", root+"/leaf"
	first, err := newTest(t, withZK(fleetNode(t, srv.URL(), "disp-1"), prod, "127.0.0.1:7201"))
	if err != nil {
		t.Fatalf("first dispenser: %v", err)
	}
	runNode(t, first)
	wantRefused(t, withZK(fleetNode(t, srv.URL(), "disp-2"), leaf, "127.0.0.1:7202"), "--zk-name "+prod, "zk /snowflake/"+prod)

	conn := zk.Connect(t)
	if ok, _, err := conn.Exists("/snowflake/" + leaf + "/forever"); err != nil || ok {
		children, _, _ := conn.Children("/snowflake/" + leaf + "/forever")
		t.Errorf("the refused dispenser registered under /snowflake/%s/forever: %v (%v)", leaf, children, err)
	}
	// A ZooKeeper registry of another name for other worker IDs is a datacenter of its
	// own: it fits.
	dc2 := withZK(fleetNode(t, srv.URL(), "disp-3"), leaf, "127.0.0.1:7203")
	dc2.WorkerIDMin, dc2.ZKRecycle = 512, true // a range that does not start at 0, without raising Leaf's counter
	first.Close()
	rec := readRecord(t, srv)
	rec.WorkerRegistries[0].WorkerIDMax = 511
	writeRecord(t, srv, rec)
	d, err := newTest(t, dc2)
	if err != nil {
		t.Fatalf("a registry for free worker IDs: %v", err)
	}
	d.Close()
	if got := readRecord(t, srv).WorkerRegistries; len(got) != 2 || got[1].Identity != "zk /snowflake/"+leaf+" (recycle)" || got[1].WorkerIDMin != 512 {
		t.Errorf("registries after the second datacenter: %+v", got)
	}
}

// TestDeploymentLayout: another epoch is refused, naming --epoch; and so is the
// snowflake layout another leafbus would write (the record's bits differ).
func TestDeploymentLayout(t *testing.T) {
	t.Parallel()
	srv := testenv.StartNATS(t)
	first, err := newTest(t, fleetNode(t, srv.URL(), "disp-1"))
	if err != nil {
		t.Fatal(err)
	}
	first.Close()
	other := fleetNode(t, srv.URL(), "disp-2")
	other.Epoch = 1700000000000
	wantRefused(t, other, "--epoch 1288834974657", "snowflake epoch")

	rec := readRecord(t, srv)
	rec.Snowflake.WorkerBits, rec.Snowflake.SequenceBits = 8, 14
	writeRecord(t, srv, rec)
	wantRefused(t, fleetNode(t, srv.URL(), "disp-3"), "snowflake layout", "41/8/14")
}

// TestDeploymentSetThenStart: an operator moves the deployment to another epoch with
// `dispenser deployment set` (SetDeployment). While a dispenser of the old
// configuration runs, set refuses, naming it (that dispenser would write back the
// record it runs under); once it stopped, nothing is written without Confirm, a
// compare-and-set on a revision the record has left is refused, and with Confirm the
// record changes and a dispenser of the new configuration starts.
func TestDeploymentSetThenStart(t *testing.T) {
	t.Parallel()
	srv := testenv.StartNATS(t)
	old, err := newTest(t, fleetNode(t, srv.URL(), "disp-1"), withDeploymentEvery(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	ctx := testutil.Context(t, 30*time.Second)
	runCtx, stopOld := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- old.Run(runCtx) }()
	select {
	case <-old.Ready():
	case <-time.After(30 * time.Second):
		t.Fatal("the first dispenser is not ready within 30s")
	}
	next := fleetNode(t, srv.URL(), "disp-2")
	next.Epoch = 1700000000000
	wantRefused(t, next, "--epoch")

	opCfg := fleetNode(t, srv.URL(), "operator")
	opCfg.Epoch = next.Epoch
	ch, err := SetDeployment(ctx, opCfg, SetOptions{Confirm: true}, WithLogger(testutil.Logger(t)))
	if !errors.Is(err, deployment.ErrLiveContradict) || !strings.Contains(err.Error(), `"disp-1"`) || ch.Written {
		t.Fatalf("SetDeployment beside a running dispenser it contradicts = %+v, %v; want ErrLiveContradict naming disp-1, nothing written", ch, err)
	}
	stopOld()
	if err := <-done; err != nil {
		t.Fatalf("the old dispenser's Run = %v", err)
	}
	if err := old.Close(); err != nil {
		t.Fatal(err)
	}

	ch, err = SetDeployment(ctx, opCfg, SetOptions{}, WithLogger(testutil.Logger(t)))
	if !errors.Is(err, ErrNotConfirmed) || ch.Written || len(ch.Differences) != 1 || ch.Next.Snowflake.Epoch != next.Epoch {
		t.Fatalf("SetDeployment without Confirm = %+v, %v; want ErrNotConfirmed, one difference, nothing written", ch, err)
	}
	if got := readRecord(t, srv).Snowflake.Epoch; got != DefaultConfig().Epoch {
		t.Fatalf("a dry run wrote the record: epoch %d", got)
	}
	// A compare-and-set on a revision the record has left is refused.
	if _, err := SetDeployment(ctx, opCfg, SetOptions{Confirm: true, Revision: ch.Current.Revision + 7}, WithLogger(testutil.Logger(t))); !errors.Is(err, deployment.ErrChanged) {
		t.Fatalf("SetDeployment over a revision the record is not at = %v, want ErrChanged", err)
	}
	ch, err = SetDeployment(ctx, opCfg, SetOptions{Confirm: true, Revision: ch.Current.Revision}, WithLogger(testutil.Logger(t)))
	if err != nil || !ch.Written {
		t.Fatalf("SetDeployment = %+v, %v", ch, err)
	}
	if rec := readRecord(t, srv); rec.Snowflake.Epoch != next.Epoch || rec.WrittenBy != "operator" {
		t.Fatalf("record after set: %+v", rec)
	}
	d, err := newTest(t, next)
	if err != nil {
		t.Fatalf("a dispenser of the new configuration: %v", err)
	}
	d.Close()
}

// TestDeploymentMonotonicTags: a tag marked monotonic through the admin API is in the
// record, one unmarked leaves it; a mark the monotonic package lost (its bucket
// deleted) is written again from the record before a restarted dispenser serves, and by
// a running one within the watch interval, so no dispenser serves it as an ordinary
// tag (issue 21, "monotonic marks lost").
func TestDeploymentMonotonicTags(t *testing.T) {
	t.Parallel()
	srv := testenv.StartNATS(t)
	cfg := fleetNode(t, srv.URL(), "disp-1")
	d, err := newTest(t, cfg, withDeploymentEvery(50*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	runNode(t, d)
	_, c := exactClient(t, d)
	ctx := testutil.Context(t, time.Minute)
	on, off := true, false
	step := int64(100)
	for _, tag := range []string{"orders", "users"} {
		if _, err := c.AddTag(ctx, wire.AddTagRequest{Tag: tag, Step: &step, Monotonic: &on}); err != nil {
			t.Fatalf("add %s: %v", tag, err)
		}
	}
	before := readRecord(t, srv)
	if got := before.MonotonicTags; !slices.Equal(got, []string{"orders", "users"}) {
		t.Fatalf("record's monotonic tags after two marks: %v", got)
	}
	if _, err := c.UpdateTag(ctx, wire.UpdateTagRequest{Tag: "users", Monotonic: &off}); err != nil {
		t.Fatal(err)
	}
	if got := readRecord(t, srv).MonotonicTags; !slices.Equal(got, []string{"orders"}) {
		t.Fatalf("record's monotonic tags after an unmark: %v", got)
	}
	// The watch may hold a record read before the unmark when it finds users unmarked:
	// that is an unmark, not a lost mark (CI once saw the unmark undone this way).
	d.remarkMonotonic(ctx, before)
	if mono, err := d.mono.MonotonicTags(ctx); err != nil || mono["users"] {
		t.Fatalf("marks after the watch saw a record older than the unmark = %v, %v; want users unmarked", mono, err)
	}

	// The marks' bucket lost while the dispenser runs: the watch marks orders again.
	js, err := jetstream.New(srv.Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	if err := js.DeleteKeyValue(ctx, "leaf_tagopts"); err != nil {
		t.Fatal(err)
	}
	testutil.Eventually(t, 20*time.Second, "orders marked monotonic again", func() bool {
		return isMonotonic(ctx, c, "orders")
	})

	// Lost while no dispenser runs: the next start marks it again before it serves.
	d.Close()
	if err := js.DeleteKeyValue(ctx, "leaf_tagopts"); err != nil {
		t.Fatal(err)
	}
	d2, err := newTest(t, cfg)
	if err != nil {
		t.Fatal(err)
	}
	if mono, err := d2.mono.MonotonicTags(ctx); err != nil || !mono["orders"] || mono["users"] {
		t.Fatalf("marks after a start without them = %v, %v; want orders only", mono, err)
	}
}

func isMonotonic(ctx context.Context, c *client.Client, tag string) bool {
	tags, err := c.Tags(ctx)
	if err != nil {
		return false
	}
	for _, t := range tags {
		if t.Tag == tag {
			return t.Monotonic
		}
	}
	return false
}

// readRecord reads the deployment record of prefix leaf on srv.
func readRecord(tb testing.TB, srv *testenv.NATS) wire.Deployment {
	tb.Helper()
	js, err := jetstream.New(srv.Connect(tb))
	if err != nil {
		tb.Fatal(err)
	}
	ctx := testutil.Context(tb, 10*time.Second)
	r, err := deployment.Open(ctx, js, "leaf", 1)
	if err != nil {
		tb.Fatal(err)
	}
	e, err := r.Get(ctx)
	if err != nil {
		tb.Fatalf("read the deployment record: %v", err)
	}
	return e.Record
}

// writeRecord writes rec over the record of prefix leaf on srv, as an operator's `nats
// kv put` would.
func writeRecord(tb testing.TB, srv *testenv.NATS, rec wire.Deployment) {
	tb.Helper()
	js, err := jetstream.New(srv.Connect(tb))
	if err != nil {
		tb.Fatal(err)
	}
	ctx := testutil.Context(tb, 10*time.Second)
	kv, err := js.KeyValue(ctx, "leaf_deployment")
	if err != nil {
		tb.Fatal(err)
	}
	b, err := rec.Marshal()
	if err != nil {
		tb.Fatal(err)
	}
	if _, err := kv.Put(ctx, wire.DeploymentKey, b); err != nil {
		tb.Fatal(err)
	}
}

// withDeploymentEvery makes a running dispenser read the record every d.
func withDeploymentEvery(d time.Duration) Option {
	return func(o *options) error {
		o.deploymentEvery = d
		return nil
	}
}
