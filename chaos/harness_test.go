package chaos

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/leafbus/leafbus/testenv"
)

// leaseTTL is the dispensers' lease time (KV and ZooKeeper recycle): the shortest the
// dispenser accepts (4 heartbeats), so that a pause past it stays short.
const leaseTTL = 12 * time.Second

// world is one chaos run's servers and dispensers.
type world struct {
	t     *testing.T
	dir   string
	bin   string
	nats  *testenv.Cluster
	maria *testenv.MariaDBServer
	zk    *testenv.ZooKeeperServer
	dsn   string
	nc    *nats.Conn // the harness's own: probes and checks
	mono  *monoLoad  // the clients of the monotonic tag

	mu    sync.Mutex
	procs map[string]*proc
	order []string
	exits []string // dispensers that exited without the harness asking
	notes []string // what the fault under way found out (which node it hit)
	wg    sync.WaitGroup
}

// node is how one dispenser is started.
type node struct {
	name     string
	registry string // kv | zk | zk-recycle | mysql
	port     int    // its --advertise port
}

// newWorld starts the servers and builds the dispenser.
func newWorld(t *testing.T) *world {
	t.Helper()
	w := &world{t: t, dir: t.TempDir(), procs: map[string]*proc{}}
	began := time.Now()
	var buildErr error
	built := make(chan struct{})
	go func() { // compile while the servers start
		defer close(built)
		w.bin, buildErr = buildDispenser(w.dir)
	}()
	w.nats = testenv.StartNATSCluster(t, 3)
	w.maria = testenv.StartMariaDB(t)
	w.zk = testenv.StartZooKeeper(t)
	w.dsn = w.maria.NewDatabase(t)
	w.nc = w.nats.Connect(t)
	<-built
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	t.Cleanup(w.stopAll)
	t.Logf("chaos: servers up and dispenser built in %s", time.Since(began).Round(time.Millisecond))
	return w
}

// buildDispenser compiles cmd/dispenser into dir.
func buildDispenser(dir string) (string, error) {
	bin := filepath.Join(dir, "dispenser")
	cmd := exec.Command("go", "build", "-o", bin, "../cmd/dispenser")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go build ../cmd/dispenser: %v\n%s", err, out)
	}
	return bin, nil
}

// addTags creates the segment tags in leaf_alloc, with steps large enough that a tag's
// two segments outlast MariaDB being down for seconds under the run's load.
func (w *world) addTags(tags ...string) {
	w.t.Helper()
	db := testenv.OpenDB(w.t, w.dsn)
	if _, err := db.Exec("CREATE TABLE IF NOT EXISTS leaf_alloc (biz_tag varchar(128) NOT NULL DEFAULT '', max_id bigint NOT NULL DEFAULT 1, step int NOT NULL, description varchar(256) DEFAULT NULL, update_time timestamp NOT NULL DEFAULT CURRENT_TIMESTAMP ON UPDATE CURRENT_TIMESTAMP, PRIMARY KEY (biz_tag)) ENGINE=InnoDB"); err != nil {
		w.t.Fatalf("create leaf_alloc: %v", err)
	}
	for _, tag := range tags {
		if _, err := db.Exec("INSERT INTO leaf_alloc (biz_tag, max_id, step, description) VALUES (?, 1, 200000, 'chaos')", tag); err != nil {
			w.t.Fatalf("add tag %s: %v", tag, err)
		}
	}
}

// args are the flags of n.
func (w *world) args(n node) []string {
	a := []string{
		"--nats", w.nats.URLs(), "--node-id", n.name, "--data-dir", filepath.Join(w.dir, n.name),
		"--kv-replicas", "3", "--segment-store", "mysql", "--mysql-dsn", w.dsn, "--mysql-create-table",
		"--http", "", "--start-timeout", "60s", "--log-level", "info",
		"--monotonic-lease-ttl", monoLeaseTTL.String(),
	}
	if n.registry == "kv" || n.registry == "zk-recycle" {
		a = append(a, "--lease-ttl", leaseTTL.String())
	}
	if n.registry != "kv" {
		a = append(a, "--advertise", fmt.Sprintf("127.0.0.1:%d", n.port))
	}
	lo, hi := rangeOf(n.registry)
	a = append(a, "--worker-id-min", fmt.Sprint(lo), "--worker-id-max", fmt.Sprint(hi))
	switch n.registry {
	case "zk", "zk-recycle":
		a = append(a, "--worker-registry", "zk", "--zk", w.zk.Addr(), "--zk-name", "chaos")
		if n.registry == "zk-recycle" {
			a = append(a, "--zk-recycle")
		}
	default:
		a = append(a, "--worker-registry", n.registry)
	}
	return a
}

// waitServing waits until name serves, failing the test when it does not within 60 s
// or exits first.
func (w *world) waitServing(name string) {
	w.t.Helper()
	p := w.proc(name)
	deadline := time.Now().Add(60 * time.Second)
	for {
		_, ok, why := w.waitFullService([]string{name}, 500*time.Millisecond)
		if ok {
			return
		}
		select {
		case <-p.done:
			w.t.Fatalf("%s exited while starting:\n%s", name, tail(p.logPath, 20))
		default:
		}
		if time.Now().After(deadline) {
			w.t.Fatalf("%s not serving within 60s: %s\n%s", name, why, tail(p.logPath, 20))
		}
	}
}

