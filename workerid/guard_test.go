package workerid

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/leafbus/leafbus/client"
	"github.com/leafbus/leafbus/internal/testutil"
	"github.com/leafbus/leafbus/snowflake"
	"github.com/leafbus/leafbus/wire"
)

var t0 = time.Date(2026, 3, 4, 5, 6, 7, 0, time.UTC)

const t0ms = int64(1772600767000) // t0 in Unix ms

func TestGuardStartRecords(t *testing.T) {
	if t0.UnixMilli() != t0ms {
		t.Fatalf("t0ms = %d, want %d", t0ms, t0.UnixMilli())
	}
	env := startJS(t)
	forever := openForever(t, env.js)
	const margin = 4000 // HeartbeatInterval 3s + BorrowMax 1s
	tests := []struct {
		name         string
		kv, cache    int64 // records, 0: none
		recorded     int64
		ttl          time.Duration
		clockWaitMax time.Duration
		wantErr      error
		wantMsg      []string
		wantFloor    int64
	}{
		{name: "OK/no record", wantFloor: 0},
		{name: "OK/waits past the floor", kv: t0ms - 500, wantFloor: t0ms - 500 + margin},
		{name: "OK/highest record wins", kv: t0ms - 5000, cache: t0ms - 1000, recorded: t0ms - 3000, wantFloor: t0ms - 1000 + margin},
		{name: "OK/previous holder's record", recorded: t0ms - 200, ttl: 30 * time.Second, wantFloor: t0ms - 200 + margin},
		{name: "OK/clock behind within ClockWaitMax", kv: t0ms + 3000, clockWaitMax: 5 * time.Second, wantFloor: t0ms + 3000 + margin},
		// A clean stop records borrowed timestamps, up to BorrowMax ahead of the clock.
		{name: "OK/own record ahead by borrowed time", kv: t0ms + 800, wantFloor: t0ms + 800 + margin},
		// A previous holder's clock may also be PeerSkewMax ahead of ours.
		{name: "OK/previous holder ahead within skew", recorded: t0ms + 5500, ttl: 30 * time.Second, wantFloor: t0ms + 5500 + margin},
		{name: "ErrClockBehindRecord/KV", kv: t0ms + 3000, wantErr: ErrClockBehindRecord,
			wantMsg: []string{"2026-03-04T05:06:07.000Z", "2026-03-04T05:06:10.000Z", "3s behind", "KV leaf_forever/", "allowed 1s"}},
		{name: "ErrClockBehindRecord/cache", kv: t0ms - 9000, cache: t0ms + 1500, wantErr: ErrClockBehindRecord,
			wantMsg: []string{"2026-03-04T05:06:08.500Z", "1.5s behind", "cache file"}},
		{name: "ErrClockBehindRecord/registry", recorded: t0ms + 60_000, ttl: 30 * time.Second, wantErr: ErrClockBehindRecord,
			wantMsg: []string{"1m0s behind", "registry's record for worker ID 7", "peer-skew-max 5s"}},
		{name: "ErrClockBehindRecord/beyond ClockWaitMax", kv: t0ms + 3000, clockWaitMax: 1500 * time.Millisecond, wantErr: ErrClockBehindRecord,
			wantMsg: []string{"clock-wait-max 1.5s", "allowed 2.5s"}},
		// A lower own record still refuses even when a previous holder's is higher and allowed.
		{name: "ErrClockBehindRecord/own record among others", cache: t0ms + 2000, recorded: t0ms + 4000, ttl: 30 * time.Second,
			wantErr: ErrClockBehindRecord, wantMsg: []string{"cache file"}},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := testutil.Context(t, 10*time.Second)
			node := fmt.Sprintf("node%d", i)
			if tt.kv != 0 {
				must(t, "Put", forever.Put(ctx, node, Record{WorkerID: 7, Timestamp: tt.kv}))
				// Another case's node record of worker ID 7 would set this one's floor.
				t.Cleanup(func() { _ = forever.kv.Delete(context.Background(), node) })
			}
			cache := &CacheFile{Path: filepath.Join(t.TempDir(), "workerid.json")}
			if tt.cache != 0 {
				must(t, "Save", cache.Save(cacheEntry{NodeID: node, WorkerID: 7, Timestamp: tt.cache}))
			}
			clock := snowflake.NewFakeClock(t0)
			g, err := newGuard(guardConfig(func(c *GuardConfig) {
				c.NodeID = node
				c.Forever = forever
				c.Cache = cache
				c.Clock = clock
				c.ClockWaitMax = tt.clockWaitMax
				c.Logger = testutil.Logger(t)
			}))
			must(t, "newGuard", err)
			floor, err := g.Start(ctx, &fakeLease{id: 7, ttl: tt.ttl, recorded: tt.recorded})
			if tt.wantErr != nil {
				wantErrIs(t, "Start", err, tt.wantErr)
				for _, s := range tt.wantMsg {
					if !strings.Contains(err.Error(), s) {
						t.Errorf("Start error %q does not name %q", err, s)
					}
				}
				return
			}
			must(t, "Start", err)
			if floor != tt.wantFloor {
				t.Fatalf("floor = %s, want %s", fmtMs(floor), fmtMs(tt.wantFloor))
			}
			now := clock.Now().UnixMilli()
			if floor > 0 && now <= floor {
				t.Fatalf("Start returned at %s, not past the floor %s", fmtMs(now), fmtMs(floor))
			}
			if floor == 0 && clock.Slept() != 0 {
				t.Fatalf("Start slept %s without a record", clock.Slept())
			}
		})
	}
}

