package testenv

import (
	"archive/zip"
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// BenchmarkStartPrivate measures what a private server costs a test: the time from
// StartMariaDB or StartZooKeeper to a server that answers (ns/op), and its resident
// memory then (RSS-KiB, the largest seen). The first start of a kind is made before
// the clock runs: it pays for the MariaDB template (mariadb-install-db) once per test
// binary, which the shared server's "ready in" log line shows.
func BenchmarkStartPrivate(b *testing.B) {
	b.Run("MariaDB", func(b *testing.B) {
		StartMariaDB(b).Stop()
		rss := 0
		for b.Loop() {
			m := StartMariaDB(b)
			rss = max(rss, m.proc.rssKB())
			m.Stop()
		}
		b.ReportMetric(float64(rss), "RSS-KiB")
	})
	b.Run("ZooKeeper", func(b *testing.B) {
		StartZooKeeper(b).Stop()
		rss := 0
		for b.Loop() {
			z := StartZooKeeper(b)
			rss = max(rss, z.proc.rssKB())
			z.Stop()
		}
		b.ReportMetric(float64(rss), "RSS-KiB")
	})
}

// fatalRecorder is a testing.TB whose Fatalf records the message and ends the calling
// goroutine, as the real one does, so that the failure path itself can be tested.
type fatalRecorder struct {
	testing.TB
	msg string
}

func (r *fatalRecorder) Helper() {}

func (r *fatalRecorder) Fatalf(format string, args ...any) {
	r.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

// fatalMessage runs f with a recorder and returns what it passed to Fatalf.
func fatalMessage(t *testing.T, f func(tb testing.TB)) string {
	t.Helper()
	r := &fatalRecorder{TB: t}
	done := make(chan struct{})
	go func() {
		defer close(done)
		f(r)
	}()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatal("the start with missing files neither failed nor returned within 30s")
	}
	return r.msg
}

func TestMissingInstallFailsNamingMakeDeps(t *testing.T) {
	const gone = "/nonexistent/testenv"
	mdb, zkp := debianMariaDBPaths(), debianZooKeeperPaths()
	tests := []struct {
		name    string
		start   func(tb testing.TB)
		missing string
	}{
		{"MariaDBServer", func(tb testing.TB) {
			p := mdb
			p.mariadbd = gone + "/mariadbd"
			startMariaDB(tb, p)
		}, gone + "/mariadbd"},
		{"MariaDBInstallDB", func(tb testing.TB) {
			p := mdb
			p.installDB = gone + "/mariadb-install-db"
			startMariaDB(tb, p)
		}, gone + "/mariadb-install-db"},
		{"ZooKeeperJar", func(tb testing.TB) {
			p := zkp
			p.jar = gone + "/zookeeper.jar"
			startZooKeeper(tb, p)
		}, gone + "/zookeeper.jar"},
		{"Java", func(tb testing.TB) {
			p := zkp
			p.java = "testenv-no-such-java"
			startZooKeeper(tb, p)
		}, "testenv-no-such-java on PATH"},
		{"EnsembleJar", func(tb testing.TB) {
			p := zkp
			p.jar = gone + "/zookeeper.jar"
			startZooKeeperEnsemble(tb, p, 3)
		}, gone + "/zookeeper.jar"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			msg := fatalMessage(t, tt.start)
			t.Log(msg)
			if !strings.Contains(msg, tt.missing) || !strings.Contains(msg, "run `make deps`") {
				t.Errorf("Fatalf message = %q, want it to name %q and say \"run `make deps`\"", msg, tt.missing)
			}
		})
	}
}

func TestManifestMissing(t *testing.T) {
	dir := t.TempDir()
	present := filepath.Join(dir, "present.jar")
	if err := os.WriteFile(present, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	// A Class-Path long enough to be wrapped at 72 bytes, with absolute and relative
	// entries, as jar tools write it.
	manifest := "Manifest-Version: 1.0\r\nClass-Path: " + present + " relative-missing.ja\r\n r " +
		filepath.Join(dir, "absent.jar") + "\r\nCreated-By: test\r\n"
	jar := filepath.Join(dir, "main.jar")
	f, err := os.Create(jar)
	if err != nil {
		t.Fatal(err)
	}
	zw := zip.NewWriter(f)
	w, err := zw.Create("META-INF/MANIFEST.MF")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := w.Write([]byte(manifest)); err != nil {
		t.Fatal(err)
	}
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}

	got, err := manifestMissing(jar)
	want := []string{filepath.Join(dir, "relative-missing.jar"), filepath.Join(dir, "absent.jar")}
	if err != nil || !slices.Equal(got, want) {
		t.Errorf("manifestMissing = %v, %v; want %v, nil", got, err, want)
	}
}

// orphanEnv switches TestServersDieWithTheBinary into its child role.
const orphanEnv = "TESTENV_ORPHAN_CHILD"