// proc is one dispenser process (its latest run).
type proc struct {
	node    node
	cmd     *exec.Cmd
	log     *os.File
	logPath string
	logFrom int64 // where this run's lines begin in logPath (the file is appended to)
	started time.Time
	done    chan struct{}
	expect  bool // the harness stops or kills it: an exit is no news
}

// start starts n (again) as a process of its own group, killed with the test binary.
func (w *world) start(n node) {
	w.t.Helper()
	logPath := filepath.Join(w.dir, n.name+".log")
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		w.t.Fatal(err)
	}
	var logFrom int64
	if fi, err := f.Stat(); err == nil {
		logFrom = fi.Size()
	}
	cmd := exec.Command(w.bin, w.args(n)...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		f.Close()
		w.t.Fatalf("start %s: %v", n.name, err)
	}
	p := &proc{node: n, cmd: cmd, log: f, logPath: logPath, logFrom: logFrom, started: time.Now(), done: make(chan struct{})}
	w.mu.Lock()
	if _, ok := w.procs[n.name]; !ok {
		w.order = append(w.order, n.name)
	}
	w.procs[n.name] = p
	w.mu.Unlock()
	w.wg.Add(1)
	go w.reap(p)
}

// reap waits for p to exit and notes an exit the harness did not ask for.
func (w *world) reap(p *proc) {
	defer w.wg.Done()
	err := p.cmd.Wait()
	p.log.Close()
	w.mu.Lock()
	if !p.expect {
		w.exits = append(w.exits, fmt.Sprintf("%s exited by itself (%v): %s", p.node.name, err, tail(p.logPath, 6)))
	}
	w.mu.Unlock()
	close(p.done)
}

func (w *world) proc(name string) *proc {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.procs[name]
}

// signal sends sig to name's process; expectExit marks an exit it causes as asked for.
func (w *world) signal(name string, sig syscall.Signal, expectExit bool) *proc {
	w.t.Helper()
	p := w.proc(name)
	w.mu.Lock()
	p.expect = p.expect || expectExit
	w.mu.Unlock()
	if err := p.cmd.Process.Signal(sig); err != nil {
		w.t.Fatalf("signal %v to %s: %v", sig, name, err)
	}
	return p
}

// stop ends name with sig and waits for it to exit (at most 20 s).
func (w *world) stop(name string, sig syscall.Signal) {
	w.t.Helper()
	p := w.signal(name, sig, true)
	select {
	case <-p.done:
	case <-time.After(20 * time.Second):
		w.t.Fatalf("%s did not exit within 20s of %v", name, sig)
	}
}

// stopAll stops every dispenser that runs, continuing a stopped one first.
func (w *world) stopAll() {
	w.mu.Lock()
	var ps []*proc
	for _, name := range w.order {
		ps = append(ps, w.procs[name])
	}
	w.mu.Unlock()
	for _, p := range ps {
		w.mu.Lock()
		p.expect = true
		w.mu.Unlock()
		_ = p.cmd.Process.Signal(syscall.SIGCONT)
		_ = p.cmd.Process.Signal(syscall.SIGTERM)
	}
	for _, p := range ps {
		select {
		case <-p.done:
		case <-time.After(15 * time.Second):
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	}
	w.wg.Wait()
}

// running lists every dispenser the run started (some may be down for a fault).
func (w *world) running() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.order)
}

// note keeps what the fault under way found out, for its name in the report.
func (w *world) note(s string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.notes = append(w.notes, s)
}

// takeNotes returns the notes and forgets them.
func (w *world) takeNotes() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	n := w.notes
	w.notes = nil
	return n
}

// unexpectedExits lists the dispensers that exited without the harness asking.
func (w *world) unexpectedExits() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append([]string(nil), w.exits...)
}

// tail is the last n lines of the file at path.
func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := bytes.Split(bytes.TrimRight(b, "\n"), []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return string(bytes.Join(lines, []byte("\n")))
}

// grepLogs counts the lines of every dispenser's log that contain s.
func (w *world) grepLogs(s string) map[string]int {
	out := map[string]int{}
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, name := range w.order {
		b, _ := os.ReadFile(w.procs[name].logPath)
		if c := strings.Count(string(b), s); c > 0 {
			out[name] = c
		}
	}
	return out
}

// floorPattern finds the floor in the clock guard's line "waiting ... for the clock to pass
// the last record's limit ... floor=<time>": a dispenser that takes a worker ID whose
// records allow timestamps ahead of its clock (its own run killed with -9 a moment ago)
// waits until its clock passes them before it serves, by design (docs/operations.md, "The
// snowflake ceiling and restarts").
var floorPattern = regexp.MustCompile(`for the clock to pass the last record.* floor=(\S+)`)

// floorSince is the latest floor that a run of name started at or after since waited
// for; zero when none did.
func (w *world) floorSince(name string, since time.Time) time.Time {
	w.mu.Lock()
	p := w.procs[name]
	w.mu.Unlock()
	if p == nil || p.started.Before(since) {
		return time.Time{}
	}
	b, err := os.ReadFile(p.logPath)
	if err != nil || int64(len(b)) < p.logFrom {
		return time.Time{}
	}
	var latest time.Time
	for _, m := range floorPattern.FindAllSubmatch(b[p.logFrom:], -1) {
		if at, err := time.Parse("2006-01-02T15:04:05.000Z07:00", string(m[1])); err == nil && at.After(latest) {
			latest = at
		}
	}
	return latest
}

// waitCtx is a context for one bounded wait of the harness.
func waitCtx(d time.Duration) (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), d)
}
