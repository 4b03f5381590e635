package testenv

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Errors behind a failed start. They stay unexported: callers of testenv never see an
// error, a failed start ends the test with tb.Fatalf, and these only steer retries and
// messages inside the package.
var (
	// errMissing is returned when a program or jar testenv needs is not installed.
	errMissing = errors.New("not installed; run `make deps`")
	// errAddrInUse is returned when a server lost the race for its port to another
	// process; the start is retried on another port.
	errAddrInUse = errors.New("address already in use")
	// errExited is returned when a server process ended before it was ready.
	errExited = errors.New("server exited before it was ready")
	// errNotReady is returned when a server did not become ready in time.
	errNotReady = errors.New("server not ready in time")
	// errEnded is returned when a server is started after Main shut testenv down.
	errEnded = errors.New("testenv was shut down by Main")
)

const (
	// stopGrace is how long a server gets to exit after SIGTERM before SIGKILL. MariaDB
	// and ZooKeeper need well under a second here.
	stopGrace = 10 * time.Second
	// reapTimeout bounds the wait for the kernel to hand back a SIGKILLed process.
	reapTimeout = 10 * time.Second
	// logTailLines is how much of a server's output a failure message carries.
	logTailLines = 30
)

// spawner starts every server process from one goroutine that is locked to its OS
// thread. Pdeathsig fires when the *thread* that forked the child ends, not when the
// process does; a locked thread that never unlocks is never reused nor ended by the
// runtime, so the children get SIGKILL exactly when the test binary dies, however it
// dies. The goroutine lives as long as the binary; Main ends it last, and because it
// ends still locked, its thread exits and takes any straggler child with it.
type spawner struct {
	reqs chan spawnReq
}

type spawnReq struct {
	cmd *exec.Cmd
	err chan error
}

func newSpawner() *spawner {
	s := &spawner{reqs: make(chan spawnReq)}
	go func() {
		runtime.LockOSThread()
		// Deliberately no UnlockOSThread: see the type's comment.
		for r := range s.reqs {
			r.err <- r.cmd.Start()
		}
	}()
	return s
}

// start runs cmd.Start on the spawner thread.
func (s *spawner) start(cmd *exec.Cmd) error {
	r := spawnReq{cmd: cmd, err: make(chan error, 1)}
	s.reqs <- r
	return <-r.err
}

// close ends the spawner goroutine and with it its thread.
func (s *spawner) close() { close(s.reqs) }

// proc is one running server process: in its own process group, its output appended
// to a log file, reaped by a goroutine that ends when the process does.
type proc struct {
	cmd     *exec.Cmd
	logPath string
	logFrom int64         // size of the log before this process wrote to it
	done    chan struct{} // closed once cmd.Wait returned
	waitErr error         // cmd.Wait's result; read only after done
}

// startProc starts name with args, stdout and stderr appended to logPath.
func startProc(name string, args []string, dir, logPath string) (*proc, error) {
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("open server log: %w", err)
	}
	defer logf.Close() // the child holds its own copy
	st, err := logf.Stat()
	if err != nil {
		return nil, fmt.Errorf("stat server log: %w", err)
	}
	cmd := exec.Command(name, args...)
	cmd.Dir = dir
	cmd.Stdout = logf
	cmd.Stderr = logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	s, err := env.spawner()
	if err != nil {
		return nil, err
	}
	if err := s.start(cmd); err != nil {
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &proc{cmd: cmd, logPath: logPath, logFrom: st.Size(), done: make(chan struct{})}
	go func() {
		// Ends when the process does; every owner of a proc stops or kills it.
		p.waitErr = cmd.Wait()
		close(p.done)
	}()
	return p, nil
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

// exited reports whether the process has ended and been reaped.
func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// stop sends SIGTERM to the process group, SIGKILL after grace, and returns once the
// process is reaped (kill -0 succeeds on a zombie, so only Wait says it is gone).
func (p *proc) stop(grace time.Duration) error {
	if p.exited() {
		return nil
	}
	_ = syscall.Kill(-p.pid(), syscall.SIGTERM)
	select {
	case <-p.done:
		return nil
	case <-time.After(grace):
	}
	return p.kill()
}

// kill sends SIGKILL to the process group and waits until the process is reaped.
func (p *proc) kill() error {
	_ = syscall.Kill(-p.pid(), syscall.SIGKILL)
	select {
	case <-p.done:
		return nil
	case <-time.After(reapTimeout):
		return fmt.Errorf("pid %d not reaped %v after SIGKILL", p.pid(), reapTimeout)
	}
}

// output is what this process (not earlier runs sharing the log file) has written.
func (p *proc) output() string {
	f, err := os.Open(p.logPath)
	if err != nil {
		return ""
	}
	defer f.Close()
	if _, err := f.Seek(p.logFrom, io.SeekStart); err != nil {
		return ""
	}
	b, _ := io.ReadAll(f)
	return string(b)
}

// tail is the end of this process's output, for failure messages.
func (p *proc) tail() string {
	out := strings.TrimRight(p.output(), "\n")
	lines := strings.Split(out, "\n")
	if len(lines) > logTailLines {
		lines = lines[len(lines)-logTailLines:]
	}
	return fmt.Sprintf("--- last lines of %s ---\n%s", p.logPath, strings.Join(lines, "\n"))
}

// rssKB is the process's resident set size in KiB, or 0 when unknown.
func (p *proc) rssKB() int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", p.pid()))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			n, _ := strconv.Atoi(f[1])
			return n
		}
	}
	return 0
}

