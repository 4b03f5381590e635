package testenv

import (
	"archive/zip"
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"
)

// ZooKeeperServer is one ZooKeeper server bound to 127.0.0.1 on a random client port,
// with its data in a temp dir: standalone (ZooKeeper, StartZooKeeper) or a member of a
// ZooKeeperEnsemble.
type ZooKeeperServer struct {
	tb     testing.TB // fails Start of a private instance; nil for the shared one
	shared bool
	java   zkJava
	dir    string // zoo.cfg, data/, zookeeper.log; also the JVM's working dir
	port   int    // client port, fixed after the first start
	// member is set for an ensemble node: its readiness is listening on its port, since
	// serving needs a quorum, which is the ensemble's business (ZooKeeperEnsemble.Leader).
	member bool
	config string // zoo.cfg's content

	mu   sync.Mutex
	proc *proc // nil while stopped

	rootSeq atomic.Int64
}

// zooKeeperPaths says where ZooKeeper and Java are. Tests point it at missing files to
// check the message a missing install gives.
type zooKeeperPaths struct {
	jar         string // its manifest's Class-Path names the other jars; the JVM follows it
	slf4jSimple string // optional: without a binding the server logs nothing
	java        string // a name looked up on PATH, or a path
}

// debianZooKeeperPaths are where Debian's zookeeper package and its dependencies put them.
func debianZooKeeperPaths() zooKeeperPaths {
	return zooKeeperPaths{
		jar:         "/usr/share/java/zookeeper.jar",
		slf4jSimple: "/usr/share/java/slf4j-simple.jar",
		java:        "java",
	}
}

// zkJava is how to run a ZooKeeper main class.
type zkJava struct {
	java      string
	jar       string
	classPath string
}

func (p zooKeeperPaths) resolve() (zkJava, error) {
	var missing []string
	if _, err := os.Stat(p.jar); err != nil {
		missing = append(missing, p.jar)
	}
	java, err := exec.LookPath(p.java)
	if err != nil {
		missing = append(missing, p.java+" on PATH")
	}
	if len(missing) > 0 {
		return zkJava{}, fmt.Errorf("%s: %w", strings.Join(missing, ", "), errMissing)
	}
	cp := p.jar
	if _, err := os.Stat(p.slf4jSimple); err == nil {
		cp += string(os.PathListSeparator) + p.slf4jSimple
	}
	return zkJava{java: java, jar: p.jar, classPath: cp}, nil
}

func (j zkJava) args(mainClass, cfg string) []string {
	return []string{
		// A small heap, one GC thread and C1 only: ready in about 0.7 s, about 55 MB RSS.
		"-Xmx128m", "-XX:+UseSerialGC", "-XX:TieredStopAtLevel=1",
		// No /tmp/hsperfdata_<user>/<pid> file, which a SIGKILLed JVM leaves behind.
		"-XX:-UsePerfData",
		"-Dorg.slf4j.simpleLogger.showDateTime=true",
		"-Dorg.slf4j.simpleLogger.dateTimeFormat=HH:mm:ss.SSS",
		"-cp", j.classPath, mainClass, cfg,
	}
}

const (
	zkStandaloneMain = "org.apache.zookeeper.server.ZooKeeperServerMain"
	zkQuorumMain     = "org.apache.zookeeper.server.quorum.QuorumPeerMain"
	// zkReadyTimeout bounds one start; a start takes under a second, an ensemble about 2 s.
	zkReadyTimeout = 30 * time.Second
	// zkSessionTimeout is what testenv's own clients ask for.
	zkSessionTimeout = 10 * time.Second
)

// zkConfig is a zoo.cfg for tests: ticks of 500 ms (sessions of 1 to 60 s), no admin
// server, the four-letter words testenv probes with, no fsync and small preallocation
// (64 MB per server otherwise). peers holds the server.N lines of an ensemble.
func zkConfig(dataDir string, clientPort int, peers []string) string {
	lines := []string{
		"tickTime=500",
		"initLimit=10",
		"syncLimit=5",
		"maxSessionTimeout=60000",
		"dataDir=" + dataDir,
		"clientPort=" + strconv.Itoa(clientPort),
		"clientPortAddress=127.0.0.1",
		"admin.enableServer=false",
		"4lw.commands.whitelist=ruok,srvr,mntr,stat,envi,conf",
		"forceSync=no",
		"preAllocSize=1024",
	}
	lines = append(lines, peers...)
	return strings.Join(lines, "\n") + "\n"
}