// Leaf hole: when ZooKeeper is unreachable Leaf starts from its cache file and skips the
// check of the clock against the recorded time. Here the forever bucket being down must
// not weaken the check: the cache file's record still refuses a clock set back.
func TestGuardKVUnreachableUsesCacheFile(t *testing.T) {
	env := startJS(t)
	ctx := testutil.Context(t, 20*time.Second)
	forever := openForever(t, env.js)
	must(t, "Put", forever.Put(ctx, "n1", Record{WorkerID: 1, Timestamp: t0ms - 60_000}))
	dir := t.TempDir()
	ahead := &CacheFile{Path: filepath.Join(dir, "ahead.json")}
	must(t, "Save", ahead.Save(cacheEntry{NodeID: "n1", WorkerID: 1, Timestamp: t0ms + 2000}))
	behind := &CacheFile{Path: filepath.Join(dir, "behind.json")}
	must(t, "Save", behind.Save(cacheEntry{NodeID: "n1", WorkerID: 1, Timestamp: t0ms - 1000}))
	missing := &CacheFile{Path: filepath.Join(dir, "missing.json")}
	env.srv.Stop()

	start := func(cache *CacheFile, lease Lease) (int64, error) {
		g, err := newGuard(guardConfig(func(c *GuardConfig) {
			c.NodeID = "n1"
			c.Forever = forever
			c.Cache = cache
			c.Clock = snowflake.NewFakeClock(t0)
			c.ReadTimeout = 300 * time.Millisecond
			c.Logger = testutil.Logger(t)
		}))
		must(t, "newGuard", err)
		return g.Start(ctx, lease)
	}
	permanent := &fakeLease{id: 1}

	_, err := start(ahead, permanent)
	wantErrIs(t, "Start with KV down and the cache file ahead", err, ErrClockBehindRecord)
	if !strings.Contains(err.Error(), "cache file") {
		t.Fatalf("error %q should say the record came from the cache file", err)
	}

	floor, err := start(behind, permanent)
	must(t, "Start with KV down and the cache file behind", err)
	if floor != t0ms-1000+4000 {
		t.Fatalf("floor = %s, want the cache record + 4s", fmtMs(floor))
	}

	_, err = start(missing, permanent)
	wantErrIs(t, "Start with KV down, no cache file, permanent ID", err, ErrRecordUnavailable)

	// An expiring lease carries its own record of the ID's timestamps.
	floor, err = start(missing, &fakeLease{id: 1, ttl: 30 * time.Second, recorded: t0ms - 2000})
	must(t, "Start with KV down, no cache file, leased ID", err)
	if floor != t0ms-2000+4000 {
		t.Fatalf("floor = %s, want the lease's record + 4s", fmtMs(floor))
	}
}

