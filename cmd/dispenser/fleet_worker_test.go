package main

// Issue 21's worker-ID mistakes of a fleet, tried as an operator would, with real
// dispenser processes (the binary) on a testenv NATS server and ZooKeeper.

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/leafbus/leafbus/client"
	"github.com/leafbus/leafbus/internal/testutil"
	"github.com/leafbus/leafbus/snowflake"
	"github.com/leafbus/leafbus/testenv"
)

// binSnowflakes takes n snowflake IDs from the dispensers on url in one request and
// returns them with the worker ID they carry.
func binSnowflakes(t *testing.T, url string, n int) ([]int64, int64) {
	t.Helper()
	nc, err := nats.Connect(url, nats.Timeout(5*time.Second))
	if err != nil {
		t.Fatalf("connect to %s: %v", url, err)
	}
	defer nc.Close()
	c, err := client.NewClient(nc, client.WithHedge(0))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	ids, err := c.SnowflakeN(ctx, "fleet", n)
	if err != nil {
		t.Fatalf("SnowflakeN: %v", err)
	}
	dec, err := snowflake.DefaultLayout().Decode(ids[0])
	if err != nil {
		t.Fatalf("Decode(%d): %v", ids[0], err)
	}
	return ids, dec.WorkerID
}

// TestRegistrySwitchWhileZKDown is issue 21's "registry switch while ZooKeeper is down":
// a node that ran with --worker-registry kv is restarted with --worker-registry zk while
// ZooKeeper is unreachable. Its cache file holds the worker ID the KV registry leased,
// which the KV registry will hand to another node; the restart must refuse to start
// from it, saying why, instead of issuing with it.
func TestRegistrySwitchWhileZKDown(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	srv := testenv.StartNATS(t)
	zk := testenv.StartZooKeeper(t)
	zkAddr := zk.Addr()
	dir := t.TempDir()
	common := []string{"--nats", srv.URL(), "--node-id", "disp-1", "--http", ""}
	zkFlags := []string{"--worker-registry", "zk", "--zk", zkAddr, "--advertise", "127.0.0.1:7101"}

	kv := startBinary(t, dir, append(common, "--worker-registry", "kv")...)
	_, worker := binSnowflakes(t, srv.URL(), 1000)
	stopBinary(t, kv)

	// The operator moves the deployment to ZooKeeper (the deployment record would
	// refuse the switch otherwise: the first line of defence), then ZooKeeper goes
	// down before the node's restart: the cache file is the second line.
	set := append(append([]string{"deployment", "set"}, common...), zkFlags...)
	if code, out, _ := runToExit(t, 30*time.Second, nil, append(set, "--confirm")...); code != 0 {
		t.Fatalf("deployment set --worker-registry zk: exit %d:\n%s", code, out)
	}
	zk.Stop()

	code, stderr, took := runToExit(t, 30*time.Second, nil, append(append(common, "--data-dir", dir, "--start-timeout", "3s"), zkFlags...)...)
	t.Logf("exit %d after %v:\n%s", code, took.Round(time.Millisecond), stderr)
	if code == 0 {
		t.Fatal("the restart with --worker-registry zk exited 0, want a refusal")
	}
	last := lastLine(stderr)
	for _, want := range []string{
		fmt.Sprintf("holds worker ID %d from registry \"kv leaf_leases\", not this one (\"zk /snowflake/leafbus\")", worker),
		"start with ZooKeeper reachable",
	} {
		if !strings.Contains(last, want) {
			t.Errorf("the refusal does not say %q:\n%s", want, last)
		}
	}
}

// spawnBinary runs the compiled dispenser with args without waiting for it to serve; it
// is killed at cleanup.
func spawnBinary(t *testing.T, args ...string) *process {
	t.Helper()
	bin, err := buildDispenser()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), "LEAFBUS_LOG_LEVEL=debug")
	p := &process{cmd: cmd, stderr: &testutil.SyncBuffer{}, done: make(chan error, 1)}
	cmd.Stderr = p.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.done <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		err := <-p.done
		p.done <- err
	})
	return p
}

// fleetIDs is every snowflake ID the dispensers of a test served over HTTP, by who
// served it, with the repeats.
type fleetIDs struct {
	mu     sync.Mutex
	by     map[int64]string
	served map[string]int
	dups   int
	first  string // the first repeat, for the failure message
}

