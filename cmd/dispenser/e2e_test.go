package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/leafbus/leafbus/client"
	"github.com/leafbus/leafbus/dispenser"
	"github.com/leafbus/leafbus/internal/testutil"
	"github.com/leafbus/leafbus/testenv"
	"github.com/leafbus/leafbus/wire"
)

// TestConcurrentClientsNoDuplicate: 8 clients, each with its own connection, take 50k
// IDs each (singles and batches of up to 100, segment and snowflake, text and binary);
// every ID of a kind goes into one set.
func TestConcurrentClientsNoDuplicate(t *testing.T) {
	d := startDispenser(t, func(c *testConfig) {
		c.Pools = nil
	})
	const clients, perClient = 8, 50_000
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	type result struct {
		kind wire.Kind
		ids  []int64
		err  error
	}
	results := make(chan result, clients)
	for c := 0; c < clients; c++ {
		kind := wire.Kind(c % 2)
		enc := wire.Encoding((c / 2) % 2)
		client := d.client(t, client.WithEncoding(enc))
		rng := rand.New(rand.NewPCG(uint64(c), 7))
		go func() {
			ids := make([]int64, 0, perClient)
			for len(ids) < perClient {
				n := 1
				if rng.IntN(4) == 0 { // a quarter of the requests are batches
					n = min(1+rng.IntN(100), perClient-len(ids))
				} else if len(ids) > 5000 {
					n = min(50, perClient-len(ids)) // keep the test short under -race
				}
				tag := dispenser.SampleTagName
				if kind == wire.Snowflake {
					tag = fmt.Sprintf("client%d", c)
				}
				batch := make([]int64, n)
				if err := client.Fill(ctx, kind, tag, batch); err != nil {
					results <- result{kind, nil, err}
					return
				}
				ids = append(ids, batch...)
			}
			results <- result{kind, ids, nil}
		}()
	}
	seen := map[wire.Kind]map[int64]bool{wire.Segment: {}, wire.Snowflake: {}}
	for c := 0; c < clients; c++ {
		r := <-results
		if r.err != nil {
			t.Fatalf("client: %v", r.err)
		}
		for _, id := range r.ids {
			if seen[r.kind][id] {
				t.Fatalf("%v ID %d handed out twice", r.kind, id)
			}
			seen[r.kind][id] = true
		}
	}
	if n := len(seen[wire.Segment]) + len(seen[wire.Snowflake]); n != clients*perClient {
		t.Fatalf("%d distinct IDs, want %d", n, clients*perClient)
	}
}

// buildDispenser compiles the real binary once per test binary run.
var buildDispenser = sync.OnceValues(func() (string, error) {
	dir, err := os.MkdirTemp("", "leafbus-bin")
	if err != nil {
		return "", err
	}
	bin := filepath.Join(dir, "dispenser")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	if err != nil {
		return "", fmt.Errorf("go build: %v\n%s", err, out)
	}
	return bin, nil
})