func TestGuardPeerCheck(t *testing.T) {
	env := startJS(t)
	// peer runs what a dispenser answers the check with: its clock on leaf.time, and its
	// node ID in $SRV.INFO.leaf (unless inInfo is false: a responder that is not a
	// dispenser of this service).
	peer := func(node string, clock snowflake.Clock, inInfo bool) {
		t.Helper()
		nc := env.srv.Connect(t)
		r, err := NewTimeResponder(nc, "leaf", node, clock, testutil.Logger(t))
		must(t, "NewTimeResponder", err)
		must(t, "Start", r.Start())
		t.Cleanup(r.Stop)
		if inInfo {
			svc, err := micro.AddService(nc, micro.Config{Name: "leaf", Version: "1.0.0", Metadata: map[string]string{"node_id": node}})
			must(t, "AddService", err)
			t.Cleanup(func() { svc.Stop() })
			must(t, "Flush", nc.Flush())
		}
	}
	var logs testutil.SyncBuffer
	start := func(node string, clock snowflake.Clock, forever *Forever) error {
		t.Helper()
		g, err := newGuard(guardConfig(func(c *GuardConfig) {
			c.NodeID = node
			c.Conn = env.nc
			c.Clock = clock
			c.Forever = forever
			c.Logger = slog.New(slog.NewTextHandler(io.MultiWriter(&logs, testutil.LogWriter(t)), nil))
		}))
		must(t, "newGuard", err)
		_, err = g.Start(testutil.Context(t, 10*time.Second), &fakeLease{id: 1})
		return err
	}
	real := snowflake.SystemClock()
	hourOff := testutil.OffsetClock{Offset: time.Hour}

	must(t, "Start with no peers", start("first", real, nil))

	peer("p1", real, true)
	peer("p2", real, true)
	err := start("skewed", testutil.OffsetClock{Offset: 10 * time.Second}, nil)
	wantErrIs(t, "Start with a clock 10s ahead of two peers", err, ErrPeerSkew)
	for _, s := range []string{"median of 2 peers", "2 of them read more than peer-skew-max 5s behind it"} {
		if !strings.Contains(err.Error(), s) {
			t.Errorf("error %q does not name %q", err, s)
		}
	}
	must(t, "Start with a clock in line with the peers", start("fine", real, nil))

	// The node's own responder (here with a wild clock) must not count as a peer.
	peer("self", hourOff, true)
	must(t, "Start with the node's own responder an hour off", start("self", real, nil))

	// A responder an hour off that is not a dispenser of this service is no peer, and
	// one that is, among peers that agree, is a minority the median ignores.
	peer("rogue", hourOff, false)
	must(t, "Start beside a leaf.time responder an hour off that $SRV.INFO does not name", start("fresh1", real, nil))
	peer("p3", hourOff, true)
	must(t, "Start beside one peer of three an hour off", start("fresh2", real, nil))
	if !strings.Contains(logs.String(), "a minority of the peers' clocks disagree") {
		t.Errorf("no warning about the minority an hour off in:\n%s", logs.String())
	}

	// Twice as many answers an hour off as an ask keeps, from node IDs $SRV.INFO does
	// not name, cost nothing, and do not hide the answer of a dispenser that comes after
	// them (on their connection, so always after them): it is one of five peers.
	flood := env.srv.Connect(t)
	svc, err := micro.AddService(flood, micro.Config{Name: "leaf", Version: "1.0.0", Metadata: map[string]string{"node_id": "late"}})
	must(t, "AddService", err)
	t.Cleanup(func() { svc.Stop() })
	sub, err := flood.Subscribe("leaf.time", func(m *nats.Msg) {
		body := []byte(strconv.FormatInt(time.Now().Add(time.Hour).UnixMilli(), 10))
		for i := range 2 * client.DefaultAskMaxAnswers {
			reply := nats.NewMsg(m.Reply)
			reply.Header.Set(wire.NodeIDHeader, fmt.Sprintf("fake-%d", i))
			reply.Data = body
			_ = flood.PublishMsg(reply)
		}
		reply := nats.NewMsg(m.Reply)
		reply.Header.Set(wire.NodeIDHeader, "late")
		reply.Data = []byte(strconv.FormatInt(time.Now().UnixMilli(), 10))
		_ = flood.PublishMsg(reply)
	})
	must(t, "Subscribe", err)
	t.Cleanup(func() { sub.Unsubscribe() })
	must(t, "Flush", flood.Flush())
	must(t, "Start beside a flood of fake leaf.time answers an hour off", start("fresh3", real, nil))
	if want := `msg="peer time check passed" node_id=fresh3 worker_id=1 peers=5 `; !strings.Contains(logs.String(), want) {
		t.Errorf("no %q (p1, p2, late in line; self, p3 an hour off) in:\n%s", want, logs.String())
	}

	// A node with a record of its own is checked against that record, not the peers.
	forever := openForever(t, env.js)
	must(t, "Put", forever.Put(testutil.Context(t, 5*time.Second), "known", Record{WorkerID: 1, Timestamp: time.Now().UnixMilli() - 60_000}))
	must(t, "Start of a known node 10s ahead", start("known", testutil.OffsetClock{Offset: 10 * time.Second}, forever))
}

