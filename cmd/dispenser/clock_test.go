package main

// Clock safety through the real dispenser code path (issue 3). Each test names the
// hole in Leaf (or one of its Go ports) it closes.

import (
	"context"
	"encoding/json"
	"errors"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/leafbus/leafbus/dispenser"
	"github.com/leafbus/leafbus/internal/testutil"
	"github.com/leafbus/leafbus/snowflake"
	"github.com/leafbus/leafbus/testenv"
	"github.com/leafbus/leafbus/wire"
	"github.com/leafbus/leafbus/workerid"
)

// putForever writes a leaf_forever record the way a dispenser would.
func putForever(t *testing.T, nc *nats.Conn, node string, rec workerid.Record) {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	kv, err := js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "leaf_forever"})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(rec)
	if _, err := kv.Put(ctx, node, b); err != nil {
		t.Fatal(err)
	}
}

// TestBinaryRefusesClockBehindRecord: a record in leaf_forever ahead of the real clock
// (the clock was set back since the node last ran) makes the real binary refuse to
// start, exit non-zero and say why with both times. Closes Leaf's start-up check, which
// only runs on its ZooKeeper path and is swallowed by the cache fallback.
func TestBinaryRefusesClockBehindRecord(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	srv := testenv.StartNATS(t)
	ahead := time.Now().Add(time.Hour).UnixMilli()
	putForever(t, srv.Connect(t), "bin-test", workerid.Record{WorkerID: 0, Timestamp: ahead})

	bin, err := buildDispenser()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "--nats", srv.URL(), "--node-id", "bin-test", "--data-dir", t.TempDir())
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() == 0 {
		t.Fatalf("dispenser with its clock an hour behind its record: err %v, want a non-zero exit\n%s", err, out)
	}
	msg := string(out)
	aheadText := time.UnixMilli(ahead).UTC().Format("2006-01-02T15:04:05")
	for _, want := range []string{"behind the record", aheadText, "--clock-wait-max"} {
		if !strings.Contains(msg, want) {
			t.Errorf("refusal does not mention %q:\n%s", want, msg)
		}
	}
}

// TestPeerSkewRefused: two dispensers run; a third starting for the first time with its
// clock 10 s ahead of theirs refuses to start. Leaf's article describes this check (and
// Leaf later dropped it); without it a new node with a wrong clock would serve.
func TestPeerSkewRefused(t *testing.T) {
	srv := testenv.StartNATS(t)
	for _, node := range []string{"peer-a", "peer-b"} {
		startDispenser(t, func(c *testConfig) {
			c.NATS = srv.URL()
			c.NodeID = node
		})
	}
	err := startErr(t, func(c *testConfig) {
		c.NATS = srv.URL()
		c.NodeID = "skewed"
		c.Clock = snowflake.NewFakeClock(time.Now().Add(10 * time.Second))
	})
	if !errors.Is(err, workerid.ErrPeerSkew) {
		t.Fatalf("start with a clock 10s off its peers = %v, want ErrPeerSkew", err)
	}
	if !strings.Contains(err.Error(), "2 peers") {
		t.Errorf("refusal %q does not say how many peers answered", err)
	}
	// Within the allowed skew it starts.
	startDispenser(t, func(c *testConfig) {
		c.NATS = srv.URL()
		c.NodeID = "slightly-off"
		c.Clock = snowflake.NewFakeClock(time.Now().Add(time.Second))
	})
}

