package dispenser

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/leafbus/leafbus/client"
	"github.com/leafbus/leafbus/internal/testutil"
	"github.com/leafbus/leafbus/segment"
	"github.com/leafbus/leafbus/testenv"
	"github.com/leafbus/leafbus/wire"
	"github.com/leafbus/leafbus/workerid"
)

func TestConfigWorkerRange(t *testing.T) {
	tests := []struct {
		name     string
		edit     func(*Config)
		wantMsgs []string
	}{
		{"OK/default", func(c *Config) {}, nil},
		{"OK/upper half", func(c *Config) { c.WorkerIDMin, c.WorkerIDMax = 512, 1023 }, nil},
		{"OK/static in range", func(c *Config) {
			c.WorkerRegistry, c.WorkerID, c.WorkerIDMin, c.WorkerIDMax = "static", 600, 512, 1023
		}, nil},
		{"Error/min above max", func(c *Config) { c.WorkerIDMin, c.WorkerIDMax = 600, 500 },
			[]string{"--worker-id-min 600 is above --worker-id-max 500"}},
		{"Error/negative min", func(c *Config) { c.WorkerIDMin = -1 }, []string{"--worker-id-min -1: want 0 to 1023"}},
		{"Error/max beyond the layout", func(c *Config) { c.WorkerIDMax = 1024 },
			[]string{"--worker-id-max 1024: want 0 to 1023 (the layout's highest worker ID)"}},
		{"Error/static outside", func(c *Config) {
			c.WorkerRegistry, c.WorkerID, c.WorkerIDMin, c.WorkerIDMax = "static", 3, 512, 1023
		}, []string{"--worker-id 3 is outside --worker-id-min 512 .. --worker-id-max 1023"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := testConfig(t)
			tt.edit(&cfg)
			err := cfg.Validate()
			if len(tt.wantMsgs) == 0 {
				testutil.CheckErr(t, "Validate", err, nil, "")
			}
			for _, msg := range tt.wantMsgs {
				testutil.CheckErr(t, "Validate", err, nil, msg)
			}
		})
	}
}

// datacenter is one deployment of the multi-datacenter tests: its NATS and dispensers.
type datacenter struct {
	name       string
	rng        workerid.Range
	urls       []string // one per dispenser
	dispensers []*Dispenser
	logs       []*testutil.SyncBuffer
}

// withPeerCheck makes the peer range check run every every and log one peer's conflict
// again after warnEvery.
func withPeerCheck(every, warnEvery time.Duration) Option {
	return func(o *options) error {
		o.peerCheckEvery, o.peerWarnEvery = every, warnEvery
		return nil
	}
}

// start starts one dispenser per URL of dc, each with node ID <dc>-<i> and dc's range,
// edited by edit, runs them, and waits until they serve. Their logs go to dc.logs and
// t.Log.
func (dc *datacenter) start(t *testing.T, edit func(*Config), opts ...Option) {
	t.Helper()
	for i, url := range dc.urls {
		cfg := testConfig(t)
		cfg.NATS, cfg.NodeID = url, fmt.Sprintf("%s-%d", dc.name, i)
		cfg.WorkerIDMin, cfg.WorkerIDMax = dc.rng.Min, dc.rng.Max
		edit(&cfg)
		var buf testutil.SyncBuffer
		logger := slog.New(slog.NewTextHandler(io.MultiWriter(&buf, testutil.LogWriter(t)), &slog.HandlerOptions{Level: slog.LevelInfo}))
		d, err := newTest(t, cfg, append([]Option{WithLogger(logger)}, opts...)...)
		if err != nil {
			t.Fatalf("New(%s): %v", cfg.NodeID, err)
		}
		t.Cleanup(testutil.Run(t, "Run of "+cfg.NodeID, d.Run))
		select {
		case <-d.Ready():
		case <-time.After(30 * time.Second):
			t.Fatalf("%s not ready within 30s", cfg.NodeID)
		}
		dc.dispensers, dc.logs = append(dc.dispensers, d), append(dc.logs, &buf)
	}
}

