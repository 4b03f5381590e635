package main

import (
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/leafbus/leafbus/testenv"
)

// burnCPU spins until this process has used more CPU than at the start, by /proc's
// 10 ms clock; the deadline only ends a test on a platform that never counts.
func burnCPU(t *testing.T) {
	t.Helper()
	before, err := processCPU(os.Getpid())
	if err != nil {
		t.Fatalf("processCPU(self): %v", err)
	}
	deadline := time.Now().Add(30 * time.Second)
	x := 0
	for time.Now().Before(deadline) {
		for i := range 1 << 16 {
			x += i
		}
		if now, err := processCPU(os.Getpid()); err == nil && now > before {
			return
		}
	}
	t.Fatalf("no CPU counted after 30 s of spinning (%d)", x)
}

// TestCPUWatch: a watch over this process (as --cpu-pid would name it) reports CPU per
// request of every label it could read, and a process that is gone is left out.
func TestCPUWatch(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("CPU per request is measured on Linux only")
	}
	if _, err := processCPU(1 << 30); err == nil {
		t.Fatalf("processCPU of a pid that cannot exist: no error")
	}
	w := startCPUWatch(map[string]int{cpuBench: os.Getpid(), "gone": 1 << 30, "dispenser": os.Getpid()}, 0)
	if w == nil {
		t.Fatal("startCPUWatch = nil on Linux")
	}
	burnCPU(t)
	w.stop()
	got := w.perRequest(10)
	if len(got) != 2 || got[cpuBench] <= 0 || got["dispenser"] != got[cpuBench] {
		t.Fatalf("perRequest = %v, want bench and dispenser, equal and positive", got)
	}
	if w.perRequest(0) != nil {
		t.Fatalf("perRequest(0) = %v, want nil (no requests)", w.perRequest(0))
	}
}

// TestRunCPUPID: --cpu-pid's processes get a CPU row in the phase's report.
func TestRunCPUPID(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("CPU per request is measured on Linux only")
	}
	n := testenv.StartNATS(t)
	startFake(t, n, faults{})
	cfg := testConfig(n.URL())
	cfg.CPUPIDs = map[string]int{"dispenser": os.Getpid()}
	rep := runBounded(t, cfg)
	if _, ok := rep.Dispenser.CPU["dispenser"]; !ok {
		t.Fatalf("CPU per request %v, want a dispenser entry", rep.Dispenser.CPU)
	}
	if _, ok := rep.Dispenser.CPU[cpuBench]; !ok {
		t.Fatalf("CPU per request %v, want the bench's own entry", rep.Dispenser.CPU)
	}
}