// TestRestartWithClockSetBackNoRepeat: a dispenser issues snowflake IDs, stops, and
// starts again at once with its clock 2 s behind the last timestamp it issued: with
// --clock-wait-max covering the gap it waits past its record (and says so) instead of
// repeating IDs. Closes the hole found in Leaf
// where a restart within the 3 s heartbeat after a small rollback repeats IDs. (The
// crash variant, killed between heartbeats, is TestRestartSafety in package workerid.)
func TestRestartWithClockSetBackNoRepeat(t *testing.T) {
	srv := testenv.StartNATS(t)
	dataDir := t.TempDir()
	configure := func(clock snowflake.Clock) func(*testConfig) {
		return func(c *testConfig) {
			c.NATS = srv.URL()
			c.NodeID = "restarter"
			c.DataDir = dataDir
			c.WorkerRegistry = "static"
			c.WorkerID = 9
			c.Clock = clock
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	seen := map[int64]bool{}
	take := func(d *testDispenser) {
		c := d.client(t)
		for i := 0; i < 50; i++ {
			ids, err := c.SnowflakeN(ctx, "x", 2000)
			if err != nil {
				t.Fatal(err)
			}
			for _, id := range ids {
				if seen[id] {
					t.Fatalf("snowflake ID %d repeated after the restart", id)
				}
				seen[id] = true
			}
		}
	}
	first := startDispenser(t, configure(nil))
	take(first)
	if err := first.stop(); err != nil {
		t.Fatal(err)
	}

	// The machine's clock is set back by 2 s and the dispenser restarts at once. Its
	// record is fresh (a clean stop), so the clock is 2 s behind it: past
	// --clock-wait-max it would refuse (TestBinaryRefusesClockBehindRecord); here it may
	// wait that long.
	clock := testutil.OffsetClock{Offset: -2 * time.Second}
	second := startDispenser(t, func(c *testConfig) {
		configure(clock)(c)
		c.ClockWaitMax = 5 * time.Second
	})
	if log := second.stderr.String(); !strings.Contains(log, "waiting") {
		t.Errorf("restart with the clock behind its record did not log a wait:\n%s", log)
	}
	take(second)
}

// TestBinaryKilledRestartNoRepeat kills the real binary (SIGKILL, no final record)
// while clients take IDs at full speed, restarts it at once on the same data dir, and
// checks that no ID of either kind repeats: the segment store never re-serves a range
// (one Go port of Leaf did, from a stale cache), and snowflake waits past the record.
func TestBinaryKilledRestartNoRepeat(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	t.Parallel() // its own servers and ports: it waits beside the others (make test's longest package)
	dataDir := t.TempDir()
	seen := map[wire.Kind]map[int64]bool{wire.Segment: {}, wire.Snowflake: {}}
	var mu sync.Mutex
	run := func(life int) {
		// A static worker ID, so the restart reuses it and must start past its record.
		b := startBinary(t, dataDir, "--worker-registry", "static", "--worker-id", "5")
		_, c := b.connect(t, nats.MaxReconnects(0))
		var wg sync.WaitGroup
		for w := 0; w < 4; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				kind := wire.Kind(w % 2)
				for {
					ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
					ids := make([]int64, 100)
					err := c.Fill(ctx, kind, dispenser.SampleTagName, ids)
					cancel()
					if err != nil {
						return // the process was killed
					}
					mu.Lock()
					for _, id := range ids {
						if seen[kind][id] {
							mu.Unlock()
							t.Errorf("%v ID %d repeated across a kill and restart", kind, id)
							return
						}
						seen[kind][id] = true
					}
					mu.Unlock()
				}
			}()
		}
		time.Sleep(time.Second)
		b.cmd.Process.Kill()
		wg.Wait()
		if life == 2 && !strings.Contains(b.stderr.String(), "for the clock to pass the last record") {
			t.Errorf("the restarted dispenser did not wait past its record:\n%s", b.stderr.String())
		}
	}
	run(1)
	run(2)
	mu.Lock()
	defer mu.Unlock()
	if len(seen[wire.Segment]) == 0 || len(seen[wire.Snowflake]) == 0 {
		t.Fatalf("no IDs taken: %d segment, %d snowflake", len(seen[wire.Segment]), len(seen[wire.Snowflake]))
	}
	t.Logf("%d segment and %d snowflake IDs over two lives, none repeated", len(seen[wire.Segment]), len(seen[wire.Snowflake]))
}
