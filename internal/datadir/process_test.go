//go:build darwin || dragonfly || freebsd || linux || netbsd || openbsd

package datadir_test

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/leafbus/leafbus/internal/datadir"
)

// The cross-process tests run this test binary again as a helper process. The
// environment says what the helper does:
//
//	hold: Acquire, print "locked <pid of the idle child or 0>", hold until stdin closes,
//	      Release, exit 0. With envSpawn=1 it first starts an idle child that shares its
//	      stdin, to show the child does not inherit the lock.
//	try:  Acquire once, print a tryResult as JSON, Release if it succeeded, exit 0.
//	idle: wait until stdin closes (or 30 s), exit 0.
const (
	envMode  = "LEAFBUS_DATADIR_HELPER"
	envDir   = "LEAFBUS_DATADIR_DIR"
	envNode  = "LEAFBUS_DATADIR_NODE"
	envSpawn = "LEAFBUS_DATADIR_SPAWN"
)

// tryResult is what a "try" helper reports.
type tryResult struct {
	Err       string         `json:"err"`
	InUse     bool           `json:"in_use"`
	Holder    datadir.Holder `json:"holder"`
	Elapsed   time.Duration  `json:"elapsed"`
	Succeeded bool           `json:"succeeded"`
}

func TestMain(m *testing.M) {
	if mode := os.Getenv(envMode); mode != "" {
		os.Exit(helper(mode, os.Getenv(envDir), os.Getenv(envNode)))
	}
	os.Exit(m.Run())
}

func helper(mode, dir, node string) int {
	switch mode {
	case "hold":
		l, err := datadir.Acquire(dir, node)
		if err != nil {
			fmt.Printf("error %v\n", err)
			return 2
		}
		child := 0
		if os.Getenv(envSpawn) == "1" {
			cmd := exec.Command(os.Args[0])
			cmd.Env = append(os.Environ(), envMode+"=idle")
			cmd.Stdin = os.Stdin
			if err := cmd.Start(); err != nil {
				fmt.Printf("error %v\n", err)
				return 2
			}
			child = cmd.Process.Pid
		}
		fmt.Printf("locked %d\n", child)
		_, _ = io.Copy(io.Discard, os.Stdin)
		if err := l.Release(); err != nil {
			fmt.Printf("error %v\n", err)
			return 2
		}
		return 0
	case "try":
		start := time.Now()
		l, err := datadir.Acquire(dir, node)
		r := tryResult{Elapsed: time.Since(start), Succeeded: err == nil}
		var inUse *datadir.InUseError
		if errors.As(err, &inUse) {
			r.InUse, r.Holder = true, inUse.Holder
		}
		if err != nil {
			r.Err = err.Error()
		} else {
			_ = l.Release()
		}
		_ = json.NewEncoder(os.Stdout).Encode(r)
		return 0
	case "idle":
		done := make(chan struct{})
		go func() { _, _ = io.Copy(io.Discard, os.Stdin); close(done) }()
		select {
		case <-done:
		case <-time.After(30 * time.Second):
		}
		return 0
	}
	fmt.Printf("error unknown helper mode %q\n", mode)
	return 2
}

// helperProc is a running helper.
type helperProc struct {
	cmd   *exec.Cmd
	stdin io.WriteCloser
	lines chan string // stdout, line by line; closed at EOF
	done  chan error  // receives the result of Wait once
}

// startHelper starts this test binary as a helper in mode on dir. The helper is killed
// and waited for at cleanup if it still runs.
func startHelper(tb testing.TB, mode, dir, node string, env ...string) *helperProc {
	tb.Helper()
	exe, err := os.Executable()
	if err != nil {
		tb.Fatal(err)
	}
	return startHelperAs(tb, exec.Command(exe), mode, dir, node, env...)
}

func startHelperAs(tb testing.TB, cmd *exec.Cmd, mode, dir, node string, env ...string) *helperProc {
	tb.Helper()
	cmd.Env = append(os.Environ(), append(env, envMode+"="+mode, envDir+"="+dir, envNode+"="+node, raceNoExitSleep())...)
	cmd.Stderr = &tbWriter{tb}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		tb.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		tb.Fatalf("start helper %s: %v", mode, err)
	}
	h := &helperProc{cmd: cmd, stdin: stdin, lines: make(chan string, 16), done: make(chan error, 1)}
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			h.lines <- sc.Text()
		}
		close(h.lines)
		h.done <- cmd.Wait()
	}()
	tb.Cleanup(func() {
		_ = stdin.Close()
		select {
		case <-h.done:
			return
		case <-time.After(5 * time.Second):
		}
		_ = cmd.Process.Kill()
		select {
		case <-h.done:
		case <-time.After(5 * time.Second):
			tb.Errorf("helper %s (PID %d) did not exit after SIGKILL", mode, cmd.Process.Pid)
		}
	})
	return h
}

