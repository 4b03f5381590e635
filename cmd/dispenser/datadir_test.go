package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestBinarySecondOnDataDirRefused runs the real binary twice on one data dir (other
// --listen ports): the second exits 1 within 1 s naming the first's PID and node ID,
// while the first goes on serving; after a kill -9 of the first, the lock it held is
// no obstacle and a restart on the dir serves.
func TestBinarySecondOnDataDirRefused(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	dir := t.TempDir()
	first := startBinary(t, dir)
	code, stderr, took := runToExit(t, 10*time.Second, nil,
		"--listen", fmt.Sprintf("127.0.0.1:%d", freePort(t)), "--data-dir", dir, "--node-id", "second")
	if code != 1 {
		t.Fatalf("second dispenser on the dir: exit %d, want 1\nstderr:\n%s", code, stderr)
	}
	for _, want := range []string{fmt.Sprintf("PID %d", first.cmd.Process.Pid), `dispenser "bin-test"`, "--data-dir"} {
		if !strings.Contains(stderr, want) {
			t.Errorf("the refusal does not contain %q:\n%s", want, stderr)
		}
	}
	if took > time.Second {
		t.Errorf("the second dispenser took %v to exit, want under 1s", took)
	}
	t.Logf("refused in %v: %s", took.Round(time.Millisecond), lastLine(stderr))
	requestSegment(t, first.url)

	if err := first.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-first.done:
		first.done <- err // for startBinary's cleanup
	case <-time.After(10 * time.Second):
		t.Fatal("killed dispenser did not exit")
	}
	again := startBinary(t, dir)
	requestSegment(t, again.url)
}

// runToExit runs the binary with args (and env added to the process's environment) and
// waits up to within for it to exit; it returns the exit code, stderr and how long the
// process ran.
func runToExit(tb testing.TB, within time.Duration, env []string, args ...string) (code int, stderr string, took time.Duration) {
	tb.Helper()
	bin, err := buildDispenser()
	if err != nil {
		tb.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	var errBuf bytes.Buffer
	cmd.Stderr = &errBuf
	start := time.Now()
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err = <-done:
		took = time.Since(start)
	case <-time.After(within):
		cmd.Process.Kill()
		<-done
		tb.Fatalf("dispenser %s still running after %v\nstderr:\n%s", strings.Join(args, " "), within, errBuf.String())
	}
	var exit *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &exit):
		code = exit.ExitCode()
	default:
		tb.Fatalf("dispenser %s: %v", strings.Join(args, " "), err)
	}
	return code, errBuf.String(), took
}

// lastLine is the last non-empty line of s.
func lastLine(s string) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return lines[len(lines)-1]
}
