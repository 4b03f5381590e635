package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/leafbus/leafbus/client"
	"github.com/leafbus/leafbus/dispenser"
	"github.com/nats-io/nats.go"
)

// BenchmarkColdStart measures the embedded default from exec to the first segment ID
// answered, as a newcomer's `go run ./cmd/dispenser` sees it once built: the real binary,
// an empty --data-dir each time (NATS and JetStream start, the buckets and the sample tag
// are created, the peer time check waits out its window, the first heartbeat is written).
// ms-to-first-id is the number to read; ns/op also counts stopping the process.
func BenchmarkColdStart(b *testing.B) {
	bin, err := buildDispenser()
	if err != nil {
		b.Fatal(err)
	}
	var total time.Duration
	n := 0
	for b.Loop() {
		port := freePort(b)
		url := fmt.Sprintf("nats://127.0.0.1:%d", port)
		cmd := exec.Command(bin, "--listen", fmt.Sprintf("127.0.0.1:%d", port), "--data-dir", b.TempDir(), "--node-id", "cold")
		start := time.Now()
		if err := cmd.Start(); err != nil {
			b.Fatal(err)
		}
		if err := firstID(url, 30*time.Second); err != nil {
			cmd.Process.Kill()
			cmd.Wait()
			b.Fatal(err)
		}
		total += time.Since(start)
		n++
		cmd.Process.Signal(syscall.SIGTERM)
		if err := cmd.Wait(); err != nil {
			b.Fatalf("dispenser exit: %v", err)
		}
	}
	b.ReportMetric(float64(total.Milliseconds())/float64(n), "ms-to-first-id")
}

// firstID asks for leaf.segment.<sample tag> until it gets an ID, reconnecting while the
// server is not listening yet.
func firstID(url string, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	var last error
	for time.Now().Before(deadline) {
		nc, err := nats.Connect(url, nats.Timeout(time.Second))
		if err != nil {
			last = err
			time.Sleep(2 * time.Millisecond)
			continue
		}
		for time.Now().Before(deadline) {
			msg, err := nc.Request("leaf.segment."+dispenser.SampleTagName, nil, time.Second)
			if err == nil && msg.Header.Get("Nats-Service-Error-Code") == "" {
				if _, err := strconv.ParseInt(string(msg.Data), 10, 64); err == nil {
					nc.Close()
					return nil
				}
			}
			last = err
			time.Sleep(2 * time.Millisecond)
		}
		nc.Close()
	}
	return fmt.Errorf("no ID from %s within %v: %v", url, timeout, last)
}

// BenchmarkResidentTags10k measures the resident memory of the real binary (embedded
// NATS and JetStream included) serving 10,000 tags: each tag added through the admin
// subject, then one ID asked of each so that every tag holds a loaded segment. It
// reports the RSS before the tags (MB-rss-idle) and after (MB-rss-10k-tags), read from
// /proc. The bar is 64 MB.
func BenchmarkResidentTags10k(b *testing.B) {
	const tags = 10_000
	for b.Loop() {
		p := startBinary(b, b.TempDir(), "--log-level", "warn")
		nc, err := nats.Connect(p.url)
		if err != nil {
			b.Fatal(err)
		}
		client, err := client.NewClient(nc)
		if err != nil {
			b.Fatal(err)
		}
		idle := rssMB(b, p.cmd.Process.Pid)
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		// Eight workers: enough to keep the dispenser busy, few enough for 2 cores.
		var wg sync.WaitGroup
		errs := make(chan error, 8)
		for w := 0; w < 8; w++ {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for i := w; i < tags; i += 8 {
					tag := fmt.Sprintf("tag-%05d", i)
					body, _ := json.Marshal(map[string]any{"tag": tag, "step": 1000})
					msg, err := nc.RequestWithContext(ctx, "leaf.admin.tags.add", body)
					if err != nil || msg.Header.Get("Nats-Service-Error-Code") != "" {
						errs <- fmt.Errorf("add %s: %v %s", tag, err, msg.Data)
						return
					}
					if _, err := client.Segment(ctx, tag); err != nil {
						errs <- fmt.Errorf("first ID of %s: %w", tag, err)
						return
					}
				}
			}()
		}
		wg.Wait()
		cancel()
		close(errs)
		for err := range errs {
			b.Fatal(err)
		}
		loaded := rssMB(b, p.cmd.Process.Pid)
		nc.Close()
		p.cmd.Process.Signal(syscall.SIGTERM)
		<-p.done
		p.done <- nil // for startBinary's cleanup
		b.ReportMetric(idle, "MB-rss-idle")
		b.ReportMetric(loaded, "MB-rss-10k-tags")
	}
}

// rssMB reads VmRSS of pid from /proc, in MB.
func rssMB(tb testing.TB, pid int) float64 {
	tb.Helper()
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		tb.Fatalf("read RSS: %v", err)
	}
	for _, line := range strings.Split(string(data), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 64)
			if err != nil {
				tb.Fatalf("VmRSS %q: %v", rest, err)
			}
			return kb / 1024
		}
	}
	tb.Fatalf("no VmRSS in /proc/%d/status", pid)
	return 0
}