// freePort is testenv.FreePort for a test: a port the dispenser binds later.
func freePort(t testing.TB) int {
	t.Helper()
	p, err := testenv.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// process is the dispenser running as its own process.
type process struct {
	cmd    *exec.Cmd
	url    string
	stderr *testutil.SyncBuffer
	done   chan error
}

// connect connects to the process's NATS server with opts and returns the connection,
// closed at the end of the test, and a leafbus client on it that does not hedge.
func (p *process) connect(t testing.TB, opts ...nats.Option) (*nats.Conn, *client.Client) {
	t.Helper()
	nc, err := nats.Connect(p.url, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	// No hedging, as testDispenser.client: the callers check exact IDs, and a hedged
	// copy on a loaded machine takes IDs of its own (TestJavaLeafClient once read 3006
	// for 3004).
	c, err := client.NewClient(nc, client.WithHedge(0))
	if err != nil {
		t.Fatal(err)
	}
	return nc, c
}

// startBinary runs the compiled dispenser with args (plus --data-dir, and --listen
// unless args join NATS servers with --nats) and waits for its ready line.
func startBinary(t testing.TB, dataDir string, args ...string) *process {
	t.Helper()
	return startBinaryLimited(t, dataDir, 0, args...)
}

// startBinaryLimited is startBinary with the process's open file limit, soft and hard,
// set to nofile (0: inherited), as `ulimit -n` in a shell sets it.
func startBinaryLimited(t testing.TB, dataDir string, nofile int, args ...string) *process {
	t.Helper()
	bin, err := buildDispenser()
	if err != nil {
		t.Fatal(err)
	}
	return startBinaryOf(t, bin, dataDir, nofile, args...)
}

// startBinaryOf is startBinaryLimited with the binary bin (one built from another
// commit: upgrade_test.go).
func startBinaryOf(t testing.TB, bin, dataDir string, nofile int, args ...string) *process {
	t.Helper()
	url := ""
	for i, a := range args {
		if a == "--nats" && i+1 < len(args) {
			url = args[i+1]
		}
	}
	first := []string{"--data-dir", dataDir, "--node-id", "bin-test"}
	if url == "" {
		port := freePort(t)
		url = fmt.Sprintf("nats://127.0.0.1:%d", port)
		first = append(first, "--listen", fmt.Sprintf("127.0.0.1:%d", port))
	}
	args = append(first, args...)
	cmd := exec.Command(bin, args...)
	if nofile > 0 {
		// exec keeps the process (and its pid) and the limit.
		cmd = exec.Command("/bin/sh", append([]string{"-c", fmt.Sprintf(`ulimit -n %d && exec "$0" "$@"`, nofile), bin}, args...)...)
	}
	cmd.Env = append(os.Environ(), "LEAFBUS_LOG_LEVEL=debug")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	b := &process{cmd: cmd, url: url, stderr: &testutil.SyncBuffer{}, done: make(chan error, 1)}
	cmd.Stderr = b.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	ready := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		var lines []string
		for sc.Scan() {
			lines = append(lines, sc.Text())
			if strings.Contains(sc.Text(), "req leaf.segment.") {
				ready <- strings.Join(lines, "\n")
			}
		}
	}()
	go func() { b.done <- cmd.Wait() }()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-b.done
	})
	select {
	case out := <-ready:
		t.Logf("dispenser says:\n%s", out)
	case err := <-b.done:
		b.done <- err
		t.Fatalf("dispenser exited before it was ready: %v\nstderr:\n%s", err, b.stderr.String())
	case <-time.After(60 * time.Second):
		t.Fatalf("dispenser not ready within 60s\nstderr:\n%s", b.stderr.String())
	}
	return b
}

// TestBinarySignalDrain runs the real binary, keeps requests flowing, sends SIGTERM:
// every request delivered before the stop is answered (none times out), and the exit
// code is 0.
func TestBinarySignalDrain(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	b := startBinary(t, t.TempDir())
	nc, err := nats.Connect(b.url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if _, err := nc.Request("leaf.segment."+dispenser.SampleTagName, nil, 5*time.Second); err != nil {
		t.Fatalf("first request to the binary: %v", err)
	}

	var answered, noResponders, other sync.Map
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := 0; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				_, err := nc.Request("leaf.segment."+dispenser.SampleTagName, []byte("10"), 5*time.Second)
				switch {
				case err == nil:
					answered.Store(fmt.Sprint(w, i), true)
				case errors.Is(err, nats.ErrNoResponders):
					noResponders.Store(fmt.Sprint(w, i), true)
					return
				default:
					other.Store(fmt.Sprint(w, i), err)
					return
				}
			}
		}()
	}
	time.Sleep(300 * time.Millisecond)
	if err := b.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	var exitErr error
	select {
	case exitErr = <-b.done:
		b.done <- exitErr
	case <-time.After(30 * time.Second):
		t.Fatalf("dispenser did not exit within 30s of SIGTERM\nstderr:\n%s", b.stderr.String())
	}
	close(stop)
	wg.Wait()
	if exitErr != nil {
		t.Fatalf("exit after SIGTERM: %v, want code 0\nstderr:\n%s", exitErr, b.stderr.String())
	}
	n := 0
	answered.Range(func(_, _ any) bool { n++; return true })
	if n == 0 {
		t.Fatal("no request was answered before the stop")
	}
	other.Range(func(k, v any) bool {
		t.Errorf("request %v failed with %v: want an answer or no-responders, never a lost request", k, v)
		return true
	})
	if !strings.Contains(b.stderr.String(), "stopped") {
		t.Errorf("no stop log line in:\n%s", b.stderr.String())
	}
}