// datacenterLoad is what the load of TestSeveralDatacenters took from one datacenter:
// the IDs, and how many requests were answered 503 and asked again.
type datacenterLoad struct {
	snowflakes, segments []int64
	unavailable          atomic.Int64
}

// loadDatacenter asks dc's dispensers for n snowflake and n segment IDs of tag, in
// batches of batch from workers goroutines per kind, through one client on nc. A 503 (a
// dispenser that cannot be sure right now: a late heartbeat on a starved CPU, a segment
// still loading) is asked again; any other error ends the load.
func loadDatacenter(nc *nats.Conn, tag string, n, batch, workers int) (*datacenterLoad, error) {
	c, err := client.NewClient(nc, client.WithTimeout(20*time.Second))
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var (
		mu       sync.Mutex
		out      datacenterLoad
		requests [2]atomic.Int64 // per kind
		wg       sync.WaitGroup
		errs     = make(chan error, 2*workers)
	)
	for w := range 2 * workers {
		kind, dst := wire.Snowflake, &out.snowflakes
		if w%2 == 1 {
			kind, dst = wire.Segment, &out.segments
		}
		wg.Go(func() {
			buf := make([]int64, batch)
			for requests[w%2].Add(1) <= int64(n/batch) {
				err := c.Fill(ctx, kind, tag, buf)
				for errors.Is(err, wire.ErrUnavailable) && ctx.Err() == nil {
					out.unavailable.Add(1)
					time.Sleep(10 * time.Millisecond)
					err = c.Fill(ctx, kind, tag, buf)
				}
				if err != nil {
					errs <- fmt.Errorf("%s %s: %w", kind, tag, err)
					return
				}
				mu.Lock()
				*dst = append(*dst, buf...)
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	close(errs)
	return &out, errors.Join(slices.Collect(chanValues(errs))...)
}

// chanValues yields what ch holds until it is closed.
func chanValues[T any](ch <-chan T) func(yield func(T) bool) {
	return func(yield func(T) bool) {
		for v := range ch {
			if !yield(v) {
				return
			}
		}
	}
}

// TestSeveralDatacenters: two datacenters, each its own 3-node NATS cluster with two
// dispensers and a KV worker-ID registry of its own (they cannot see each other), with
// ranges 0..511 and 512..1023, share one MariaDB for segments (Leaf's way: one MySQL
// primary). Clients in both take millions of snowflake and segment IDs of one tag at the
// same time; no ID repeats across both, and every snowflake ID carries a worker ID of its
// own datacenter's range.
func TestSeveralDatacenters(t *testing.T) {
	const (
		perKind = 1_000_000 // IDs of each kind per datacenter: 4 million in all
		batch   = 10_000
		workers = 2 // per kind and datacenter
		tag     = "orders"
	)
	dsn := testenv.MariaDB(t).NewDatabase(t)
	dcs := []*datacenter{{name: "dc1", rng: workerid.Range{Min: 0, Max: 511}}, {name: "dc2", rng: workerid.Range{Min: 512, Max: 1023}}}
	var conns []*nats.Conn
	for _, dc := range dcs {
		cluster := testenv.StartNATSCluster(t, 3)
		dc.urls = []string{cluster.Nodes[0].URL(), cluster.Nodes[1].URL()}
		dc.start(t, func(c *Config) {
			c.SegmentStore, c.MySQLDSN, c.MySQLCreateTable = "mysql", dsn, true
		}, WithTags(segment.Tag{Name: tag, Step: 50_000, MaxID: 1}))
		conns = append(conns, cluster.Nodes[2].Connect(t))
	}
	for _, dc := range dcs {
		for _, d := range dc.dispensers {
			if id := d.snowflakes.WorkerID(); !dc.rng.Contains(id) {
				t.Fatalf("%s: dispenser %s has worker ID %d, outside %s", dc.name, d.cfg.NodeID, id, dc.rng)
			}
		}
	}

	start := time.Now()
	loads := make([]*datacenterLoad, len(dcs))
	errs := make([]error, len(dcs))
	var wg sync.WaitGroup
	for i := range dcs {
		wg.Go(func() { loads[i], errs[i] = loadDatacenter(conns[i], tag, perKind, batch, workers) })
	}
	wg.Wait()
	elapsed := time.Since(start)
	if err := errors.Join(errs...); err != nil {
		t.Fatalf("load: %v", err)
	}

	layout := dcs[0].dispensers[0].cfg.Layout()
	var all []int64
	var unavailable int64
	for i, l := range loads {
		unavailable += l.unavailable.Load()
		workers := map[int64]int{}
		for _, id := range l.snowflakes {
			dec, err := layout.Decode(id)
			if err != nil || !dcs[i].rng.Contains(dec.WorkerID) {
				t.Fatalf("%s: snowflake ID %d decodes to worker ID %d (%v), outside %s", dcs[i].name, id, dec.WorkerID, err, dcs[i].rng)
			}
			workers[dec.WorkerID]++
		}
		t.Logf("%s (%s): snowflake IDs per worker ID %v", dcs[i].name, dcs[i].rng, workers)
		if len(l.snowflakes) < perKind || len(l.segments) < perKind {
			t.Fatalf("%s: %d snowflake and %d segment IDs, want %d of each", dcs[i].name, len(l.snowflakes), len(l.segments), perKind)
		}
		all = append(append(all, l.snowflakes...), l.segments...)
	}
	wantUnique(t, all)
	t.Logf("%d IDs (%d per kind and datacenter, batches of %d) from 2 datacenters x 2 dispensers in %v, no duplicate; %d requests answered 503 and asked again",
		len(all), perKind, batch, elapsed.Round(time.Millisecond), unavailable)
}

// wantUnique fails t when any ID appears twice.
func wantUnique(t *testing.T, ids []int64) {
	t.Helper()
	slices.Sort(ids)
	for i := 1; i < len(ids); i++ {
		if ids[i] == ids[i-1] {
			t.Fatalf("ID %d handed out twice (of %d IDs)", ids[i], len(ids))
		}
	}
}

// TestPeerRangeWarning: two deployments on one NATS (as a supercluster's gateways would
// show them to each other): dc1 with two dispensers on 0..511 and dc2 with one on
// 512..1023 are at peace; dc3's 256..767 overlaps both, and every side warns, once per
// thing it says however often it checks: dc3 in one line for both of dc1's dispensers
// (the same overlap) and one for dc2's. $SRV.INFO and $SRV.STATS show each node's range.
func TestPeerRangeWarning(t *testing.T) {
	srv := testenv.StartNATS(t)
	url := srv.URL()
	dc1 := &datacenter{name: "dc1", rng: workerid.Range{Min: 0, Max: 511}, urls: []string{url, url}}
	dc2 := &datacenter{name: "dc2", rng: workerid.Range{Min: 512, Max: 1023}, urls: []string{url}}
	dc3 := &datacenter{name: "dc3", rng: workerid.Range{Min: 256, Max: 767}, urls: []string{url}}
	check := withPeerCheck(100*time.Millisecond, time.Hour)
	for _, dc := range []*datacenter{dc1, dc2, dc3} {
		dc.start(t, func(*Config) {}, check)
	}
	overlapping := dc3.logs[0]
	for _, peer := range []string{"dc1-0", "dc1-1", "dc2-0"} {
		waitWarning(t, overlapping, "dc3-0", peer, dc3.rng)
	}
	waitWarning(t, dc1.logs[0], "dc1-0", "dc3-0", dc1.rng)
	waitWarning(t, dc1.logs[1], "dc1-1", "dc3-0", dc1.rng)
	waitWarning(t, dc2.logs[0], "dc2-0", "dc3-0", dc2.rng)
	// Five more checks on every dispenser: still one line per reason.
	all := append(append(slices.Clone(dc1.dispensers), dc2.dispensers...), dc3.dispensers...)
	waitPeerChecks(t, all, 5)
	for name, log := range map[string]*testutil.SyncBuffer{"dc1-0": dc1.logs[0], "dc1-1": dc1.logs[1], "dc2-0": dc2.logs[0], "dc3-0": dc3.logs[0]} {
		lines := warnings(log)
		want := 1
		if name == "dc3-0" {
			want = 2
		}
		if len(lines) != want {
			t.Errorf("%s logged %d range warnings, want %d (one per reason):\n%s", name, len(lines), want, strings.Join(lines, "\n"))
		}
	}

	nc := srv.Connect(t)
	wantRangeInDiscovery(t, nc, dc1.dispensers[0], 1)
	wantRangeInDiscovery(t, nc, dc2.dispensers[0], 1)
	wantRangeInDiscovery(t, nc, dc3.dispensers[0], 3)
}

// waitPeerChecks waits until each of ds has run n more peer range checks than now.
func waitPeerChecks(t *testing.T, ds []*Dispenser, n int64) {
	t.Helper()
	want := make([]int64, len(ds))
	for i, d := range ds {
		want[i] = d.heartbeat.PeerChecks() + n
	}
	testutil.Eventually(t, 10*time.Second, fmt.Sprintf("%d more peer checks on each dispenser", n), func() bool {
		for i, d := range ds {
			if d.heartbeat.PeerChecks() < want[i] {
				return false
			}
		}
		return true
	})
}

// waitWarning waits until node's log warns about peer, naming node's range mine.
func waitWarning(t *testing.T, log *testutil.SyncBuffer, node, peer string, mine workerid.Range) {
	t.Helper()
	testutil.Eventually(t, 10*time.Second, node+"'s range warning about "+peer, func() bool {
		for _, l := range warnings(log) {
			_, nodes, _ := strings.Cut(l, " peer_nodes=")
			nodes, _, _ = strings.Cut(nodes, " ")
			if slices.Contains(strings.Split(nodes, ","), peer) && strings.Contains(l, " range="+mine.String()) {
				return true
			}
		}
		return false
	})
}

// warnings returns log's range warnings.
func warnings(log *testutil.SyncBuffer) []string {
	var out []string
	for l := range strings.SplitSeq(log.String(), "\n") {
		if strings.Contains(l, "worker-ID range conflicts") {
			out = append(out, l)
		}
	}
	return out
}

// wantRangeInDiscovery checks d's $SRV.INFO metadata and its snowflake endpoint's
// $SRV.STATS: its worker ID, its range, and conflicts conflicting peers.
func wantRangeInDiscovery(t *testing.T, nc *nats.Conn, d *Dispenser, conflicts int64) {
	t.Helper()
	id := d.svc.Info().ID
	var info micro.Info
	requestJSON(t, nc, micro.InfoVerb, id, &info)
	want := map[string]string{
		"worker_id":     fmt.Sprint(d.snowflakes.WorkerID()),
		"worker_id_min": fmt.Sprint(d.cfg.WorkerIDMin),
		"worker_id_max": fmt.Sprint(d.cfg.WorkerIDMax),
		"node_id":       d.cfg.NodeID,
	}
	for k, v := range want {
		if info.Metadata[k] != v {
			t.Errorf("%s: $SRV.INFO metadata %s = %q, want %q (all: %v)", d.cfg.NodeID, k, info.Metadata[k], v, info.Metadata)
		}
	}
	// The conflicts are those of the last check: poll, a check may be under way.
	deadline := time.Now().Add(10 * time.Second)
	for {
		wrong := snowflakeRangeStats(t, nc, d, id, conflicts)
		if wrong == "" {
			return
		}
		if time.Now().After(deadline) {
			t.Errorf("after 10s: %s", wrong)
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// snowflakeRangeStats checks d's snowflake endpoint's $SRV.STATS once: "" when it shows
// d's worker ID and range and conflicts conflicting peers, else what it shows.
func snowflakeRangeStats(t *testing.T, nc *nats.Conn, d *Dispenser, id string, conflicts int64) string {
	t.Helper()
	var stats micro.Stats
	requestJSON(t, nc, micro.StatsVerb, id, &stats)
	for _, e := range stats.Endpoints {
		if e.Name != "snowflake" {
			continue
		}
		var stats struct {
			Source struct { // the dispenser's part of the endpoint's data
				WorkerID  int64 `json:"worker_id"`
				Min       int64 `json:"worker_id_min"`
				Max       int64 `json:"worker_id_max"`
				Conflicts int64 `json:"worker_id_conflicts"`
			} `json:"source"`
		}
		if err := json.Unmarshal(e.Data, &stats); err != nil {
			t.Fatalf("%s: snowflake stats %s: %v", d.cfg.NodeID, e.Data, err)
		}
		data := stats.Source
		if data.WorkerID != d.snowflakes.WorkerID() || data.Min != d.cfg.WorkerIDMin || data.Max != d.cfg.WorkerIDMax || data.Conflicts != conflicts {
			return fmt.Sprintf("%s: $SRV.STATS snowflake data %+v, want worker ID %d, range %d..%d, %d conflicts",
				d.cfg.NodeID, data, d.snowflakes.WorkerID(), d.cfg.WorkerIDMin, d.cfg.WorkerIDMax, conflicts)
		}
		return ""
	}
	return d.cfg.NodeID + ": $SRV.STATS has no snowflake endpoint"
}

// requestJSON asks the service instance id for verb and decodes the answer into out.
func requestJSON(t *testing.T, nc *nats.Conn, verb micro.Verb, id string, out any) {
	t.Helper()
	subject, err := micro.ControlSubject(verb, wire.DefaultPrefix, id)
	if err != nil {
		t.Fatal(err)
	}
	m, err := nc.Request(subject, nil, 5*time.Second)
	if err != nil {
		t.Fatalf("%s: %v", subject, err)
	}
	if err := json.Unmarshal(m.Data, out); err != nil {
		t.Fatalf("%s answered %s: %v", subject, m.Data, err)
	}
}

// TestPeerRangeCheckRefused: where the dispenser's user may not ask $SRV.INFO, the
// check says so once and turns itself off instead of provoking the server's refusal at
// every check, and the dispenser serves on.
func TestPeerRangeCheckRefused(t *testing.T) {
	var buf testutil.SyncBuffer
	logger := slog.New(slog.NewTextHandler(io.MultiWriter(&buf, testutil.LogWriter(t)), &slog.HandlerOptions{Level: slog.LevelInfo}))
	d, err := newTest(t, noDiscoveryConfig(t), WithLogger(logger), withPeerCheck(50*time.Millisecond, time.Hour))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	runReady(t, d)
	buf.WaitLine(t, 10*time.Second, "peer range check off")
	buf.WaitLine(t, 10*time.Second, "mixed fleet check off")
	// The start's snowflake layout check, its peer clock check (which asks $SRV.INFO for
	// the peers' node IDs), the deployment record's look for a live fleet (no record
	// yet), the mixed fleet check (mixed_fleet.go, once) and the range check's first try
	// each provoke one refusal; after that, none: the range check stopped before its
	// first look.
	before := strings.Count(buf.String(), "NATS asynchronous error")
	checks := d.heartbeat.PeerChecks()
	// A round trip on the dispenser's connection: an asynchronous error the server sent
	// before it has been logged when it returns.
	if err := d.nc.Flush(); err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(buf.String(), "NATS asynchronous error"); n != before || n > 5 {
		t.Errorf("%d asynchronous errors logged (%d when the check turned off), want at most the start's three, the mixed fleet check's and the first range check's, and no more:\n%s", n, before, buf.String())
	}
	if checks != 0 {
		t.Errorf("%d peer range checks ran, want none: the refusal turned the check off before its first look", checks)
	}
	if n := strings.Count(buf.String(), "peer range check off"); n != 1 {
		t.Errorf("%d \"peer range check off\" lines, want 1", n)
	}
}