// ZooKeeper returns the test binary's shared standalone server, starting it on first
// use. Every test of the binary gets the same server, so isolate with NewRoot and never
// stop it (Stop, Start, Restart and Kill panic on it); use StartZooKeeper for fault
// tests. It is stopped by Main, or dies with the binary.
func ZooKeeper(tb testing.TB) *ZooKeeperServer {
	tb.Helper()
	return env.zk.get(tb, "ZooKeeper", func() (*ZooKeeperServer, error) { return newZooKeeper(debianZooKeeperPaths(), true) })
}

// StartZooKeeper starts a private standalone server for tb, stopped and removed at tb's
// cleanup.
func StartZooKeeper(tb testing.TB) *ZooKeeperServer {
	tb.Helper()
	return startZooKeeper(tb, debianZooKeeperPaths())
}

func startZooKeeper(tb testing.TB, paths zooKeeperPaths) *ZooKeeperServer {
	tb.Helper()
	return startPrivate(tb, "ZooKeeper", func() (*ZooKeeperServer, error) {
		z, err := newZooKeeper(paths, false)
		if err == nil {
			z.tb = tb
		}
		return z, err
	})
}

func newZooKeeper(paths zooKeeperPaths, shared bool) (*ZooKeeperServer, error) {
	java, err := paths.resolve()
	if err != nil {
		return nil, err
	}
	dir, err := newDir("zk")
	if err != nil {
		return nil, err
	}
	z := &ZooKeeperServer{shared: shared, java: java, dir: dir}
	for attempt := 1; ; attempt++ {
		if z.port, err = FreePort(); err != nil {
			break
		}
		z.config = zkConfig(z.dataDir(), z.port, nil)
		err = z.launch()
		if err == nil || !errors.Is(err, errAddrInUse) || attempt == startAttempts {
			break
		}
	}
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return z, nil
}

func (z *ZooKeeperServer) dataDir() string { return filepath.Join(z.dir, "data") }

// spawn writes the config and starts the JVM without waiting for it.
func (z *ZooKeeperServer) spawn() (*proc, error) {
	cfg := filepath.Join(z.dir, "zoo.cfg")
	if err := os.WriteFile(cfg, []byte(z.config), 0o644); err != nil {
		return nil, fmt.Errorf("write zoo.cfg: %w", err)
	}
	main := zkStandaloneMain
	if z.member {
		main = zkQuorumMain
	}
	return startProc(z.java.java, z.java.args(main, cfg), z.dir, filepath.Join(z.dir, "zookeeper.log"))
}

// launch starts the server and waits until it is ready; the caller holds z.mu or owns z
// alone.
func (z *ZooKeeperServer) launch() error {
	p, err := z.spawn()
	if err != nil {
		return err
	}
	if err := z.waitReady(p); err != nil {
		if kerr := p.kill(); kerr != nil {
			return errors.Join(err, kerr)
		}
		return err
	}
	z.proc = p
	return nil
}

// waitReady polls until the server on z's port is this one and, when standalone,
// serves. A lost port race shows as "Address already in use" in the log, and another
// binary's server may be the one answering on the port meanwhile, hence the identity
// check.
func (z *ZooKeeperServer) waitReady(p *proc) error {
	deadline := time.Now().Add(zkReadyTimeout)
	var last error
	for {
		exited := p.exited()
		out := p.output()
		if strings.Contains(out, "Address already in use") {
			return fmt.Errorf("ZooKeeper port %d: %w", z.port, errAddrInUse)
		}
		if exited {
			return fmt.Errorf("ZooKeeper on port %d: %w (%v)%s\n%s", z.port, errExited, p.waitErr, z.explain(out), p.tail())
		}
		var mode string
		mode, last = z.status()
		if last == nil && (z.member || mode == "standalone") {
			return nil
		}
		if last == nil {
			last = fmt.Errorf("mode %q", mode)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("ZooKeeper on port %d: %w (%v): %v\n%s", z.port, errNotReady, zkReadyTimeout, last, p.tail())
		}
		time.Sleep(25 * time.Millisecond)
	}
}

// explain names the jars of zookeeper.jar's manifest that are missing, when the JVM
// failed to load a class. (Debian's manifest names jline.jar, which the server never
// loads and no package installs, so missing jars alone mean nothing.)
func (z *ZooKeeperServer) explain(out string) string {
	if !strings.Contains(out, "ClassNotFoundException") && !strings.Contains(out, "NoClassDefFoundError") {
		return ""
	}
	missing, err := manifestMissing(z.java.jar)
	if err != nil || len(missing) == 0 {
		return ""
	}
	return fmt.Sprintf("; jars named by %s are missing: %s (run `make deps`)", z.java.jar, strings.Join(missing, ", "))
}

