package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/leafbus/leafbus/internal/testutil"
	"github.com/leafbus/leafbus/testenv"
)

// The runbook is README's "Runbook: a secured cluster by hand": TestProductionRunbook
// runs its shell lines as they stand, only moved onto this test's private servers,
// ports and directories.
const (
	readmePath     = "../../docs/operations.md"
	runbookHeading = "### Runbook: a secured cluster by hand"
	repoRoot       = "../.."
)

// runbookLine is one command of the runbook: a shell line (with its continuation lines
// and here-document, if any), whether it runs in the background (ends in &), and the
// exit code its comment promises ("# exits N"; 0 when it says none).
type runbookLine struct {
	text       string
	background bool
	wantExit   int
}

var (
	exitsComment = regexp.MustCompile(`#\s*exits (\d+)`)
	hereDoc      = regexp.MustCompile(`<<-?\s*['"]?([A-Za-z_]+)['"]?`)
	loopbackPort = regexp.MustCompile(`127\.0\.0\.1:(\d+)`)
	assignment   = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*=`)
	httpFlag     = regexp.MustCompile(`--http (\S+)`)
	// A row of the status page's cluster table: node ID, version, worker ID ("—" when
	// the dispenser did not say).
	clusterRow = regexp.MustCompile(`<td>([^<\s]+)(?: <span class="muted">\(this node\)</span>)?</td><td>[^<]*</td>\s*<td class="num">(\d+|—)</td>`)
	benchCheck = regexp.MustCompile(`check: ([0-9,]+) IDs, 0 duplicates`)
)

// readRunbook returns the runbook section's shell lines, in order.
func readRunbook(t *testing.T) []runbookLine {
	t.Helper()
	doc := readFile(t, readmePath)
	start := strings.Index(doc, "\n"+runbookHeading+"\n")
	if start < 0 {
		t.Fatalf("%s has no section %q", readmePath, runbookHeading)
	}
	section := doc[start+len(runbookHeading)+2:]
	if end := strings.Index(section, "\n### "); end >= 0 {
		section = section[:end]
	}
	var lines []runbookLine
	blocks := regexp.MustCompile("(?s)```sh\n(.*?)```").FindAllStringSubmatch(section, -1)
	for _, b := range blocks {
		raw := strings.Split(b[1], "\n")
		for i := 0; i < len(raw); i++ {
			text := raw[i]
			if strings.TrimSpace(text) == "" || strings.HasPrefix(strings.TrimSpace(text), "#") {
				continue
			}
			for strings.HasSuffix(text, "\\") && i+1 < len(raw) {
				i++
				text += "\n" + raw[i]
			}
			if m := hereDoc.FindStringSubmatch(text); m != nil {
				for i+1 < len(raw) {
					i++
					text += "\n" + raw[i]
					if strings.TrimSpace(raw[i]) == m[1] {
						break
					}
				}
			}
			l := runbookLine{text: text}
			if m := exitsComment.FindStringSubmatch(text); m != nil {
				l.wantExit, _ = strconv.Atoi(m[1])
			}
			code, _, _ := strings.Cut(text, " #")
			if trimmed := strings.TrimSpace(code); strings.HasSuffix(trimmed, "&") {
				l.background, l.text = true, strings.TrimSuffix(trimmed, "&")
			}
			lines = append(lines, l)
		}
	}
	if len(lines) < 10 {
		t.Fatalf("%s: the runbook has %d shell lines; has its layout changed?", readmePath, len(lines))
	}
	return lines
}

// runbookHost is where the runbook runs: its environment (as the operator's shell
// holds it line after line), the directories and ports it was moved to, and the
// processes it started.
type runbookHost struct {
	t      *testing.T
	dir    string // stands for /etc/leafbus, /var/lib/leafbus and /usr/local/bin
	env    map[string]string
	rename *strings.Replacer // README's addresses and paths -> this test's
	ports  map[string]string // README's 127.0.0.1:port -> this test's
	procs  []*runbookProc
	spawn  chan func()
}

// runbookProc is a process the runbook started in the background.
type runbookProc struct {
	line   string
	cmd    *exec.Cmd
	out    *testutil.SyncBuffer // stdout and stderr
	stdout *testutil.SyncBuffer // stdout alone (a dispenser's banner)
	done   chan struct{}
}

// newRunbookHost moves the runbook onto this test: README's MySQL and ZooKeeper
// addresses to the private servers', every other loopback port to a free one, the
// directories under one temporary directory; PATH starts with the binaries' directory.
func newRunbookHost(t *testing.T, lines []runbookLine, mysqlAddr, zkAddr string) *runbookHost {
	t.Helper()
	dir, err := os.MkdirTemp("", "runbook") // short: MariaDB's and NATS' paths stay far from limits
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	h := &runbookHost{t: t, dir: dir, env: map[string]string{}, ports: map[string]string{}}
	for _, kv := range os.Environ() {
		k, v, _ := strings.Cut(kv, "=")
		if !strings.HasPrefix(k, "LEAFBUS_") && !strings.HasPrefix(k, "NATS_") && !strings.HasPrefix(k, "MYSQL_") {
			h.env[k] = v
		}
	}
	goBin, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the runbook builds with go: %v", err)
	}
	h.env["PATH"] = filepath.Join(dir, "bin") + string(os.PathListSeparator) + filepath.Dir(goBin) + string(os.PathListSeparator) + h.env["PATH"]
	_, mysqlPort, _ := net.SplitHostPort(mysqlAddr)
	h.ports["127.0.0.1:3306"], h.ports["127.0.0.1:2181"] = mysqlAddr, zkAddr
	for _, l := range lines {
		for _, m := range loopbackPort.FindAllString(l.text, -1) {
			if _, ok := h.ports[m]; !ok {
				h.ports[m] = fmt.Sprintf("127.0.0.1:%d", freePort(t))
			}
		}
	}
	pairs := []string{
		"/usr/local/bin/", filepath.Join(dir, "bin") + "/",
		"/etc/leafbus", filepath.Join(dir, "etc"),
		"/var/lib/leafbus", filepath.Join(dir, "var"),
		"-P 3306", "-P " + mysqlPort,
	}
	for from, to := range h.ports {
		pairs = append(pairs, from, to)
	}
	h.rename = strings.NewReplacer(pairs...)
	h.startSpawner()
	return h
}

// startSpawner starts the processes of the runbook from one goroutine locked to its OS
// thread, which ends at cleanup: their Pdeathsig fires when that thread does, so a test
// binary that dies takes them along (testenv's spawner does the same).
func (h *runbookHost) startSpawner() {
	h.spawn = make(chan func())
	go func() {
		runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
		for f := range h.spawn {
			f()
		}
	}()
	h.t.Cleanup(func() {
		h.stopAll()
		close(h.spawn)
	})
}

// environ is the environment as exec takes it.
func (h *runbookHost) environ() []string {
	var out []string
	for _, k := range slices.Sorted(maps.Keys(h.env)) {
		out = append(out, k+"="+h.env[k])
	}
	return out
}

// command is bash running text in the repository's root with the runbook's
// environment.
func (h *runbookHost) command(ctx context.Context, text string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, "bash", "-c", text)
	cmd.Dir = repoRoot
	cmd.Env = h.environ()
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	return cmd
}

// run runs one foreground line as the operator's shell would and keeps what it
// exported (export, set -a; . file). It returns the exit code and the output.
func (h *runbookHost) run(l runbookLine) (code int, stdout, stderr string) {
	h.t.Helper()
	envFile := filepath.Join(h.dir, "env.after")
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := h.command(ctx, h.rename.Replace(l.text)+"\n__rc=$?\nenv -0 > "+envFile+"\nexit $__rc")
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var exit *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &exit) && ctx.Err() == nil:
		code = exit.ExitCode()
	default:
		h.t.Fatalf("runbook line %q: %v\nstdout: %s\nstderr: %s", l.text, err, out.String(), errOut.String())
	}
	data, err := os.ReadFile(envFile)
	if err != nil {
		h.t.Fatal(err)
	}
	h.env = map[string]string{}
	for kv := range strings.SplitSeq(string(data), "\x00") {
		if k, v, ok := strings.Cut(kv, "="); ok && k != "_" && k != "SHLVL" && k != "OLDPWD" && k != "PWD" {
			h.env[k] = v
		}
	}
	return code, out.String(), errOut.String()
}

// start starts a background line and returns its process, stopped at cleanup.
func (h *runbookHost) start(l runbookLine) *runbookProc {
	h.t.Helper()
	p := &runbookProc{line: l.text, out: &testutil.SyncBuffer{}, stdout: &testutil.SyncBuffer{}, done: make(chan struct{})}
	p.cmd = h.command(context.Background(), h.rename.Replace(l.text))
	p.cmd.Stdout, p.cmd.Stderr = io.MultiWriter(p.out, p.stdout), p.out
	errc := make(chan error, 1)
	h.spawn <- func() { errc <- p.cmd.Start() }
	if err := <-errc; err != nil {
		h.t.Fatalf("runbook line %q: %v", l.text, err)
	}
	go func() {
		_ = p.cmd.Wait()
		close(p.done)
	}()
	h.procs = append(h.procs, p)
	return p
}

// stopAll stops the background processes, the last started first (the dispensers
// before the NATS nodes, as the runbook says): SIGTERM to each process group, SIGKILL
// after 20 s.
func (h *runbookHost) stopAll() {
	for _, p := range slices.Backward(h.procs) {
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGTERM)
		select {
		case <-p.done:
		case <-time.After(20 * time.Second):
			_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
			<-p.done
		}
		if h.t.Failed() {
			h.t.Logf("%s\n---\n%s", p.line, p.out.String())
		}
	}
	h.procs = nil
}

// program is what a runbook line runs: its first word after the variable assignments.
func program(text string) string {
	for _, w := range strings.Fields(text) {
		if !assignment.MatchString(w) {
			return filepath.Base(w)
		}
	}
	return ""
}

// TestProductionRunbook follows README's runbook with real processes: nats-server 2.15.2
// built from the module go.mod requires, three nodes of deploy/nats.conf with the roles
// and the secrets of deploy/secrets.sh, a private MariaDB and ZooKeeper, three
// dispensers, then the operator's and an application's commands with their passwords
// in the environment. It checks what the runbook promises: no warning or error at a
// healthy start, no permission refused by the servers, every status page listing all
// three dispensers with their worker IDs, banners that show how to connect and hold no
// secret, a clear answer to `tag add` under Leaf's grants, and decode, tag list and bench
// working as the operator and as client-a.
func TestProductionRunbook(t *testing.T) {
	if testing.Short() {
		t.Skip("builds three binaries and starts a cluster")
	}
	t.Parallel() // its own servers and ports: it waits beside the others (make test's longest package)
	lines := readRunbook(t)
	maria := testenv.StartMariaDB(t)
	zk := testenv.StartZooKeeper(t)
	h := newRunbookHost(t, lines, maria.Addr(), zk.Addr())

	var dispensers, natsNodes []*runbookProc
	checked := false
	for _, l := range lines {
		prog := program(l.text)
		if l.background {
			p := h.start(l)
			switch prog {
			case "dispenser":
				dispensers = append(dispensers, p)
			case "nats-server":
				natsNodes = append(natsNodes, p)
			default:
				t.Fatalf("runbook line %q: a background %s, want nats-server or dispenser", l.text, prog)
			}
			continue
		}
		if !checked && len(dispensers) == 3 && prog != "curl" {
			// Started and ready (the runbook waited for /readyz): the promises of a
			// healthy start, before anyone uses the deployment.
			checkHealthyStart(t, h, dispensers, natsNodes)
			checked = true
		}
		start := time.Now()
		code, stdout, stderr := h.run(l)
		t.Logf("$ %s\n(exit %d in %v)\n%s%s", l.text, code, time.Since(start).Round(time.Millisecond), stdout, stderr)
		if code != l.wantExit {
			t.Fatalf("runbook line %q: exit %d, want %d\nstdout: %s\nstderr: %s", l.text, code, l.wantExit, stdout, stderr)
		}
		checkLine(t, h, l, prog, stdout, stderr)
	}
	if len(natsNodes) != 3 || len(dispensers) != 3 || !checked {
		t.Fatalf("the runbook started %d NATS nodes and %d dispensers, want 3 of each", len(natsNodes), len(dispensers))
	}
	for _, p := range natsNodes {
		if strings.Contains(p.out.String(), "Violation") {
			t.Errorf("a NATS node refused a permission while the runbook ran:\n%s", p.out.Line("Violation"))
		}
	}
}

// checkHealthyStart checks the three dispensers once ready: no WARN or ERROR logged, no
// permission refused by a NATS node, banners that tell how to connect under the roles
// and print no secret, and each status page listing all three with distinct worker IDs
// and their clocks.
func checkHealthyStart(t *testing.T, h *runbookHost, dispensers, natsNodes []*runbookProc) {
	t.Helper()
	secrets := map[string]string{}
	for k, v := range h.env {
		if strings.HasSuffix(k, "_PASSWORD") {
			secrets[k] = v
		}
	}
	if len(secrets) < 9 {
		t.Fatalf("the runbook's environment holds %d passwords, want deploy/secrets.sh's 9", len(secrets))
	}
	var statusPages []string
	for _, d := range dispensers {
		m := httpFlag.FindStringSubmatch(h.rename.Replace(d.line))
		if m == nil {
			t.Fatalf("dispenser line %q has no --http", d.line)
		}
		statusPages = append(statusPages, "http://"+m[1]+"/")
	}

	var want map[string]int64
	for _, page := range statusPages {
		testutil.Eventually(t, 20*time.Second, page+" listing the three dispensers with worker IDs and clocks", func() bool {
			got, ok := clusterView(t, page)
			if !ok || len(got) != 3 {
				return false
			}
			if want == nil {
				want = got
			}
			return maps.Equal(got, want)
		})
	}
	ids := slices.Collect(maps.Values(want))
	slices.Sort(ids)
	if len(slices.Compact(ids)) != 3 || ids[0] < 0 {
		t.Errorf("worker IDs %v, want three distinct ones", want)
	}

	for i, d := range dispensers {
		logs := d.out.String()
		for _, level := range []string{"level=WARN", "level=ERROR"} {
			if strings.Contains(logs, level) {
				t.Errorf("dispenser %d logged %s at a healthy start:\n%s", i+1, level, d.out.Line(level))
			}
		}
		banner := d.stdout.String()
		if i == 0 {
			t.Logf("dispenser 1 says:\n%s", banner)
		}
		for _, want := range []string{"--user client-a --inbox-prefix _INBOX_client-a req leaf.segment.", "dispenser tag list --nats", "--user operator", "its password in"} {
			if !strings.Contains(banner, want) {
				t.Errorf("dispenser %d's banner does not say %q:\n%s", i+1, want, banner)
			}
		}
		for k, v := range secrets {
			if strings.Contains(logs, v) {
				t.Errorf("dispenser %d printed %s", i+1, k)
			}
		}
	}
	for _, p := range natsNodes {
		if strings.Contains(p.out.String(), "Violation") {
			t.Errorf("a NATS node refused a permission at start:\n%s", p.out.Line("Violation"))
		}
	}
}

// clusterView reads a status page's cluster table: every dispenser listed with its
// worker ID. ok is false when any is shown without a worker ID or clock, or discovery
// failed.
func clusterView(t *testing.T, page string) (workers map[string]int64, ok bool) {
	t.Helper()
	resp, err := http.Get(page)
	if err != nil {
		return nil, false
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		return nil, false
	}
	_, section, found := strings.Cut(string(body), `<section id="cluster">`)
	if !found {
		t.Fatalf("%s has no cluster section", page)
	}
	section, _, _ = strings.Cut(section, "</section>")
	if strings.Contains(section, "no answer") || strings.Contains(section, `class="bad"`) {
		return nil, false
	}
	workers = map[string]int64{}
	for _, m := range clusterRow.FindAllStringSubmatch(section, -1) {
		w, err := strconv.ParseInt(m[2], 10, 64)
		if err != nil {
			return nil, false
		}
		workers[m[1]] = w
	}
	return workers, true
}

// checkLine checks what a foreground line of the runbook says beyond its exit code.
func checkLine(t *testing.T, h *runbookHost, l runbookLine, prog, stdout, stderr string) {
	t.Helper()
	words := strings.Fields(l.text)
	has := func(w string) bool { return slices.Contains(words, w) }
	for k, v := range h.env {
		if strings.HasSuffix(k, "_PASSWORD") && slices.Contains(words, v) {
			t.Errorf("runbook line %q puts %s on the command line", l.text, k)
		}
	}
	switch {
	case prog == "dispenser" && has("add") && l.wantExit != 0:
		// Leaf's grants: a clear answer that names the missing grant, not a 500.
		for _, want := range []string{"503", "lacks the INSERT privilege on leaf_alloc", "GRANT INSERT ON `leaf`.`leaf_alloc`"} {
			if !strings.Contains(stderr, want) {
				t.Errorf("tag add under Leaf's grants: stderr %q does not say %q", stderr, want)
			}
		}
	case prog == "dispenser" && has("add"):
		if !strings.Contains(stdout, `"tag": "orders"`) {
			t.Errorf("tag add: stdout %q, want the tag orders", stdout)
		}
	case prog == "dispenser" && has("list"):
		if !strings.Contains(stdout, "TAG") {
			t.Errorf("tag list: stdout %q, want the table", stdout)
		}
	case prog == "dispenser" && has("decode"):
		if !strings.Contains(stdout, `"worker_id"`) {
			t.Errorf("decode: stdout %q, want the decoded ID", stdout)
		}
	case prog == "bench":
		// --check: every ID kept, none twice (bench's exit code says so too).
		m := benchCheck.FindStringSubmatch(stdout)
		if m == nil || m[1] == "0" {
			t.Errorf("bench: stdout %q, want IDs checked and 0 duplicates", stdout)
		}
	}
}
