package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/leafbus/leafbus/client"
	"github.com/leafbus/leafbus/internal/testutil"
	"github.com/leafbus/leafbus/testenv"
)

// beforeDeploymentRecord is the commit before the deployment record (the parent of the
// first commit of package deployment: `git log --oneline -- deployment/`). Its
// dispensers publish no deployment_record in their $SRV metadata, neither write nor
// check the record, and keep the same data dir and KV layout otherwise.
const beforeDeploymentRecord = "3345baa"

// buildOldDispenser compiles cmd/dispenser as of beforeDeploymentRecord, from `git
// archive` of this repository into a temp dir, once per test binary run. It returns a
// reason to skip when the history is not there (a shallow clone).
var buildOldDispenser = sync.OnceValues(func() (string, error) {
	if out, err := exec.Command("git", "rev-parse", "--is-shallow-repository").Output(); err != nil {
		return "", errSkip{fmt.Sprintf("no git history here (git rev-parse: %v)", err)}
	} else if strings.TrimSpace(string(out)) == "true" {
		return "", errSkip{"a shallow clone: commit " + beforeDeploymentRecord + " is not in it (CI clones in full)"}
	}
	if err := exec.Command("git", "cat-file", "-e", beforeDeploymentRecord+"^{commit}").Run(); err != nil {
		return "", errSkip{"commit " + beforeDeploymentRecord + " is not in this clone's history"}
	}
	dir, err := os.MkdirTemp("", "leafbus-old")
	if err != nil {
		return "", err
	}
	src := filepath.Join(dir, "src")
	if err := os.Mkdir(src, 0o755); err != nil {
		return "", err
	}
	top, err := exec.Command("git", "rev-parse", "--show-toplevel").Output()
	if err != nil {
		return "", fmt.Errorf("git rev-parse --show-toplevel: %w", err)
	}
	// From the top: in a subdirectory, git archive takes that directory's tree only.
	archive := exec.Command("sh", "-c", `git archive --format=tar "$1" | tar -x -C "$2"`, "sh", beforeDeploymentRecord, src)
	archive.Dir = strings.TrimSpace(string(top))
	if out, err := archive.CombinedOutput(); err != nil {
		return "", fmt.Errorf("git archive %s: %v\n%s", beforeDeploymentRecord, err, out)
	}
	bin := filepath.Join(dir, "dispenser")
	// -trimpath: the compiled packages do not depend on the temp dir, so the build
	// cache serves the next run (a first build takes about 40 s on 2 busy cores).
	build := exec.Command("go", "build", "-trimpath", "-o", bin, "./cmd/dispenser")
	build.Dir = src
	if out, err := build.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build of %s: %v\n%s", beforeDeploymentRecord, err, out)
	}
	return bin, nil
})

type errSkip struct{ why string }

func (e errSkip) Error() string { return e.why }

// rollLoad is the load of a rolling upgrade: hedging clients asking for segment and
// snowflake IDs without a pause, every ID kept to find a repeat, every failed call
// counted.
type rollLoad struct {
	mu       sync.Mutex
	seen     map[string]map[int64]bool // by kind
	dup      string                    // the first repeat
	dups     int
	calls    int
	failed   int
	firstErr error
}

func (l *rollLoad) add(kind string, ids []int64, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.calls++
	if err != nil {
		if l.failed == 0 {
			l.firstErr = err
		}
		l.failed++
		return
	}
	for _, id := range ids {
		if l.seen[kind][id] {
			if l.dups == 0 {
				l.dup = fmt.Sprintf("%s ID %d", kind, id)
			}
			l.dups++
		}
		l.seen[kind][id] = true
	}
}

func (l *rollLoad) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.calls
}