func TestSkewVerdict(t *testing.T) {
	s := time.Second
	tests := []struct {
		name    string
		offsets []time.Duration
		want    verdict
	}{
		{"OK/one peer in line", []time.Duration{s}, verdict{median: s}},
		{"OK/one of three an hour off", []time.Duration{0, time.Hour, s}, verdict{median: s, ahead: 1}},
		{"OK/two peers split", []time.Duration{0, 12 * s}, verdict{median: 6 * s, ahead: 1}},
		{"OK/both sides", []time.Duration{-time.Hour, 0, time.Hour}, verdict{ahead: 1, behind: 1}},
		{"Refuse/one peer off", []time.Duration{-10 * s}, verdict{median: -10 * s, behind: 1, refuse: true}},
		{"Refuse/two of three ahead", []time.Duration{6 * s, 0, 8 * s}, verdict{median: 6 * s, ahead: 2, refuse: true}},
		{"Refuse/all behind", []time.Duration{-6 * s, -7 * s, -8 * s, -9 * s}, verdict{median: -7500 * time.Millisecond, behind: 4, refuse: true}},
		{"OK/half of four behind", []time.Duration{-6 * s, -7 * s, 0, 0}, verdict{median: -3 * s, behind: 2}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := skewVerdict(tt.offsets, 5*s); got != tt.want {
				t.Errorf("skewVerdict(%v, 5s) = %+v, want %+v", tt.offsets, got, tt.want)
			}
		})
	}
}

// guardConfig is the default clock guard configuration, changed by edit.
func guardConfig(edit func(*GuardConfig)) GuardConfig {
	cfg := DefaultGuardConfig()
	edit(&cfg)
	return cfg
}

func TestGuardConfigValidate(t *testing.T) {
	tests := []struct {
		name    string
		edit    func(*GuardConfig)
		wantErr error
		wantMsg string
	}{
		{"OK", func(*GuardConfig) {}, nil, ""},
		{"OK/ClockWaitMax 0", func(c *GuardConfig) { c.ClockWaitMax = 0 }, nil, ""},
		{"ErrInvalidNodeID", func(c *GuardConfig) { c.NodeID = "" }, ErrInvalidNodeID, "NodeID"},
		{"ErrInvalidConfig/ClockWaitMax", func(c *GuardConfig) { c.ClockWaitMax = -time.Second }, ErrInvalidConfig, "ClockWaitMax is -1s, want >= 0"},
		{"ErrInvalidConfig/BorrowMax", func(c *GuardConfig) { c.BorrowMax = -time.Second }, ErrInvalidConfig, "BorrowMax is -1s, want > 0"},
		{"ErrInvalidConfig/zero PeerWindow", func(c *GuardConfig) { c.PeerWindow = 0 }, ErrInvalidConfig, "PeerWindow is 0s, want > 0"},
		{"ErrInvalidConfig/zero ReadTimeout", func(c *GuardConfig) { c.ReadTimeout = 0 }, ErrInvalidConfig, "ReadTimeout is 0s"},
		{"ErrInvalidConfig/no clock", func(c *GuardConfig) { c.Clock = nil }, ErrInvalidConfig, "Clock is nil"},
		{"ErrInvalidConfig/no prefix", func(c *GuardConfig) { c.Prefix = "" }, ErrInvalidConfig, "Prefix is empty"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := guardConfig(func(c *GuardConfig) {
				c.NodeID = "n"
				tt.edit(c)
			}).Validate()
			if tt.wantErr == nil {
				must(t, "Validate", err)
				return
			}
			wantErrIs(t, "Validate", err, tt.wantErr)
			if !strings.Contains(err.Error(), tt.wantMsg) {
				t.Errorf("Validate() = %q, want it to name %q", err, tt.wantMsg)
			}
		})
	}
}

// Start's waits end with its context, so a dispenser told to stop while waiting out a
// record does not hang.
func TestGuardStartWaitEndsWithContext(t *testing.T) {
	cache := &CacheFile{Path: filepath.Join(t.TempDir(), "workerid.json")}
	must(t, "Save", cache.Save(cacheEntry{NodeID: "n1", WorkerID: 1, Timestamp: time.Now().UnixMilli() + 30_000}))
	g, err := newGuard(guardConfig(func(c *GuardConfig) {
		c.NodeID = "n1"
		c.Cache = cache
		c.ClockWaitMax = time.Hour
		c.Logger = testutil.Logger(t)
	}))
	must(t, "newGuard", err)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	done := make(chan error, 1)
	go func() {
		_, err := g.Start(ctx, &fakeLease{id: 1})
		done <- err
	}()
	select {
	case err := <-done:
		wantErrIs(t, "Start", err, context.DeadlineExceeded)
	case <-time.After(5 * time.Second):
		t.Fatal("Start kept waiting after its context ended")
	}
}