// manifestMissing lists the Class-Path entries of jar's manifest that do not exist.
func manifestMissing(jar string) ([]string, error) {
	r, err := zip.OpenReader(jar)
	if err != nil {
		return nil, err
	}
	defer r.Close()
	f, err := r.Open("META-INF/MANIFEST.MF")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(f)
	if err != nil {
		return nil, err
	}
	// Manifest lines are wrapped at 72 bytes; a continuation line starts with a space.
	text := strings.ReplaceAll(strings.ReplaceAll(string(b), "\r\n", "\n"), "\n ", "")
	var missing []string
	for _, line := range strings.Split(text, "\n") {
		cp, ok := strings.CutPrefix(line, "Class-Path:")
		if !ok {
			continue
		}
		for _, entry := range strings.Fields(cp) {
			if !filepath.IsAbs(entry) {
				entry = filepath.Join(filepath.Dir(jar), entry)
			}
			if _, err := os.Stat(entry); err != nil {
				missing = append(missing, entry)
			}
		}
	}
	return missing, nil
}

// status asks the server on z's port who it is (envi's user.dir is z's directory) and
// what it does: "standalone", "leader", "follower", or "" while not serving. `ruok` is
// no use here: it says imok about 250 ms before the server serves.
func (z *ZooKeeperServer) status() (string, error) {
	envi, err := fourLetter(z.Addr(), "envi")
	if err != nil {
		return "", err
	}
	if !strings.Contains(envi, "\nuser.dir="+z.dir+"\n") {
		return "", fmt.Errorf("port %d is served by another process", z.port)
	}
	srvr, err := fourLetter(z.Addr(), "srvr")
	if err != nil {
		return "", err
	}
	if !strings.Contains(srvr, "Zookeeper version") {
		return "", nil
	}
	for _, line := range strings.Split(srvr, "\n") {
		if mode, ok := strings.CutPrefix(line, "Mode: "); ok {
			return strings.TrimSpace(mode), nil
		}
	}
	return "", nil
}

// fourLetter sends a four-letter word and returns the answer; the server closes the
// connection after it. The deadline is short because an answer takes milliseconds, while
// a word that arrives as the server loads its database may never be answered nor closed
// (the server logs a NullPointerException): better to ask again soon.
func fourLetter(addr, cmd string) (string, error) {
	c, err := net.DialTimeout("tcp", addr, 500*time.Millisecond)
	if err != nil {
		return "", err
	}
	defer c.Close()
	if err := c.SetDeadline(time.Now().Add(500 * time.Millisecond)); err != nil {
		return "", err
	}
	if _, err := io.WriteString(c, cmd); err != nil {
		return "", err
	}
	b, err := io.ReadAll(bufio.NewReader(c))
	if err != nil {
		return "", err
	}
	return string(b), nil
}

// Addr is the client address, 127.0.0.1:port; it stays the same across restarts.
func (z *ZooKeeperServer) Addr() string {
	return "127.0.0.1:" + strconv.Itoa(z.port)
}

// Servers is the server list for zk.Connect.
func (z *ZooKeeperServer) Servers() []string {
	return []string{z.Addr()}
}

// Connect opens a session with the server, closed at tb's cleanup. go-zk's log goes
// nowhere: it is noise on every close.
func (z *ZooKeeperServer) Connect(tb testing.TB) *zk.Conn {
	tb.Helper()
	return connectZK(tb, z.Servers())
}

// NewRoot creates a persistent node with a name no other test of this server gets, like
// "/t3", and returns its path; it is removed with everything below it at tb's cleanup
// (a stopped server is ignored then). Tests that share a server keep their nodes under
// their own root.
func (z *ZooKeeperServer) NewRoot(tb testing.TB) string {
	tb.Helper()
	conn, err := dialZK(z.Servers(), zkReadyTimeout)
	if err != nil {
		tb.Fatalf("testenv: NewRoot: %v", err)
	}
	defer conn.Close()
	for {
		path := "/t" + strconv.FormatInt(z.rootSeq.Add(1), 10)
		_, err := conn.Create(path, nil, 0, zk.WorldACL(zk.PermAll))
		if errors.Is(err, zk.ErrNodeExists) {
			continue // a test made it by hand
		}
		if err != nil {
			tb.Fatalf("testenv: NewRoot: create %s on %s: %v", path, z.Addr(), err)
		}
		tb.Cleanup(func() { removeTree(z.Servers(), path) })
		return path
	}
}

// removeTree deletes path and everything below it, giving up after a few seconds when
// the server is down.
func removeTree(servers []string, path string) {
	conn, err := dialZK(servers, 3*time.Second)
	if err != nil {
		return
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		// A session of the test that is still open may add a child meanwhile.
		for range 3 {
			if err := deleteTree(conn, path); !errors.Is(err, zk.ErrNotEmpty) {
				return
			}
		}
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
	}
	conn.Close() // fails any request still waiting, so the goroutine ends
	<-done
}