// startRollLoad runs the load on url until the returned stop is called.
func startRollLoad(t *testing.T, url, tag string) (*rollLoad, func() *rollLoad) {
	t.Helper()
	l := &rollLoad{seen: map[string]map[int64]bool{"segment": {}, "snowflake": {}}}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for i := range 4 {
		nc, err := nats.Connect(url, nats.MaxReconnects(-1))
		if err != nil {
			t.Fatal(err)
		}
		// Hedged after 100 ms: a request in the queue of a dispenser that stops is sent
		// again to another.
		c, err := client.NewClient(nc, client.WithHedge(100*time.Millisecond), client.WithTimeout(10*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			defer nc.Close()
			// Paced, a call every 2 ms per client at most: a load, not a benchmark
			// on cores the rest of the suite shares.
			pace := time.NewTicker(2 * time.Millisecond)
			defer pace.Stop()
			for ctx.Err() == nil {
				<-pace.C
				var ids []int64
				var err error
				kind := "segment"
				if i%2 == 0 {
					ids, err = c.SegmentN(context.Background(), tag, 10)
				} else {
					kind = "snowflake"
					ids, err = c.SnowflakeN(context.Background(), "roll", 10)
				}
				l.add(kind, ids, err)
			}
		})
	}
	return l, func() *rollLoad {
		cancel()
		wg.Wait()
		return l
	}
}

// TestBinaryRollingUpgrade rolls a fleet of three dispensers on one NATS server (KV
// store, KV worker registry) from the build of beforeDeploymentRecord to this one and
// back, one dispenser at a time (SIGTERM, then the other build on the same data dir and
// node ID), under a load of hedging clients: no ID twice, no call failed. The first
// upgraded dispenser names the two old ones in a warning: they do not check the
// deployment record (docs/operations.md "Rolling upgrade").
func TestBinaryRollingUpgrade(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary of an earlier commit")
	}
	t.Parallel() // its own servers and ports: it waits beside the others (make test's longest package)
	began := time.Now()
	old, err := buildOldDispenser()
	if skip, ok := err.(errSkip); ok {
		t.Skip("rolling upgrade not tested: " + skip.why)
	}
	if err != nil {
		t.Fatal(err)
	}
	cur, err := buildDispenser()
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("builds: %v", time.Since(began).Round(time.Millisecond))
	srv := testenv.StartNATS(t)
	const n = 3
	dirs := make([]string, n)
	procs := make([]*process, n)
	start := func(i int, bin string) {
		procs[i] = startBinaryOf(t, bin, dirs[i], 0, "--nats", srv.URL(), "--node-id", fmt.Sprintf("disp-%d", i+1), "--http", "")
	}
	for i := range n {
		dirs[i] = t.TempDir()
		start(i, old)
	}
	if code, out, errOut := run(t, "tag", "add", "--nats", srv.URL(), "--tag", "roll", "--step", "1000"); code != 0 {
		t.Fatalf("tag add: exit %d\n%s%s", code, out, errOut)
	}
	load, stop := startRollLoad(t, srv.URL(), "roll")
	// Each step waits for calls answered after it, so that every dispenser of the
	// fleet as it now is serves under load before the next one stops.
	served := func(what string) {
		before := load.count()
		testutil.Eventually(t, 30*time.Second, "calls answered after "+what, func() bool { return load.count() >= before+50 })
	}
	served("the old fleet started")
	rolled := time.Now()
	for i, to := range []string{cur, cur, cur, old, old, old} {
		k := i % n
		stopBinary(t, procs[k])
		start(k, to)
		if i == 0 {
			testutil.Eventually(t, 10*time.Second, "the first upgraded dispenser naming the old ones", func() bool {
				s := procs[0].stderr.String()
				return strings.Contains(s, "dispensers from before the deployment record") && strings.Contains(s, "disp-2,disp-3")
			})
		}
		served(fmt.Sprintf("step %d", i+1))
	}
	l := stop()
	t.Logf("%d calls, %d segment and %d snowflake IDs during the roll (%v; whole test %v)",
		l.calls, len(l.seen["segment"]), len(l.seen["snowflake"]), time.Since(rolled).Round(time.Millisecond), time.Since(began).Round(time.Millisecond))
	if l.dups > 0 {
		t.Errorf("%d IDs handed out twice, the first %s", l.dups, l.dup)
	}
	if l.failed > 0 {
		t.Errorf("%d of %d calls failed, the first: %v", l.failed, l.calls, l.firstErr)
	}
}
