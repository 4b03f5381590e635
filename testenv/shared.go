package testenv

import (
	"os"
	"sync"
	"testing"
	"time"
)

// env is testenv's one piece of package state. Sharing a server between the tests of a
// binary needs something that outlives each test, and Pdeathsig needs one long-lived
// thread; both live here and Main ends them.
var env environment

type environment struct {
	sweepOnce sync.Once // stale directories are swept before the first one is made

	spawnMu sync.Mutex
	spawn   *spawner
	ended   bool // Main has shut down; nothing may start any more

	mariaTplMu    sync.Mutex
	mariaTemplate string // a data dir made once per binary by mariadb-install-db
	mariaTplErr   error  // a failed install is not retried by every test

	maria shared[*MariaDBServer]
	zk    shared[*ZooKeeperServer]
}

// managed is what sharing and cleaning up need of a server testenv runs: a
// MariaDBServer or a ZooKeeperServer.
type managed interface {
	Addr() string
	halt() error
	removeDir() // the server must be halted
}

// shared is the one server of a kind that every test of a binary gets. A failed start
// is remembered, so that a missing install fails each test at once instead of being
// tried again by every one.
type shared[S managed] struct {
	mu      sync.Mutex
	srv     S
	running bool
	err     error
}

// get returns the shared server, starting it on first use; kind names it in messages.
func (s *shared[S]) get(tb testing.TB, kind string, start func() (S, error)) S {
	tb.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.running && s.err == nil {
		began := time.Now()
		if s.srv, s.err = start(); s.err == nil {
			s.running = true
			tb.Logf("testenv: shared %s on %s ready in %v", kind, s.srv.Addr(), time.Since(began).Round(time.Millisecond))
		}
	}
	if s.err != nil {
		tb.Fatalf("testenv: start shared %s: %v", kind, s.err)
	}
	return s.srv
}

// stop halts the shared server, if it was started, and removes its directory.
func (s *shared[S]) stop() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.running {
		s.srv.halt()
		s.srv.removeDir()
		var none S
		s.srv, s.running = none, false
	}
}

// startPrivate starts a server of kind for tb alone, halted and removed at tb's cleanup.
func startPrivate[S managed](tb testing.TB, kind string, start func() (S, error)) S {
	tb.Helper()
	began := time.Now()
	srv, err := start()
	if err != nil {
		tb.Fatalf("testenv: start %s: %v", kind, err)
	}
	tb.Cleanup(func() {
		srv.halt()
		srv.removeDir()
	})
	tb.Logf("testenv: %s on %s ready in %v", kind, srv.Addr(), time.Since(began).Round(time.Millisecond))
	return srv
}

// spawner returns the process starter, creating it on first use.
func (e *environment) spawner() (*spawner, error) {
	e.spawnMu.Lock()
	defer e.spawnMu.Unlock()
	if e.ended {
		return nil, errEnded
	}
	if e.spawn == nil {
		e.spawn = newSpawner()
	}
	return e.spawn, nil
}

// Main runs a package's tests and then stops the servers they shared and removes their
// directories, and exits with the tests' status. Call it from TestMain:
//
//	func TestMain(m *testing.M) { testenv.Main(m) }
//
// Without it the shared servers still die with the test binary (they are started with
// Pdeathsig), but their temp directories stay until a later test binary sweeps them.
func Main(m *testing.M) {
	code := m.Run()
	env.shutdown()
	os.Exit(code)
}

// shutdown stops the shared servers, removes the template, then ends the spawner
// thread, which kills any process a test leaked.
func (e *environment) shutdown() {
	e.zk.stop()
	e.maria.stop()

	e.mariaTplMu.Lock()
	if e.mariaTemplate != "" {
		os.RemoveAll(e.mariaTemplate)
		e.mariaTemplate = ""
	}
	e.mariaTplMu.Unlock()

	e.spawnMu.Lock()
	e.ended = true
	if e.spawn != nil {
		e.spawn.close()
		e.spawn = nil
	}
	e.spawnMu.Unlock()
}
