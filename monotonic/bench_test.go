package monotonic

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/leafbus/leafbus/wire"
)

// benchSetup is n dispensers on one embedded NATS server with the monotonic tag
// "ordered" and the ordinary tag "plain" (both step 1000), and 4 client connections.
func benchSetup(b *testing.B, n int, proxies bool) (*env, []*node, *node, []*nats.Conn) {
	b.Helper()
	e := newEnv(b)
	e.log = false
	nodes, leader, clients := startN(e, n, proxies, 1000)
	clients = append(clients, e.connect(e.urls, "c4"))
	step := int64(1000)
	if _, err := admin(b, clients[0], e.prefix, "add", wire.AddTagRequest{Tag: "plain", Step: &step}); err != nil {
		b.Fatal(err)
	}
	return e, nodes, leader, clients
}

// throughput sends single-ID requests for tag from workers goroutines over conns for
// d and returns the answered requests per second. Any error fails b.
func throughput(b *testing.B, conns []*nats.Conn, prefix, tag string, workers int, d time.Duration) float64 {
	b.Helper()
	subject := wire.Subjects{Prefix: prefix}.IDs(wire.Segment, tag)
	var done atomic.Int64
	var failed atomic.Value
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	var wg sync.WaitGroup
	start := time.Now()
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			nc := conns[w%len(conns)]
			for ctx.Err() == nil {
				if _, _, err := request(nc, subject, 1, 2*time.Second); err != nil {
					failed.Store(err)
					return
				}
				done.Add(1)
			}
		}()
	}
	wg.Wait()
	if err, _ := failed.Load().(error); err != nil {
		b.Fatalf("request of %s: %v", tag, err)
	}
	return float64(done.Load()) / time.Since(start).Seconds()
}

// BenchmarkSingleID compares the single-ID throughput of a monotonic tag with an
// ordinary one on the same dispensers, 64 requests in flight, in interleaved rounds of
// 250ms (one ordinary and one monotonic round per iteration, in alternating order: a
// single run means little on a shared machine). The metrics are medians of the rounds;
// run with -benchtime=20x or more. With three dispensers, two requests in three are
// forwarded to the leader; with one, none are, which isolates the in-order sequence.
func BenchmarkSingleID(b *testing.B) {
	for _, n := range []int{3, 1} {
		b.Run(fmt.Sprintf("dispensers=%d", n), func(b *testing.B) { benchSingleID(b, n) })
	}
}

func benchSingleID(b *testing.B, dispensers int) {
	e, nodes, _, clients := benchSetup(b, dispensers, false)
	throughput(b, clients, e.prefix, "ordered", 64, 200*time.Millisecond) // warm up
	throughput(b, clients, e.prefix, "plain", 64, 200*time.Millisecond)
	var plain, ordered, ratio []float64
	b.ResetTimer()
	for i := range b.N {
		var p, o float64
		if i%2 == 0 {
			p = throughput(b, clients, e.prefix, "plain", 64, 250*time.Millisecond)
			o = throughput(b, clients, e.prefix, "ordered", 64, 250*time.Millisecond)
		} else {
			o = throughput(b, clients, e.prefix, "ordered", 64, 250*time.Millisecond)
			p = throughput(b, clients, e.prefix, "plain", 64, 250*time.Millisecond)
		}
		plain, ordered, ratio = append(plain, p), append(ordered, o), append(ratio, o/p)
	}
	b.ReportMetric(median(plain), "ordinary-req/s")
	b.ReportMetric(median(ordered), "monotonic-req/s")
	b.ReportMetric(median(ratio), "monotonic/ordinary")
	b.Logf("ordinary %s req/s; monotonic %s req/s; ratios %s", joinFloats("%.0f", plain), joinFloats("%.0f", ordered), joinFloats("%.2f", ratio))
	for _, n := range nodes {
		b.Logf("%s: %+v", n.name, n.mgr.Stats().Tags)
	}
}

// BenchmarkFailover kills the leader of a monotonic tag (its connections cut, no
// release) under load and measures the time from the kill until a request is answered
// again, against the lease TTL (2s). One iteration is one kill on fresh dispensers.
func BenchmarkFailover(b *testing.B) {
	var gaps []float64
	for range b.N {
		b.StopTimer()
		e, nodes, leader, clients := benchSetup(b, 3, true)
		throughput(b, clients, e.prefix, "ordered", 8, 300*time.Millisecond)
		b.StartTimer()
		killed := time.Now()
		leader.kill()
		gap := time.Duration(0)
		for {
			_, _, err := request(clients[0], wire.Subjects{Prefix: e.prefix}.IDs(wire.Segment, "ordered"), 1, time.Second)
			if err == nil {
				gap = time.Since(killed)
				break
			}
			if time.Since(killed) > 5*e.ttl {
				b.Fatalf("no answer within %v of the kill: %v", 5*e.ttl, err)
			}
			time.Sleep(time.Millisecond)
		}
		b.StopTimer()
		gaps = append(gaps, gap.Seconds()/e.ttl.Seconds())
		for _, n := range nodes {
			n.stop()
		}
	}
	b.ReportMetric(median(gaps), "failover/TTL")
	b.Logf("failover as a multiple of the lease TTL: %v", gaps)
}

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	if len(s) == 0 {
		return 0
	}
	return s[len(s)/2]
}

// joinFloats formats each of xs with format (e.g. "%.2f"), space separated.
func joinFloats(format string, xs []float64) string {
	parts := make([]string, len(xs))
	for i, x := range xs {
		parts[i] = fmt.Sprintf(format, x)
	}
	return strings.Join(parts, " ")
}