// TestPoolsNoDuplicate runs the dispenser with --pool for both kinds: clients mix requests
// of the pools' size (answered from ready batches) with singles and other sizes (the
// normal path), in text and binary, then a bulk job takes batches from LEAF_POOL; every
// ID of a kind is unique, every batch strictly increasing, and the stats show that the
// pools did answer.
func TestPoolsNoDuplicate(t *testing.T) {
	const clients, perClient, size = 4, 20_000, 50
	d := startDispenser(t, func(c *testConfig) {
		for _, p := range []string{"segment:" + dispenser.SampleTagName + ":50:8", "snowflake:pooled:50:8"} {
			if err := c.Pools.Set(p); err != nil {
				t.Fatal(err)
			}
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var mu sync.Mutex
	seen := map[wire.Kind]map[int64]bool{wire.Segment: {}, wire.Snowflake: {}}
	var wg sync.WaitGroup
	errs := make(chan error, clients)
	for c := 0; c < clients; c++ {
		kind, tag := wire.Segment, dispenser.SampleTagName
		if c%2 == 1 {
			kind, tag = wire.Snowflake, "pooled"
		}
		client := d.client(t, client.WithEncoding(wire.Encoding((c/2)%2)))
		rng := rand.New(rand.NewPCG(uint64(c), 11))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for got := 0; got < perClient; {
				n := size
				switch rng.IntN(8) {
				case 0:
					n = 1
				case 1:
					n = 1 + rng.IntN(2*size)
				}
				batch := make([]int64, n)
				if err := client.Fill(ctx, kind, tag, batch); err != nil {
					errs <- err
					return
				}
				mu.Lock()
				for i, id := range batch {
					if i > 0 && id <= batch[i-1] {
						mu.Unlock()
						errs <- fmt.Errorf("%v reply not strictly increasing at %d: %v", kind, i, batch)
						return
					}
					if seen[kind][id] {
						mu.Unlock()
						errs <- fmt.Errorf("%v ID %d handed out twice", kind, id)
						return
					}
					seen[kind][id] = true
				}
				mu.Unlock()
				got += n
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	// The same pools feed LEAF_POOL for bulk jobs: batches fetched there are of the
	// pool's size and overlap nothing served over request/reply.
	nc := d.connect(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []struct {
		kind wire.Kind
		tag  string
	}{{wire.Segment, dispenser.SampleTagName}, {wire.Snowflake, "pooled"}} {
		c, err := client.NewConsumer(ctx, js, "leaf", p.kind, p.tag)
		if err != nil {
			t.Fatalf("consumer of the %v pool: %v", p.kind, err)
		}
		for range 3 {
			batch, err := c.Next(ctx)
			if err != nil {
				t.Fatalf("%v batch from LEAF_POOL: %v", p.kind, err)
			}
			if len(batch) != size {
				t.Fatalf("%v batch from LEAF_POOL has %d IDs, want %d", p.kind, len(batch), size)
			}
			for i, id := range batch {
				if (i > 0 && id <= batch[i-1]) || seen[p.kind][id] {
					t.Fatalf("%v batch from LEAF_POOL repeats or is out of order at %d: %v", p.kind, i, batch)
				}
				seen[p.kind][id] = true
			}
		}
	}
	msg, err := nc.Request("$SRV.STATS.leaf", nil, 5*time.Second)
	if err != nil {
		t.Fatalf("$SRV.STATS.leaf: %v", err)
	}
	var stats struct {
		Endpoints []struct {
			Name string `json:"name"`
			Data struct {
				Source struct {
					Pools []struct {
						Tag   string `json:"tag"`
						Taken uint64 `json:"taken"`
					} `json:"pools"`
				} `json:"source"`
			} `json:"data"`
		} `json:"endpoints"`
	}
	if err := json.Unmarshal(msg.Data, &stats); err != nil {
		t.Fatalf("stats %s: %v", msg.Data, err)
	}
	taken := map[string]uint64{}
	for _, e := range stats.Endpoints {
		for _, p := range e.Data.Source.Pools {
			taken[e.Name+":"+p.Tag] += p.Taken
		}
	}
	for _, want := range []string{"segment:" + dispenser.SampleTagName, "snowflake:pooled"} {
		if taken[want] == 0 {
			t.Errorf("pool %s answered no request; stats: %s", want, msg.Data)
		}
	}
	t.Logf("batches taken from pools: %v", taken)
}