// line returns the next line the helper prints, failing after timeout.
func (h *helperProc) line(tb testing.TB, timeout time.Duration) string {
	tb.Helper()
	select {
	case l, ok := <-h.lines:
		if !ok {
			tb.Fatalf("helper PID %d exited without printing a line", h.cmd.Process.Pid)
		}
		return l
	case <-time.After(timeout):
		tb.Fatalf("helper PID %d printed nothing within %v", h.cmd.Process.Pid, timeout)
	}
	return ""
}

// locked waits for a hold helper to report it holds the lock and returns the PID of its
// idle child (0 without one).
func (h *helperProc) locked(tb testing.TB) int {
	tb.Helper()
	l := h.line(tb, 10*time.Second)
	pid, err := strconv.Atoi(strings.TrimPrefix(l, "locked "))
	if !strings.HasPrefix(l, "locked ") || err != nil {
		tb.Fatalf("hold helper said %q, want \"locked <pid>\"", l)
	}
	return pid
}

// wait waits for the helper to exit, failing after timeout.
func (h *helperProc) wait(tb testing.TB, timeout time.Duration) error {
	tb.Helper()
	for range h.lines { // drain, so the reader goroutine reaches Wait
	}
	select {
	case err := <-h.done:
		h.done <- err // for the cleanup
		return err
	case <-time.After(timeout):
		tb.Fatalf("helper PID %d still runs after %v", h.cmd.Process.Pid, timeout)
	}
	return nil
}

// kill sends SIGKILL to the helper and waits until it is gone.
func (h *helperProc) kill(tb testing.TB) {
	tb.Helper()
	if err := h.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		tb.Fatalf("SIGKILL helper: %v", err)
	}
	_ = h.wait(tb, 5*time.Second)
}

// try runs a try helper on dir to its end and returns what it reported.
func try(tb testing.TB, dir, node string) tryResult {
	tb.Helper()
	start := time.Now()
	h := startHelper(tb, "try", dir, node)
	return h.result(tb, start)
}

func (h *helperProc) result(tb testing.TB, start time.Time) tryResult {
	tb.Helper()
	l := h.line(tb, 10*time.Second)
	if err := h.wait(tb, 5*time.Second); err != nil {
		tb.Fatalf("try helper: %v", err)
	}
	var r tryResult
	if err := json.Unmarshal([]byte(l), &r); err != nil {
		tb.Fatalf("try helper said %q: %v", l, err)
	}
	tb.Logf("try helper: Acquire took %v; the process ran %v from exec to exit", r.Elapsed, time.Since(start))
	return r
}

// TestSecondProcessRefused is issue 16's case: a dispenser holds the dir and a second
// process on the same dir is refused at once, told the holder's PID and node ID.
func TestSecondProcessRefused(t *testing.T) {
	dir := t.TempDir()
	mustAcquire(t, dir, "host-1")

	start := time.Now()
	r := try(t, dir, "host-2")
	// The whole child (exec, runtime start, exit) is bounded loosely: under -race on a
	// loaded CI machine it alone can take most of a second. The refusal itself is the
	// issue's bound, checked below from the child's own clock.
	if elapsed := time.Since(start); elapsed > 10*time.Second {
		t.Errorf("second process: exec to exit took %v, want well under 10s", elapsed)
	}
	t.Logf("second process: exec to exit %v", time.Since(start))
	if !r.InUse || r.Holder.PID != os.Getpid() || r.Holder.NodeID != "host-1" {
		t.Fatalf("second process: %+v, want refused naming PID %d and node host-1", r, os.Getpid())
	}
	if r.Elapsed > time.Second {
		t.Errorf("second process: refusal took %v, want < 1s", r.Elapsed)
	}
	for _, want := range []string{"data dir " + dir, fmt.Sprintf("PID %d", os.Getpid()), `"host-1"`} {
		if !strings.Contains(r.Err, want) {
			t.Errorf("second process: error %q does not contain %q", r.Err, want)
		}
	}
	if got := readNote(t, dir); got.PID != os.Getpid() {
		t.Errorf("note after the refusal = %+v, want still the holder's", got)
	}
}

// TestHeldByOtherProcess: the other direction, and a release seen by the other process.
func TestHeldByOtherProcess(t *testing.T) {
	dir := t.TempDir()
	h := startHelper(t, "hold", dir, "host-1")
	h.locked(t)

	start := time.Now()
	l, err := datadir.Acquire(dir, "host-2")
	if elapsed := time.Since(start); elapsed > time.Second {
		t.Errorf("refusal took %v, want < 1s", elapsed)
	}
	if err == nil {
		l.Release()
	}
	wantInUse(t, err, dir, h.cmd.Process.Pid, "host-1")

	_ = h.stdin.Close() // the holder releases and exits
	if err := h.wait(t, 5*time.Second); err != nil {
		t.Fatalf("hold helper: %v", err)
	}
	mustAcquire(t, dir, "host-2")
}