// load asks base (a dispenser's HTTP face, named who) for snowflake IDs in batches of
// 100 until ctx ends, recording every ID; requests that fail (not serving yet, or any
// more; a 503) are asked again.
func (f *fleetIDs) load(ctx context.Context, who, base string) {
	hc := &http.Client{Timeout: 2 * time.Second}
	for ctx.Err() == nil {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, base+"/api/snowflake/get/fleet?count=100", nil)
		resp, err := hc.Do(req)
		if err != nil {
			time.Sleep(20 * time.Millisecond)
			continue
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			time.Sleep(20 * time.Millisecond)
			continue
		}
		f.mu.Lock()
		for line := range strings.SplitSeq(string(body), "\n") {
			id, err := strconv.ParseInt(line, 10, 64)
			if err != nil {
				continue
			}
			if prev, dup := f.by[id]; dup {
				if f.dups == 0 {
					f.first = fmt.Sprintf("ID %d from %s, already served by %s", id, who, prev)
				}
				f.dups++
				continue
			}
			f.by[id] = who
			f.served[who]++
		}
		f.mu.Unlock()
	}
}

// servesOn waits up to within until who has served more IDs than it had when called:
// that it serves now, shown by its answers, however slow the machine.
func (f *fleetIDs) servesOn(t *testing.T, who string, within time.Duration) {
	t.Helper()
	count := func() int {
		f.mu.Lock()
		defer f.mu.Unlock()
		return f.served[who]
	}
	before := count()
	testutil.Eventually(t, within, who+" serving snowflake IDs", func() bool { return count() > before })
}

// loadFleet loads each dispenser of bases (who -> HTTP base URL) from two goroutines
// until stop is called, which returns what they served; ids is what they served so far.
func loadFleet(bases map[string]string) (ids *fleetIDs, stop func() *fleetIDs) {
	ids = &fleetIDs{by: map[int64]string{}, served: map[string]int{}}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for who, base := range bases {
		for range 2 {
			wg.Go(func() { ids.load(ctx, who, base) })
		}
	}
	return ids, func() *fleetIDs {
		cancel()
		wg.Wait()
		return ids
	}
}

// waitRefusal waits up to within for p to exit, and checks that it exited non-zero with
// a last line that says every one of wants. One still running fails t, and the test
// goes on to count what both served.
func waitRefusal(t *testing.T, p *process, within time.Duration, who string, wants ...string) {
	t.Helper()
	select {
	case err := <-p.done:
		p.done <- err
		if err == nil {
			t.Fatalf("%s exited 0, want a refusal\nstderr:\n%s", who, p.stderr.String())
		}
	case <-time.After(within):
		t.Errorf("%s still running after %v: it serves with a worker ID another dispenser holds\nstderr:\n%s", who, within, lastLines(p.stderr.String(), 5))
		return
	}
	last := lastLine(p.stderr.String())
	t.Logf("%s refused: %s", who, last)
	for _, want := range wants {
		if !strings.Contains(last, want) {
			t.Errorf("%s's refusal does not say %q:\n%s", who, want, last)
		}
	}
}

// lastLines is the last n lines of s.
func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// checkFleet fails t on any ID served twice, and unless served was the only one to
// serve.
func checkFleet(t *testing.T, ids *fleetIDs, served string) {
	t.Helper()
	t.Logf("snowflake IDs served over HTTP: %v, %d repeats", ids.served, ids.dups)
	if ids.dups > 0 {
		t.Errorf("%d snowflake IDs served twice (first: %s)", ids.dups, ids.first)
	}
	for who, n := range ids.served {
		if who != served && n > 0 {
			t.Errorf("%s served %d snowflake IDs with a worker ID %s held", who, n, served)
		}
	}
	if ids.served[served] == 0 {
		t.Errorf("%s served no snowflake ID", served)
	}
}