// ownerFile marks a testenv directory with the pid of the test binary that made it, so
// that a later binary can remove what a killed one left behind.
const ownerFile = "testenv-owner.pid"

// dirPrefix starts the name of every directory testenv makes in the temp dir.
const dirPrefix = "testenv-"

// newDir makes a directory for one server with a short path: MariaDB aborts when its
// socket path is longer than 107 bytes, which t.TempDir() paths can be.
func newDir(kind string) (string, error) {
	env.sweepOnce.Do(sweepStaleDirs)
	dir, err := os.MkdirTemp(tempBase(), dirPrefix+kind+"-")
	if err != nil {
		return "", fmt.Errorf("make temp dir: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, ownerFile), []byte(strconv.Itoa(os.Getpid())), 0o644); err != nil {
		os.RemoveAll(dir)
		return "", fmt.Errorf("mark temp dir: %w", err)
	}
	return dir, nil
}

// tempBase is $TMPDIR unless that is too long for a socket path below it.
func tempBase() string {
	if base := os.TempDir(); len(base) <= 60 {
		return base
	}
	return "/tmp"
}

// sweepStaleDirs removes the directories of test binaries that died without cleaning
// up (killed by a timeout or a signal, or a package without Main). A directory is
// removed only when its owner pid is gone, so binaries running side by side, as
// `go test ./...` runs them, keep theirs.
func sweepStaleDirs() {
	base := tempBase()
	entries, err := os.ReadDir(base)
	if err != nil {
		return
	}
	for _, e := range entries {
		if !e.IsDir() || !strings.HasPrefix(e.Name(), dirPrefix) {
			continue
		}
		dir := filepath.Join(base, e.Name())
		b, err := os.ReadFile(filepath.Join(dir, ownerFile))
		if err != nil {
			continue // not ours, or still being made
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || pid <= 0 || processAlive(pid) {
			continue
		}
		os.RemoveAll(dir)
	}
}

// processAlive reports whether pid names a process that is not a zombie.
func processAlive(pid int) bool {
	state, err := procState(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return !errors.Is(err, fs.ErrNotExist)
	}
	return state != 'Z' && state != 'X'
}

// procState reads the state letter of a /proc/<pid>/stat or /proc/<pid>/task/<tid>/stat
// file: R running, S sleeping, T stopped, Z zombie, and so on; 0 when unreadable.
func procState(statPath string) (byte, error) {
	b, err := os.ReadFile(statPath)
	if err != nil {
		return 0, err
	}
	// The state follows the command name in parentheses, which may itself hold spaces.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return 0, nil
	}
	return b[i+2], nil
}

// freezeTimeout bounds the wait for every thread of a SIGSTOPped process to stop.
const freezeTimeout = 10 * time.Second

// freeze sends SIGSTOP and returns once every thread of the process is stopped. kill(2)
// only queues the signal: each thread stops when it next runs, so for a moment (long,
// on a loaded machine) a thread woken by a request can still answer it.
func (p *proc) freeze() error {
	if err := syscall.Kill(p.pid(), syscall.SIGSTOP); err != nil {
		return fmt.Errorf("SIGSTOP pid %d: %w", p.pid(), err)
	}
	deadline := time.Now().Add(freezeTimeout)
	for {
		running, err := p.runningThreads()
		if err != nil {
			return err
		}
		if running == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("pid %d: %d threads still not stopped %v after SIGSTOP", p.pid(), running, freezeTimeout)
		}
		time.Sleep(time.Millisecond)
	}
}

// runningThreads counts the process's threads that are not stopped.
func (p *proc) runningThreads() (int, error) {
	if p.exited() {
		return 0, fmt.Errorf("pid %d exited", p.pid())
	}
	taskDir := fmt.Sprintf("/proc/%d/task", p.pid())
	tasks, err := os.ReadDir(taskDir)
	if err != nil {
		return 0, fmt.Errorf("list threads: %w", err)
	}
	running := 0
	for _, t := range tasks {
		state, err := procState(filepath.Join(taskDir, t.Name(), "stat"))
		if errors.Is(err, fs.ErrNotExist) {
			continue // the thread ended meanwhile
		}
		if err != nil {
			return 0, fmt.Errorf("thread state: %w", err)
		}
		if state != 'T' {
			running++
		}
	}
	return running, nil
}

// thaw sends SIGCONT to a frozen process.
func (p *proc) thaw() error {
	if p.exited() {
		return nil
	}
	if err := syscall.Kill(p.pid(), syscall.SIGCONT); err != nil {
		return fmt.Errorf("SIGCONT pid %d: %w", p.pid(), err)
	}
	return nil
}

// copyDir copies the tree src to dst (which must not exist), keeping file modes.
func copyDir(src, dst string) error {
	return filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		info, err := d.Info()
		if err != nil {
			return err
		}
		if d.IsDir() {
			return os.MkdirAll(target, info.Mode().Perm())
		}
		if !info.Mode().IsRegular() {
			return nil
		}
		return copyFile(path, target, info.Mode().Perm())
	})
}

func copyFile(src, dst string, perm fs.FileMode) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_EXCL|os.O_WRONLY, perm)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
