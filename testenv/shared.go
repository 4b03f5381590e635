package testenv

import (
	"os"
	"sync"
	"testing"
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

	mariaMu        sync.Mutex
	mariaShared    *MariaDBServer
	mariaSharedErr error

	zkMu        sync.Mutex
	zkShared    *ZooKeeperServer
	zkSharedErr error
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
	e.zkMu.Lock()
	if e.zkShared != nil {
		e.zkShared.halt()
		os.RemoveAll(e.zkShared.dir)
		e.zkShared = nil
	}
	e.zkMu.Unlock()

	e.mariaMu.Lock()
	if e.mariaShared != nil {
		e.mariaShared.halt()
		os.RemoveAll(e.mariaShared.dir)
		e.mariaShared = nil
	}
	e.mariaMu.Unlock()

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