// TestTwoZKNamesOneDeployment is issue 21's "two ZooKeeper names in one deployment":
// following README's production example (--zk-name leaf-prod) and then its migration
// section (Leaf's leaf.name), one dispenser runs under each name on the same ZooKeeper
// and NATS, and both are given worker ID 0. The second must refuse to start, naming
// worker ID 0 and the first, while the first serves on; no snowflake ID is served twice.
// (Before the fence both served: 21,689 of 60,000 IDs were shared.)
func TestTwoZKNamesOneDeployment(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	srv := testenv.StartNATS(t)
	zk := testenv.StartZooKeeper(t)
	node := func(id, name, advertise string, httpPort int) []string {
		return []string{"--nats", srv.URL(), "--node-id", id, "--data-dir", t.TempDir(),
			"--worker-registry", "zk", "--zk", zk.Addr(), "--zk-name", name, "--advertise", advertise,
			"--http", fmt.Sprintf("127.0.0.1:%d", httpPort)}
	}
	p1, p2 := freePort(t), freePort(t)
	first := startBinary(t, t.TempDir(), node("disp-1", "leaf-prod", "127.0.0.1:7201", p1)...)
	ids, stop := loadFleet(map[string]string{
		"disp-1": fmt.Sprintf("http://127.0.0.1:%d", p1),
		"disp-2": fmt.Sprintf("http://127.0.0.1:%d", p2),
	})
	ids.servesOn(t, "disp-1", 20*time.Second) // under load when disp-2 comes
	// The deployment record refuses it, naming the flag; were the record gone (a
	// dispenser of an older version wrote nothing), the worker record's fence would
	// (TestStaticWorkerIDTwice shows the fence where the record lets both start).
	second := spawnBinary(t, node("disp-2", "leaf", "127.0.0.1:7202", p2)...)
	waitRefusal(t, second, 20*time.Second, "disp-2",
		`the deployment's is "zk /snowflake/leaf-prod", this dispenser's is "zk /snowflake/leaf"`, "--zk-name leaf-prod")
	ids.servesOn(t, "disp-1", 20*time.Second) // and goes on serving
	checkFleet(t, stop(), "disp-1")
	_ = first
}

// TestStaticWorkerIDTwice: two dispensers given --worker-registry static --worker-id 7
// on one NATS: the second refuses to start, naming the first, which serves on, and no
// snowflake ID is served twice.
func TestStaticWorkerIDTwice(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	srv := testenv.StartNATS(t)
	node := func(id string, httpPort int) []string {
		return []string{"--nats", srv.URL(), "--node-id", id, "--data-dir", t.TempDir(),
			"--worker-registry", "static", "--worker-id", "7", "--http", fmt.Sprintf("127.0.0.1:%d", httpPort)}
	}
	p1, p2 := freePort(t), freePort(t)
	startBinary(t, t.TempDir(), node("disp-1", p1)...)
	ids, stop := loadFleet(map[string]string{
		"disp-1": fmt.Sprintf("http://127.0.0.1:%d", p1),
		"disp-2": fmt.Sprintf("http://127.0.0.1:%d", p2),
	})
	ids.servesOn(t, "disp-1", 20*time.Second)
	second := spawnBinary(t, node("disp-2", p2)...)
	waitRefusal(t, second, 20*time.Second, "disp-2", "worker ID 7 is held by node disp-1", "never the same --worker-id twice")
	ids.servesOn(t, "disp-1", 20*time.Second)
	checkFleet(t, stop(), "disp-1")
}

// TestRaceToStartOnOneID: two dispensers with one static worker ID start at the same
// moment on one NATS, five times over: each time exactly one serves and the other
// refuses to start, naming it; no snowflake ID is served twice.
func TestRaceToStartOnOneID(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	t.Parallel() // its own servers and ports: it waits beside the others (make test's longest package)
	srv := testenv.StartNATS(t)
	for round := range 5 {
		worker := fmt.Sprint(20 + round)
		ports := map[string]int{"racer-a": freePort(t), "racer-b": freePort(t)}
		bases := map[string]string{}
		procs := map[string]*process{}
		for who, port := range ports {
			bases[who] = fmt.Sprintf("http://127.0.0.1:%d", port)
		}
		ids, stop := loadFleet(bases)
		for who, port := range ports {
			procs[who] = spawnBinary(t, "--nats", srv.URL(), "--node-id", who, "--data-dir", t.TempDir(),
				"--worker-registry", "static", "--worker-id", worker, "--http", fmt.Sprintf("127.0.0.1:%d", port))
		}
		// One exits refusing; the other goes on serving.
		var loser, winner string
		select {
		case err := <-procs["racer-a"].done:
			procs["racer-a"].done <- err
			loser, winner = "racer-a", "racer-b"
		case err := <-procs["racer-b"].done:
			procs["racer-b"].done <- err
			loser, winner = "racer-b", "racer-a"
		case <-time.After(20 * time.Second):
			t.Errorf("round %d: both racers for worker ID %s still running after 20s", round, worker)
			checkFleet(t, stop(), "racer-a")
			t.FailNow()
		}
		waitRefusal(t, procs[loser], time.Second, loser, "worker ID "+worker+" is held by node "+winner)
		ids.servesOn(t, winner, 20*time.Second) // the loser, gone, cannot
		select {
		case err := <-procs[winner].done:
			t.Fatalf("round %d: the winner %s exited too (%v)\nstderr:\n%s", round, winner, err, lastLines(procs[winner].stderr.String(), 20))
		default:
		}
		checkFleet(t, stop(), winner)
		procs[winner].cmd.Process.Signal(syscall.SIGTERM)
	}
}
