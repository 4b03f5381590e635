package main

import (
	"bytes"
	"context"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/leafbus/leafbus/client"
	"github.com/nats-io/nats.go"
)

// syncBuffer is a bytes.Buffer that the dispenser writes while the test reads.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// logWriter sends the dispenser's log lines to t.Log: shown only when a test fails.
type logWriter struct{ tb testing.TB }

func (w logWriter) Write(p []byte) (int, error) {
	w.tb.Helper()
	w.tb.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

// testDispenser is a running Main for a test.
type testDispenser struct {
	*Main
	stdout *syncBuffer
	stderr *syncBuffer
	stop   func() error // stops it and returns Run's result
}

// startDispenser runs the real code path on a random port in a temp dir; configure
// adjusts the defaults (as flags would) before it starts. It is stopped at cleanup.
func startDispenser(tb testing.TB, configure func(*Main)) *testDispenser {
	tb.Helper()
	m := NewMain()
	d := &testDispenser{Main: m, stdout: &syncBuffer{}, stderr: &syncBuffer{}}
	m.Stdout = d.stdout
	m.Stderr = io.MultiWriter(d.stderr, logWriter{tb})
	m.Getenv = func(string) string { return "" }
	m.Config.Listen = "127.0.0.1:0"
	m.Config.DataDir = tb.TempDir()
	m.Config.NodeID = "test-node"
	m.Config.LogLevel = "debug"
	if configure != nil {
		configure(m)
	}
	if err := m.Config.Validate(); err != nil {
		tb.Fatalf("config: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	var once sync.Once
	var result error
	d.stop = func() error {
		once.Do(func() {
			cancel()
			select {
			case result = <-done:
			case <-time.After(30 * time.Second):
				tb.Errorf("dispenser did not stop within 30s")
			}
		})
		return result
	}
	tb.Cleanup(func() {
		if err := d.stop(); err != nil {
			tb.Errorf("dispenser Run: %v", err)
		}
	})
	select {
	case <-m.Ready():
	case err := <-done:
		tb.Fatalf("dispenser stopped before it was ready: %v\nstderr:\n%s", err, d.stderr.String())
	case <-time.After(30 * time.Second):
		tb.Fatalf("dispenser not ready within 30s")
	}
	return d
}

// connect opens a client connection to d, closed at cleanup.
func (d *testDispenser) connect(tb testing.TB) *nats.Conn {
	tb.Helper()
	nc, err := nats.Connect(d.ClientURL(), nats.Timeout(5*time.Second))
	if err != nil {
		tb.Fatalf("connect to %s: %v", d.ClientURL(), err)
	}
	tb.Cleanup(nc.Close)
	return nc
}

func (d *testDispenser) client(tb testing.TB, opts ...client.ClientOption) *client.Client {
	tb.Helper()
	c, err := client.NewClient(d.connect(tb), opts...)
	if err != nil {
		tb.Fatal(err)
	}
	return c
}

// takeSnowflakes takes n snowflake IDs from d in one request, adds them to seen (failing on a repeat) and
// returns the worker ID and the highest timestamp they carry.
func takeSnowflakes(t *testing.T, d *testDispenser, seen map[int64]string, who string, n int) (workerID, maxTS int64) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c := d.client(t)
	ids, err := c.SnowflakeN(ctx, "worker-test", n)
	if err != nil {
		t.Fatalf("%s: SnowflakeN: %v", who, err)
	}
	workerID = -1
	for _, id := range ids {
		if prev, dup := seen[id]; dup {
			t.Fatalf("snowflake ID %d from %s was already handed out by %s", id, who, prev)
		}
		seen[id] = who
	}
	for _, id := range []int64{ids[0], ids[len(ids)-1]} {
		dec, err := c.Decode(ctx, id)
		if err != nil {
			t.Fatalf("%s: Decode(%d): %v", who, id, err)
		}
		if workerID >= 0 && dec.WorkerID != workerID {
			t.Fatalf("%s: IDs of one dispenser carry worker IDs %d and %d", who, workerID, dec.WorkerID)
		}
		workerID, maxTS = dec.WorkerID, max(maxTS, dec.Timestamp)
	}
	return workerID, maxTS
}

// workerOf keeps takeSnowflakes' worker ID.
func workerOf(workerID, _ int64) int64 { return workerID }
