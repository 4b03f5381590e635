package dispenser

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/leafbus/leafbus/client"
	"github.com/leafbus/leafbus/internal/testutil"
	"github.com/leafbus/leafbus/metrics"
	"github.com/leafbus/leafbus/monotonic"
	"github.com/leafbus/leafbus/pools"
	"github.com/leafbus/leafbus/wire"
)

// TestMonotonicOverHTTPAndNATS: two dispensers on one NATS server and a monotonic tag
// that also has a --pool on one of them. Requests taking turns over HTTP on each
// dispenser (the follower's forwarded to the leader) and over NATS (either dispenser,
// pool-sized too) get replies each above the one before: HTTP goes through the leader's
// one sequence, never the segment buffers or a pool.
func TestMonotonicOverHTTPAndNATS(t *testing.T) {
	cfg1 := testConfig(t)
	cfg1.NodeID = "mono-1"
	cfg1.MonotonicLeaseTTL = 2 * time.Second // a starved machine's renewals may take a while
	spec, err := pools.ParseSpec("segment:ordered:3:4")
	if err != nil {
		t.Fatal(err)
	}
	cfg1.Pools = pools.Specs{spec}
	d1, err := newTest(t, cfg1)
	if err != nil {
		t.Fatalf("New mono-1: %v", err)
	}
	runUntilCleanup(t, d1)
	cfg2 := testConfig(t)
	cfg2.NodeID, cfg2.NATS, cfg2.MonotonicLeaseTTL = "mono-2", d1.ClientURL(), cfg1.MonotonicLeaseTTL
	d2, err := newTest(t, cfg2)
	if err != nil {
		t.Fatalf("New mono-2: %v", err)
	}
	runUntilCleanup(t, d2)

	_, cl := exactClient(t, d1)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	on, step := true, int64(5) // a short step: the leader takes several segments
	if _, err := cl.AddTag(ctx, wire.AddTagRequest{Tag: "ordered", Step: &step, Monotonic: &on}); err != nil {
		t.Fatalf("add the monotonic tag: %v", err)
	}

	urls := []string{"http://" + d1.HTTPAddr().String(), "http://" + d2.HTTPAddr().String()}
	get := func(i, n int) ([]int64, error) {
		code, body := httpGet(t, fmt.Sprintf("%s/api/segment/get/ordered?count=%d", urls[i], n))
		if code != http.StatusOK {
			return nil, fmt.Errorf("HTTP %d: %s", code, body)
		}
		var ids []int64
		for _, f := range strings.Split(body, "\n") {
			id, err := strconv.ParseInt(f, 10, 64)
			if err != nil {
				return nil, fmt.Errorf("HTTP body %q: %w", body, err)
			}
			ids = append(ids, id)
		}
		return ids, nil
	}
	// Until the first leader serves (a request waits 2 s for one), an answer may be a 503.
	deadline := time.Now().Add(30 * time.Second)
	for {
		_, err := cl.SegmentN(ctx, "ordered", 1)
		if err == nil {
			break
		}
		if !errors.Is(err, wire.ErrUnavailable) || time.Now().After(deadline) {
			t.Fatalf("the monotonic tag is not served: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}

	// Each way is asked until it answered 15 times: a 503 is allowed (the lease moving
	// on a starved machine), an ID out of order never is.
	ways := []string{"HTTP mono-1", "HTTP mono-2", "NATS", "NATS pool-sized"}
	answered := make([]int, len(ways))
	var last int64
	deadline = time.Now().Add(45 * time.Second)
	for i := 0; slices.Min(answered) < 15; i++ {
		if time.Now().After(deadline) {
			t.Fatalf("answers per way %v after %d requests: want 15 each", answered, i)
		}
		var ids []int64
		var err error
		switch way := i % len(ways); way {
		case 0, 1:
			ids, err = get(way, 1+i%3)
		case 2:
			ids, err = cl.SegmentN(ctx, "ordered", 2)
		default:
			ids, err = cl.SegmentN(ctx, "ordered", 3) // the pool's size
		}
		if errors.Is(err, wire.ErrUnavailable) || (err != nil && strings.HasPrefix(err.Error(), "HTTP 503")) {
			time.Sleep(10 * time.Millisecond)
			continue
		}
		if err != nil {
			t.Fatalf("request %d (%s): %v", i, ways[i%len(ways)], err)
		}
		if ids[0] <= last {
			t.Fatalf("request %d (%s) = %v, not above the reply before it (%d)", i, ways[i%len(ways)], ids, last)
		}
		for j := 1; j < len(ids); j++ {
			if ids[j] <= ids[j-1] {
				t.Fatalf("request %d = %v: not increasing", i, ids)
			}
		}
		last = ids[len(ids)-1]
		answered[i%len(ways)]++
	}

	// The follower's HTTP requests went to the leader (whichever dispenser led when).
	var forwarded, terms uint64
	for _, d := range []*Dispenser{d1, d2} {
		for _, ts := range d.mono.Stats().Tags {
			forwarded, terms = forwarded+ts.Forwarded, terms+ts.Terms
		}
	}
	if forwarded == 0 {
		t.Fatalf("no request forwarded (leases taken: %d): want the follower's requests forwarded to the leader", terms)
	}
	for i, d := range []*Dispenser{d1, d2} {
		checkMonotonicMetrics(t, urls[i]+"/metrics", d, "ordered")
	}
}

// checkMonotonicMetrics checks that d's /metrics at url shows tag with one role at 1
// and the counts its $SRV.STATS shows (no request is in flight, so they stand still).
func checkMonotonicMetrics(t *testing.T, url string, d *Dispenser, tag string) {
	t.Helper()
	var stats monotonic.TagStats
	for _, ts := range d.mono.Stats().Tags {
		if ts.Tag == tag {
			stats = ts
		}
	}
	fams := testutil.Scrape(t, url)
	var roles []string
	for _, role := range metrics.MonotonicRoles {
		if v, _ := metricValue(fams, "leafbus_monotonic_role", map[string]string{"tag": tag, "role": role}); v == 1 {
			roles = append(roles, role)
		}
	}
	if len(roles) != 1 {
		t.Errorf("%s: roles at 1 for %q: %v, want exactly one (stats say %q)", url, tag, roles, stats.Role)
	}
	for name, want := range map[string]uint64{
		"leafbus_monotonic_leases_total":             stats.Terms,
		"leafbus_monotonic_forwarded_requests_total": stats.Forwarded,
		"leafbus_monotonic_forward_errors_total":     stats.ForwardErrors,
		"leafbus_monotonic_forward_messages_total":   stats.ForwardMessages,
	} {
		if v, ok := metricValue(fams, name, map[string]string{"tag": tag}); !ok || v != float64(want) {
			t.Errorf("%s: %s{tag=%q} = %v (present %v), want %d as in $SRV.STATS", url, name, tag, v, ok, want)
		}
	}
	if v, ok := metricValue(fams, "leafbus_monotonic_tags", nil); !ok || v != 1 {
		t.Errorf("%s: leafbus_monotonic_tags = %v (present %v), want 1", url, v, ok)
	}
}

// TestMarkPurgesPoolStream: batches the LEAF_POOL stream stored for a tag before it was
// marked monotonic are purged once the dispenser sees the mark, so no bulk job takes IDs
// below those the leader hands out from then on; none are published while it stays so.
func TestMarkPurgesPoolStream(t *testing.T) {
	cfg := testConfig(t)
	cfg.NodeID = "mono-pool"
	spec, err := pools.ParseSpec("segment:later:3:4")
	if err != nil {
		t.Fatal(err)
	}
	cfg.Pools = pools.Specs{spec}
	d, err := newTest(t, cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	runUntilCleanup(t, d)
	nc, cl := exactClient(t, d)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	step := int64(1000)
	if _, err := cl.AddTag(ctx, wire.AddTagRequest{Tag: "later", Step: &step}); err != nil {
		t.Fatalf("add the tag: %v", err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	subject := wire.Subjects{Prefix: cfg.Prefix}.Pool(wire.Segment, "later")
	stored := func() int {
		st, err := js.Stream(ctx, wire.Subjects{Prefix: cfg.Prefix}.PoolStream())
		if err != nil {
			return -1
		}
		info, err := st.Info(ctx, jetstream.WithSubjectFilter(subject))
		if err != nil {
			return -1
		}
		return int(info.State.Subjects[subject])
	}
	testutil.Eventually(t, 30*time.Second, "the pool stream to hold 4 batches of the ordinary tag", func() bool { return stored() == 4 })

	on := true
	if _, err := cl.UpdateTag(ctx, wire.UpdateTagRequest{Tag: "later", Monotonic: &on}); err != nil {
		t.Fatalf("mark the tag monotonic: %v", err)
	}
	testutil.Eventually(t, 30*time.Second, "the pool stream to purge the monotonic tag's batches", func() bool { return stored() == 0 })
	c, err := client.NewConsumer(ctx, js, cfg.Prefix, wire.Segment, "later")
	if err != nil {
		t.Fatal(err)
	}
	nctx, ncancel := context.WithTimeout(ctx, 500*time.Millisecond)
	defer ncancel()
	if ids, err := c.Next(nctx); err == nil {
		t.Fatalf("a bulk job took %d IDs of the monotonic tag: %v", len(ids), ids)
	}
	if n := stored(); n != 0 {
		t.Fatalf("the pool stream holds %d batches of the monotonic tag after a wait", n)
	}
}
