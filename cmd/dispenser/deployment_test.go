package main

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/leafbus/leafbus/deployment"
	"github.com/leafbus/leafbus/internal/testutil"
	"github.com/leafbus/leafbus/testenv"
)

// run runs the dispenser command line args and returns its exit code and output.
func run(t *testing.T, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	// stderr gets the logs, some after the command returned (a closed connection's).
	var out, errOut testutil.SyncBuffer
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	code = runCommand(ctx, args, &out, &errOut)
	return code, out.String(), errOut.String()
}

// TestDeploymentCommand: `dispenser deployment show|set` on a deployment on NATS. A
// dispenser with default flags joins it; show prints the record its start wrote. A
// dispenser with another epoch is refused, naming --epoch. `set` with the new epoch
// shows the difference and writes nothing without --confirm; with it, it is refused
// while the dispenser of the old epoch runs, naming it; once that one stopped, the
// record changes and a dispenser of the new epoch starts.
func TestDeploymentCommand(t *testing.T) {
	t.Parallel() // its own servers and ports: it waits beside the others (make test's longest package)
	srv := testenv.StartNATS(t)
	url := srv.URL()
	oldLogs := &testutil.SyncBuffer{}
	oldCtx, stopOld := context.WithCancel(context.Background())
	defer stopOld()
	old, err := newDispenser(oldCtx, t, testDefaults(t, func(c *testConfig) { c.NATS, c.NodeID, c.HTTP = url, "disp-1", "" }), io.Discard, oldLogs)
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	oldDone := make(chan error, 1)
	go func() { oldDone <- old.Run(oldCtx) }()
	select {
	case <-old.Ready():
	case <-time.After(30 * time.Second):
		t.Fatal("the first dispenser is not ready within 30s")
	}

	code, out, errOut := run(t, "deployment", "show", "--nats", url)
	if code != 0 || !strings.Contains(out, "KV bucket leaf_deployment, key deployment, revision 1:") ||
		!strings.Contains(out, `"identity": "kv leaf_segments"`) || !strings.Contains(out, `"written_by": "disp-1"`) {
		t.Fatalf("deployment show: exit %d\nstdout: %s\nstderr: %s", code, out, errOut)
	}

	newEpoch := func(c *testConfig) { c.NATS, c.NodeID, c.HTTP, c.Epoch = url, "disp-2", "", 1700000000000 }
	if err := startErr(t, newEpoch); !errors.Is(err, deployment.ErrMismatch) || !strings.Contains(err.Error(), "--epoch 1288834974657") {
		t.Fatalf("a dispenser with another epoch: %v, want ErrMismatch naming --epoch", err)
	}

	setArgs := []string{"deployment", "set", "--nats", url, "--node-id", "operator", "--epoch", "1700000000000", "--data-dir", t.TempDir()}
	code, out, errOut = run(t, setArgs...)
	if code != 1 || !strings.Contains(out, "snowflake epoch: the deployment's is 1288834974657, this dispenser's is 1700000000000") ||
		!strings.Contains(out, `"epoch": 1700000000000`) || !strings.Contains(errOut, "do not fit the new record") {
		t.Fatalf("deployment set without --confirm: exit %d\nstdout: %s\nstderr: %s", code, out, errOut)
	}
	if code, out, _ := run(t, "deployment", "show", "--nats", url); code != 0 || !strings.Contains(out, "revision 1:") {
		t.Fatalf("a dry run changed the record:\n%s", out)
	}
	// The old dispenser runs and contradicts the new record: set refuses, naming it.
	code, _, errOut = run(t, append(setArgs, "--confirm", "--revision", "1")...)
	if code != 1 || !strings.Contains(errOut, "do not fit the new record") || !strings.Contains(errOut, `"disp-1"`) {
		t.Fatalf("deployment set beside a live dispenser it contradicts: exit %d\nstderr: %s", code, errOut)
	}
	stopOld()
	select {
	case err := <-oldDone:
		if err != nil {
			t.Fatalf("the old dispenser's Run = %v", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the old dispenser did not stop")
	}
	code, out, errOut = run(t, append(setArgs, "--confirm", "--revision", "1")...)
	if code != 0 || !strings.Contains(out, "written: revision 2 of KV bucket leaf_deployment") {
		t.Fatalf("deployment set --confirm: exit %d\nstdout: %s\nstderr: %s", code, out, errOut)
	}
	code, _, errOut = run(t, append(setArgs, "--confirm", "--revision", "1")...)
	if code != 1 || !strings.Contains(errOut, "changed since it was read") {
		t.Fatalf("deployment set over an old revision: exit %d\nstderr: %s", code, errOut)
	}

	startDispenser(t, newEpoch)

	// A record that is garbage: show prints it and fails; set --confirm writes a good one.
	js, err := jetstream.New(srv.Connect(t))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	kv, err := js.KeyValue(ctx, "leaf_deployment")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, "deployment", []byte("garbage")); err != nil {
		t.Fatal(err)
	}
	code, out, errOut = run(t, "deployment", "show", "--nats", url)
	if code != 1 || !strings.Contains(out, "unreadable:\ngarbage") || !strings.Contains(errOut, "deployment record unreadable") {
		t.Fatalf("deployment show of garbage: exit %d\nstdout: %s\nstderr: %s", code, out, errOut)
	}
	if err := startErr(t, newEpoch); !errors.Is(err, deployment.ErrCorrupt) {
		t.Fatalf("a start on a garbage record: %v, want ErrCorrupt", err)
	}
	code, out, errOut = run(t, append(setArgs, "--confirm")...)
	if code != 0 || !strings.Contains(out, "written: revision") {
		t.Fatalf("deployment set --confirm over garbage: exit %d\nstdout: %s\nstderr: %s", code, out, errOut)
	}
	startDispenser(t, newEpoch)
}

// TestDeploymentCommandEmbedded: without --nats the command opens the data dir's own
// server, and only when no dispenser holds the dir.
func TestDeploymentCommandEmbedded(t *testing.T) {
	dir := t.TempDir()
	d := startDispenser(t, func(c *testConfig) { c.DataDir = dir })
	code, _, errOut := run(t, "deployment", "show", "--data-dir", dir)
	if code != 1 || !strings.Contains(errOut, "--data-dir") {
		t.Fatalf("deployment show on a data dir in use: exit %d\nstderr: %s", code, errOut)
	}
	if err := d.stop(); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := run(t, "deployment", "show", "--data-dir", dir)
	if code != 0 || !strings.Contains(out, "revision 1:") || !strings.Contains(out, `"written_by": "test-node"`) {
		t.Fatalf("deployment show of a stopped embedded deployment: exit %d\nstdout: %s\nstderr: %s", code, out, errOut)
	}
	missing := filepath.Join(dir, "nothing-here")
	if code, _, errOut := run(t, "deployment", "show", "--data-dir", missing); code != 1 || !strings.Contains(errOut, "--data-dir") {
		t.Fatalf("deployment show of a data dir that does not exist: exit %d\nstderr: %s", code, errOut)
	}
	if _, err := os.Stat(missing); err == nil {
		t.Errorf("deployment show created %s", missing)
	}
	for _, args := range [][]string{{"deployment"}, {"deployment", "list"}} {
		if code, _, _ := run(t, args...); code != 2 {
			t.Errorf("dispenser %s: exit %d, want 2", strings.Join(args, " "), code)
		}
	}
}

// TestFenceCommand is issue 21's restore, through the command README gives: serve IDs
// (embedded: store and marks in the data dir), copy the data dir, serve more, stop, put
// the copy back, run `dispenser fence`, start: no ID is served twice.
func TestFenceCommand(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "data")
	backup := filepath.Join(t.TempDir(), "backup")
	seen := map[int64]string{}
	serve := func(who string) {
		t.Helper()
		d := startDispenser(t, func(c *testConfig) { c.DataDir = dir })
		c := d.client(t)
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		for range 3 {
			id, err := c.Segment(ctx, "leaf-segment-test")
			if err != nil {
				t.Fatalf("%s: %v", who, err)
			}
			if prev, dup := seen[id]; dup {
				t.Errorf("%s: ID %d was already served %s", who, id, prev)
			}
			seen[id] = who
		}
		if err := d.stop(); err != nil {
			t.Fatal(err)
		}
	}
	serve("before the backup")
	if err := os.CopyFS(backup, os.DirFS(dir)); err != nil {
		t.Fatal(err)
	}
	serve("after the backup")
	if err := os.RemoveAll(dir); err != nil {
		t.Fatal(err)
	}
	if err := os.CopyFS(dir, os.DirFS(backup)); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := run(t, "fence", "--data-dir", dir)
	if code != 0 || !strings.Contains(out, "leaf-segment-test") || !strings.Contains(out, "fenced 1 tags by 10000000000") {
		t.Fatalf("dispenser fence: exit %d\nstdout: %s\nstderr: %s", code, out, errOut)
	}
	serve("after the fence")
	if code, _, errOut := run(t, "fence", "--data-dir", dir, "--margin", "0"); code != 2 || !strings.Contains(errOut, "--margin 0") {
		t.Errorf("dispenser fence --margin 0: exit %d\nstderr: %s", code, errOut)
	}
	// A margin that uses every tag up is refused without --confirm, before anything.
	if code, _, errOut := run(t, "fence", "--data-dir", dir, "--margin", "9223372036854775807"); code != 2 || !strings.Contains(errOut, "--confirm") {
		t.Errorf("dispenser fence --margin 9223372036854775807: exit %d\nstderr: %s", code, errOut)
	}
}