// TestKilledHolder: a holder killed with SIGKILL leaves its note but no lock; the next
// Acquire succeeds at once, without waiting or retrying, and replaces the note.
func TestKilledHolder(t *testing.T) {
	dir := t.TempDir()
	h := startHelper(t, "hold", dir, "killed")
	h.locked(t)
	if got := readNote(t, dir); got.PID != h.cmd.Process.Pid {
		t.Fatalf("note = %+v, want the helper's PID %d", got, h.cmd.Process.Pid)
	}
	h.kill(t)

	start := time.Now()
	mustAcquire(t, dir, "restarted")
	if elapsed := time.Since(start); elapsed > time.Second {
		t.Errorf("Acquire after the kill took %v, want < 1s", elapsed)
	}
	if got := readNote(t, dir); got.PID != os.Getpid() || got.NodeID != "restarted" {
		t.Errorf("note = %+v, want this process as node restarted", got)
	}
}

// TestKilledHolderChildLives: a child the holder started does not inherit the lock
// (close-on-exec), so it does not keep the dir locked after the holder is killed.
func TestKilledHolderChildLives(t *testing.T) {
	dir := t.TempDir()
	h := startHelper(t, "hold", dir, "parent", envSpawn+"=1")
	child := h.locked(t)
	if child <= 0 {
		t.Fatalf("hold helper started no child")
	}
	h.kill(t)
	if err := syscall.Kill(child, 0); err != nil {
		t.Fatalf("the holder's child (PID %d) is gone (%v); the test needs it alive", child, err)
	}

	mustAcquire(t, dir, "restarted")
	// The child shares the stdin pipe, which the cleanup closes: it exits then.
}

// TestAcquireReadOnlyDir: a dir this process may not write is an error that names it.
// Root ignores file modes, so as root the attempt runs in a helper as user nobody.
func TestAcquireReadOnlyDir(t *testing.T) {
	check := func(msg string) {
		t.Helper()
		if !strings.Contains(msg, "permission denied") || strings.Contains(msg, "in use") {
			t.Errorf("Acquire on a read-only dir = %q, want permission denied", msg)
		}
	}
	if os.Geteuid() != 0 {
		dir := filepath.Join(t.TempDir(), "ro")
		if err := os.Mkdir(dir, 0o555); err != nil {
			t.Fatal(err)
		}
		l, err := datadir.Acquire(dir, "n")
		if err == nil {
			l.Release()
			t.Fatalf("Acquire(%s) succeeded on a read-only dir", dir)
		}
		if !strings.Contains(err.Error(), "data dir "+dir) {
			t.Errorf("Acquire error %q does not name %s", err, dir)
		}
		check(err.Error())
		return
	}

	// Everything on the way to the binary and the dir must be open to nobody; the
	// test binary's own directory is not.
	root, err := os.MkdirTemp("", "datadir-ro-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(root) })
	exe := filepath.Join(root, "datadir.test")
	dir := filepath.Join(root, "ro")
	if err := os.Chmod(root, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := copyExecutable(exe); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(dir, 0o555); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(exe)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: 65534, Gid: 65534}}
	start := time.Now()
	r := startHelperAs(t, cmd, "try", dir, "n").result(t, start)
	if r.Succeeded {
		t.Fatalf("Acquire(%s) as nobody succeeded on a read-only dir", dir)
	}
	if !strings.Contains(r.Err, "data dir "+dir) {
		t.Errorf("Acquire error %q does not name %s", r.Err, dir)
	}
	check(r.Err)
}

func copyExecutable(to string) error {
	exe, err := os.Executable()
	if err != nil {
		return err
	}
	src, err := os.Open(exe)
	if err != nil {
		return err
	}
	defer src.Close()
	dst, err := os.OpenFile(to, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o755)
	if err != nil {
		return err
	}
	if _, err := io.Copy(dst, src); err != nil {
		dst.Close()
		return err
	}
	return dst.Close()
}

// raceNoExitSleep returns GORACE for a helper: the race detector makes a race-enabled
// binary sleep 1 s on exit, which would hide how fast a helper is refused.
func raceNoExitSleep() string {
	return strings.TrimSpace("GORACE=" + os.Getenv("GORACE") + " atexit_sleep_ms=0")
}

// tbWriter sends a helper's stderr to the test log.
type tbWriter struct{ tb testing.TB }

func (w *tbWriter) Write(p []byte) (int, error) {
	w.tb.Logf("helper: %s", strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
