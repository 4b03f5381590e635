package main

import (
	"maps"
	"slices"
	"sync"
	"time"
)

// Labels of the processes whose CPU bench watches by itself.
const (
	cpuBench = "bench"
	cpuEcho  = "echo-process"
)

// cpuWatch measures the CPU time (user and system) that processes spend during a phase's
// measured part: this bench, the dispenser (--cpu-pid) and an echo process. Divided by
// the good replies it gives CPU per request, the cost of each side of a request/reply.
// Unlike requests/s, it barely moves when the host steals time or other jobs share the
// cores, so it is the figure to compare between runs on a busy machine.
type cpuWatch struct {
	pids map[string]int // label -> pid

	mu    sync.Mutex
	start map[string]time.Duration
	end   map[string]time.Duration
	timer *time.Timer
}

// startCPUWatch samples pids once the warm-up is over (after warmup from now); nil when
// there is nothing to watch or the platform cannot say (processCPU fails).
func startCPUWatch(pids map[string]int, warmup time.Duration) *cpuWatch {
	if len(pids) == 0 {
		return nil
	}
	if _, err := processCPU(pids[slices.Sorted(maps.Keys(pids))[0]]); err != nil {
		return nil
	}
	c := &cpuWatch{pids: pids}
	if warmup <= 0 {
		// Sampled now: a timer's goroutine could run only after a short phase ended.
		c.start = c.sample()
		return c
	}
	c.timer = time.AfterFunc(warmup, func() {
		s := c.sample()
		c.mu.Lock()
		c.start = s
		c.mu.Unlock()
	})
	return c
}

func (c *cpuWatch) sample() map[string]time.Duration {
	s := make(map[string]time.Duration, len(c.pids))
	for label, pid := range c.pids {
		if t, err := processCPU(pid); err == nil {
			s[label] = t
		}
	}
	return s
}

// stop takes the closing sample.
func (c *cpuWatch) stop() {
	if c == nil {
		return
	}
	if c.timer != nil {
		c.timer.Stop()
	}
	s := c.sample()
	c.mu.Lock()
	c.end = s
	c.mu.Unlock()
}

// perRequest is each process's CPU in microseconds per request over n requests; nil
// when the warm-up never ended or nothing was measured.
func (c *cpuWatch) perRequest(n int64) map[string]float64 {
	if c == nil || n <= 0 {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.start == nil {
		return nil
	}
	out := map[string]float64{}
	for label, end := range c.end {
		if start, ok := c.start[label]; ok {
			out[label] = float64(end-start) / float64(time.Microsecond) / float64(n)
		}
	}
	return out
}