func deleteTree(conn *zk.Conn, path string) error {
	children, _, err := conn.Children(path)
	if errors.Is(err, zk.ErrNoNode) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, c := range children {
		if err := deleteTree(conn, path+"/"+c); err != nil {
			return err
		}
	}
	if err := conn.Delete(path, -1); err != nil && !errors.Is(err, zk.ErrNoNode) {
		return err
	}
	return nil
}

// quietZK is go-zk's logger in testenv: go-zk reports every reconnect and close, which
// buries a failing test's own output.
type quietZK struct{}

func (quietZK) Printf(string, ...any) {}

func connectZK(tb testing.TB, servers []string) *zk.Conn {
	tb.Helper()
	conn, err := dialZK(servers, zkReadyTimeout)
	if err != nil {
		tb.Fatalf("testenv: %v", err)
	}
	tb.Cleanup(conn.Close)
	return conn
}

// dialZK connects and waits until the session is established. Later events are
// dropped by go-zk when nobody reads them.
func dialZK(servers []string, wait time.Duration) (*zk.Conn, error) {
	conn, events, err := zk.Connect(servers, zkSessionTimeout, zk.WithLogger(quietZK{}))
	if err != nil {
		return nil, fmt.Errorf("connect to ZooKeeper %v: %w", servers, err)
	}
	timeout := time.After(wait)
	for {
		select {
		case ev, ok := <-events:
			if !ok {
				return nil, fmt.Errorf("connect to ZooKeeper %v: connection closed", servers)
			}
			if ev.State == zk.StateHasSession {
				return conn, nil
			}
		case <-timeout:
			conn.Close()
			return nil, fmt.Errorf("connect to ZooKeeper %v: no session within %v", servers, wait)
		}
	}
}

// PID is the server's process id while it runs, 0 while stopped. Fault tests may signal
// it (SIGSTOP makes a server that hangs instead of refusing).
func (z *ZooKeeperServer) PID() int {
	z.mu.Lock()
	defer z.mu.Unlock()
	if z.proc == nil {
		return 0
	}
	return z.proc.pid()
}

// Stop shuts the server down (SIGTERM, then SIGKILL after 10 s) and waits until the
// process is gone; the data dir stays. Safe to call twice. Panics on the shared server.
func (z *ZooKeeperServer) Stop() {
	z.mustBePrivate("Stop")
	if err := z.halt(); err != nil {
		z.tb.Fatalf("testenv: stop ZooKeeper on %s: %v", z.Addr(), err)
	}
}

// Kill ends the server with SIGKILL, as a crash would. Panics on the shared server.
func (z *ZooKeeperServer) Kill() {
	z.mustBePrivate("Kill")
	z.mu.Lock()
	defer z.mu.Unlock()
	if z.proc == nil {
		return
	}
	if err := z.proc.kill(); err != nil {
		z.tb.Fatalf("testenv: kill ZooKeeper on %s: %v", z.Addr(), err)
	}
	z.proc = nil
}

// Start starts a stopped server again on the same port with the same data, so the tree
// survives. A standalone server is ready when it serves; an ensemble node when it
// listens (use the ensemble's Leader to wait for the quorum). It does nothing when the
// server runs. Panics on the shared server.
func (z *ZooKeeperServer) Start() {
	z.mustBePrivate("Start")
	z.mu.Lock()
	defer z.mu.Unlock()
	if z.proc != nil {
		return
	}
	var err error
	for attempt := 1; attempt <= startAttempts; attempt++ {
		if err = z.launch(); err == nil || !errors.Is(err, errAddrInUse) {
			break
		}
		time.Sleep(250 * time.Millisecond) // the port is what clients know: wait for it
	}
	if err != nil {
		z.tb.Fatalf("testenv: restart ZooKeeper on %s: %v", z.Addr(), err)
	}
}

// Restart is Stop followed by Start.
func (z *ZooKeeperServer) Restart() {
	z.Stop()
	z.Start()
}

func (z *ZooKeeperServer) mustBePrivate(op string) {
	if z.shared {
		panic("testenv: " + op + " on the shared ZooKeeper server; use StartZooKeeper for a server a test may stop")
	}
}

// removeDir removes the server's directory (data, config, log); it must be halted.
func (z *ZooKeeperServer) removeDir() { os.RemoveAll(z.dir) }

// halt stops the server whether shared or not.
func (z *ZooKeeperServer) halt() error {
	z.mu.Lock()
	defer z.mu.Unlock()
	if z.proc == nil {
		return nil
	}
	err := z.proc.stop(stopGrace)
	z.proc = nil
	return err
}