// TestServersDieWithTheBinary runs this test binary again as a child that starts the
// shared servers and is then SIGKILLed, so no Main or cleanup runs: Pdeathsig must take
// its servers down anyway, and the next sweep must remove the directories it left.
func TestServersDieWithTheBinary(t *testing.T) {
	if os.Getenv(orphanEnv) != "" {
		z, m := ZooKeeper(t), MariaDB(t)
		env.mariaTplMu.Lock()
		tpl := env.mariaTemplate
		env.mariaTplMu.Unlock()
		fmt.Printf("ORPHAN %d %s %d %s %s\n", z.PID(), z.dir, m.PID(), m.dir, tpl)
		<-time.After(2 * time.Minute) // the parent kills us long before
		return
	}

	own := MariaDB(t) // this binary's own directories must survive the sweep below
	env.mariaTplMu.Lock()
	ownTemplate := env.mariaTemplate
	env.mariaTplMu.Unlock()

	cmd := exec.Command(os.Args[0], "-test.run=^TestServersDieWithTheBinary$", "-test.v")
	cmd.Env = append(os.Environ(), orphanEnv+"=1")
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	reaped := false
	defer func() {
		if !reaped {
			cmd.Process.Kill()
			cmd.Wait()
		}
	}()

	line := make(chan string, 1)
	go func() {
		defer close(line)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if strings.HasPrefix(sc.Text(), "ORPHAN ") {
				line <- sc.Text()
				break
			}
		}
		for sc.Scan() { // drain until the child is gone
		}
	}()
	var report string
	select {
	case report = <-line:
	case <-time.After(2 * time.Minute):
		t.Fatal("the child did not report its servers within 2m")
	}
	f := strings.Fields(report)
	if len(f) != 6 {
		t.Fatalf("child reported %q", report)
	}
	zkPID, _ := strconv.Atoi(f[1])
	mdbPID, _ := strconv.Atoi(f[3])
	dirs := f[2:]
	t.Cleanup(func() {
		for _, d := range dirs {
			os.RemoveAll(d)
		}
	})
	if zkPID == 0 || mdbPID == 0 || !processAlive(zkPID) || !processAlive(mdbPID) {
		t.Fatalf("child's servers not running before the kill: %q", report)
	}

	if err := cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	cmd.Wait()
	reaped = true

	deadline := time.Now().Add(10 * time.Second)
	for processAlive(zkPID) || processAlive(mdbPID) {
		if time.Now().After(deadline) {
			t.Fatalf("10s after the child was killed: ZooKeeper pid %d alive %v, mariadbd pid %d alive %v",
				zkPID, processAlive(zkPID), mdbPID, processAlive(mdbPID))
		}
		time.Sleep(20 * time.Millisecond)
	}

	sweepStaleDirs()
	for _, d := range dirs {
		if _, err := os.Stat(d); err == nil {
			t.Errorf("%s still exists after sweepStaleDirs; its owner is dead", d)
		}
	}
	for _, d := range []string{own.dir, ownTemplate} {
		if _, err := os.Stat(d); err != nil {
			t.Errorf("sweepStaleDirs removed %s of this live binary: %v", d, err)
		}
	}
}

func BenchmarkMariaDBStartPrivate(b *testing.B) {
	b.ReportAllocs()
	// mariadb-install-db runs once per binary; leave it out of the loop.
	if _, err := env.mariaDBTemplate(debianMariaDBPaths()); err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		StartMariaDB(b).Stop()
	}
}

func BenchmarkMariaDBRestart(b *testing.B) {
	b.ReportAllocs()
	m := StartMariaDB(b)
	for b.Loop() {
		m.Restart()
	}
}

func BenchmarkZooKeeperStartPrivate(b *testing.B) {
	b.ReportAllocs()
	for b.Loop() {
		StartZooKeeper(b).Stop()
	}
}

func BenchmarkZooKeeperRestart(b *testing.B) {
	b.ReportAllocs()
	z := StartZooKeeper(b)
	for b.Loop() {
		z.Restart()
	}
}

// TestPortTakenIsDetected starts a second server on the port of a running one: the start
// must fail with errAddrInUse (which makes a fresh start move to another port), never
// take the running server's answers for its own.
func TestPortTakenIsDetected(t *testing.T) {
	t.Run("MariaDB", func(t *testing.T) {
		running := StartMariaDB(t)
		tpl, err := env.mariaDBTemplate(debianMariaDBPaths())
		if err != nil {
			t.Fatal(err)
		}
		dir, err := newDir("mdb")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		second := &MariaDBServer{paths: debianMariaDBPaths(), dir: dir, port: running.port}
		if err := second.populate(tpl); err != nil {
			t.Fatal(err)
		}
		err = second.launch(false)
		if second.proc != nil {
			second.halt()
		}
		if !errors.Is(err, errAddrInUse) {
			t.Errorf("launch on a taken port: err = %v, want errAddrInUse", err)
		}
	})
	t.Run("ZooKeeper", func(t *testing.T) {
		running := StartZooKeeper(t)
		dir, err := newDir("zk")
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { os.RemoveAll(dir) })
		second := &ZooKeeperServer{java: running.java, dir: dir, port: running.port}
		second.config = zkConfig(second.dataDir(), second.port, nil)
		err = second.launch()
		if second.proc != nil {
			second.halt()
		}
		if !errors.Is(err, errAddrInUse) {
			t.Errorf("launch on a taken port: err = %v, want errAddrInUse", err)
		}
	})
}
