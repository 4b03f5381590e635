package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/leafbus/leafbus/testenv"
	"github.com/leafbus/leafbus/wire"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
)

// fakeDispenser speaks the wire protocol from one counter, so that every count the bench
// reports can be checked exactly. It can plant faults at given reply numbers (1-based,
// over every request it receives; 0 never): a reply that repeats the previous reply's
// last ID, an error code, IDs out of order, and a request left unanswered.
type fakeDispenser struct {
	faults

	mu      sync.Mutex
	next    uint64
	replies int
	perTag  map[string]int
	lastID  map[string]uint64 // per tag, the last ID replied
	// duplicated is set once the planted duplicate went out.
	duplicated bool
}

// faults are the reply numbers at which a fakeDispenser misbehaves.
type faults struct {
	dupAt, errAt, disorderAt, dropAt int
}

// startFake subscribes a fake to leaf.<kind>.* on its own connection, in the queue group
// a dispenser uses. A subscription's callback runs serially, so replies leave in order.
func startFake(tb testing.TB, n *testenv.NATS, fl faults) *fakeDispenser {
	tb.Helper()
	return serveFake(tb, n.Connect(tb), fl)
}

// serveFake is startFake on a connection of the caller's.
func serveFake(tb testing.TB, nc *nats.Conn, fl faults) *fakeDispenser {
	tb.Helper()
	f := &fakeDispenser{faults: fl, next: 1000, perTag: map[string]int{}, lastID: map[string]uint64{}}
	if _, err := nc.QueueSubscribe("leaf.*.*", "leaf", f.serve); err != nil {
		tb.Fatalf("fake dispenser: subscribe: %v", err)
	}
	if err := nc.Flush(); err != nil {
		tb.Fatalf("fake dispenser: flush: %v", err)
	}
	return f
}

func (f *fakeDispenser) serve(m *nats.Msg) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.replies++
	k := f.replies
	tag := m.Subject[strings.LastIndexByte(m.Subject, '.')+1:]
	f.perTag[tag]++
	count := 1
	if body := strings.TrimSpace(string(m.Data)); body != "" {
		count, _ = strconv.Atoi(body)
	}
	switch k {
	case f.dropAt:
		return
	case f.errAt:
		m.RespondMsg(&nats.Msg{Header: nats.Header{
			micro.ErrorCodeHeader: {"503"}, micro.ErrorHeader: {"planted error"}}})
		return
	}
	start := f.next
	if last, ok := f.lastID[tag]; ok && k >= f.dupAt && f.dupAt > 0 && !f.duplicated {
		// The last ID of this tag's previous reply, once more: segment IDs are unique
		// per tag, so only a repeat within a tag is a duplicate.
		start, f.duplicated = last, true
	}
	ids := make([]uint64, count)
	for i := range ids {
		ids[i] = start + uint64(i)
	}
	f.next = max(f.next, start+uint64(count))
	f.lastID[tag] = ids[count-1]
	if k == f.disorderAt && count > 1 {
		ids[0], ids[1] = ids[1], ids[0]
	}
	var body []byte
	for i, id := range ids {
		if m.Header.Get("Leaf-Encoding") == "binary" {
			body = binary.BigEndian.AppendUint64(body, id)
			continue
		}
		if i > 0 {
			body = append(body, '\n')
		}
		body = strconv.AppendUint(body, id, 10)
	}
	m.Respond(body)
}

func (f *fakeDispenser) tagCounts() map[string]int {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string]int{}
	for k, v := range f.perTag {
		out[k] = v
	}
	return out
}

// testConfig is a short measured run against n: no warm-up, so every request counts.
func testConfig(natsURL string) Config {
	cfg := defaultConfig()
	cfg.Conn.URLs = natsURL
	cfg.Warmup, cfg.Duration, cfg.Requests = 0, 0, 200
	cfg.Timeout = 2 * time.Second
	return cfg
}

// runBounded runs the bench and fails the test if it does not finish in time.
func runBounded(tb testing.TB, cfg Config) *Report {
	tb.Helper()
	type result struct {
		rep *Report
		err error
	}
	done := make(chan result, 1)
	go func() {
		rep, err := run(context.Background(), cfg, nil, nil)
		done <- result{rep, err}
	}()
	select {
	case r := <-done:
		if r.err != nil {
			tb.Fatalf("run: %v", r.err)
		}
		return r.rep
	case <-time.After(30 * time.Second):
		tb.Fatalf("run did not finish within 30s")
		return nil
	}
}

func TestRunCountsEverything(t *testing.T) {
	tests := []struct {
		name     string
		setup    func(c *Config)
		fake     faults
		wantReq  int64
		want     map[string]int64 // errors by key
		wantDup  int64
		wantBad  int64 // replies out of order
		wantRegr int64 // -1: not exact (several clients)
		wantTags int
	}{
		{
			name:  "ClosedLoopText",
			setup: func(c *Config) { c.Clients, c.Inflight, c.Batch = 1, 4, 3 },
			fake:  faults{dupAt: 10, errAt: 20},
			want:  map[string]int64{"503": 1}, wantReq: 200, wantDup: 1, wantRegr: 1, wantTags: 1,
		},
		{
			name: "OpenLoopBinaryTwoTags",
			setup: func(c *Config) {
				c.Clients, c.Rate, c.Requests, c.Batch, c.Encoding = 2, 2000, 300, 5, wire.Binary
				// The planted drop costs one timeout of waiting; 1 s leaves room for a
				// loaded CI machine under -race, where replies can take a few hundred ms.
				c.Tags, c.Timeout, c.Inflight = []string{"a", "b"}, time.Second, 1
			},
			fake: faults{dupAt: 10, errAt: 20, disorderAt: 30, dropAt: 40},
			want: map[string]int64{"503": 1, "bad_reply": 1, "timeout": 1}, wantReq: 300,
			wantDup: 1, wantBad: 1, wantRegr: -1, wantTags: 2,
		},
		{
			name: "ClosedLoopSnowflakeWithWarmup",
			setup: func(c *Config) {
				c.Kind, c.Warmup, c.Requests, c.Clients, c.Inflight = wire.Snowflake, 100*time.Millisecond, 100, 2, 2
			},
			fake: faults{},
			want: map[string]int64{}, wantReq: 100, wantRegr: -2, wantTags: 1,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n := testenv.StartNATS(t)
			fake := startFake(t, n, tt.fake)
			cfg := testConfig(n.URL())
			cfg.Check = true
			tt.setup(&cfg)
			rep := runBounded(t, cfg)
			d := rep.Dispenser
			defer func() {
				if t.Failed() {
					t.Logf("dispenser report: %+v", d)
				}
			}()

			var errs int64
			for k, want := range tt.want {
				if d.Errors[k] != want {
					t.Errorf("errors[%q] = %d, want %d (all: %v)", k, d.Errors[k], want, d.Errors)
				}
				errs += want
			}
			if len(d.Errors) != len(tt.want) {
				t.Errorf("errors = %v, want only %v", d.Errors, tt.want)
			}
			if d.Sent != tt.wantReq || d.OK != tt.wantReq-errs {
				t.Errorf("sent %d ok %d, want %d and %d", d.Sent, d.OK, tt.wantReq, tt.wantReq-errs)
			}
			if d.IDs != d.OK*int64(cfg.Batch) || d.Latency.Count != uint64(d.OK) {
				t.Errorf("IDs %d latencies %d for %d good replies of %d", d.IDs, d.Latency.Count, d.OK, cfg.Batch)
			}
			if d.RequestsPerS <= 0 || d.Latency.P50 <= 0 || d.Latency.Max < d.Latency.P99 || d.Latency.P99 < d.Latency.P50 {
				t.Errorf("rates/latency implausible: %+v %+v", d.RequestsPerS, d.Latency)
			}
			if (d.SendLag != nil) != (cfg.Rate > 0) || (d.SendLag != nil && d.SendLag.Count != uint64(d.Sent)) {
				t.Errorf("sender lag %+v, want one sample per measured request in open loop only", d.SendLag)
			}
			if d.OrderViolations != tt.wantBad {
				t.Errorf("order violations = %d, want %d", d.OrderViolations, tt.wantBad)
			}
			c := rep.Check
			if c == nil || c.Duplicates != tt.wantDup {
				t.Fatalf("check = %+v, want %d duplicates", c, tt.wantDup)
			}
			if tt.wantDup > 0 && c.DuplicateSamples[0] == "" {
				t.Errorf("duplicate samples = %v, want the planted ID", c.DuplicateSamples)
			}
			if cfg.Warmup == 0 && c.IDs != int64(cfg.Batch)*d.OK {
				t.Errorf("checked %d IDs, want those of every good reply: %d", c.IDs, int64(cfg.Batch)*d.OK)
			}
			switch {
			case tt.wantRegr == -2:
				if c.Regressions != nil {
					t.Errorf("regressions = %d for snowflake, want none reported", *c.Regressions)
				}
			case c.Regressions == nil:
				t.Errorf("regressions not reported for segment IDs")
			case tt.wantRegr >= 0 && *c.Regressions != tt.wantRegr:
				t.Errorf("regressions = %d, want %d", *c.Regressions, tt.wantRegr)
			case *c.Regressions > 1:
				t.Errorf("regressions = %d, want at most the planted one", *c.Regressions)
			}
			if got := rep.Failed(); got != (tt.wantDup > 0 || tt.wantBad > 0) {
				t.Errorf("Failed() = %v with %d duplicates and %d order violations", got, tt.wantDup, tt.wantBad)
			}
			tags := fake.tagCounts()
			if len(tags) != tt.wantTags {
				t.Errorf("requests by tag %v, want %d tags", tags, tt.wantTags)
			}
			for tag, got := range tags {
				if min := int(tt.wantReq)/tt.wantTags - 1; got < min {
					t.Errorf("tag %s got %d requests, want round robin (at least %d)", tag, got, min)
				}
			}
		})
	}
}

func TestRunNoResponders(t *testing.T) {
	n := testenv.StartNATS(t)
	cfg := testConfig(n.URL())
	cfg.Requests = 20
	rep := runBounded(t, cfg)
	if got := rep.Dispenser.Errors[errKeyNoResponders]; got != 20 || rep.Dispenser.OK != 0 {
		t.Fatalf("no dispenser: errors %v ok %d, want 20 no_responders", rep.Dispenser.Errors, rep.Dispenser.OK)
	}
}

// TestInboxPrefix: against a server whose application user may subscribe to inboxes of
// its own prefix only (as deploy/nats-roles.conf's client-a), bench gets its replies with
// --inbox-prefix, and without it stops at once with an error that names the flag instead
// of timing every request out.
func TestInboxPrefix(t *testing.T) {
	srv, err := server.NewServer(&server.Options{
		Host: "127.0.0.1", Port: -1, NoLog: true, NoSigs: true,
		Users: []*server.User{
			{Username: "fake", Password: "fake-pw"},
			{Username: "app", Password: "app-pw", Permissions: &server.Permissions{
				Publish:   &server.SubjectPermission{Allow: []string{"leaf.>"}},
				Subscribe: &server.SubjectPermission{Allow: []string{"_INBOX_app.>"}},
			}},
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	go srv.Start()
	t.Cleanup(srv.Shutdown)
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server not ready within 10s")
	}
	fakeNC, err := nats.Connect(srv.ClientURL(), nats.UserInfo("fake", "fake-pw"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(fakeNC.Close)
	fake := serveFake(t, fakeNC, faults{})

	cfg := defaultConfig()
	cfg.Conn.URLs, cfg.Conn.User, cfg.Conn.Password = srv.ClientURL(), "app", "app-pw"
	cfg.Warmup, cfg.Duration, cfg.Requests = 0, 0, 50
	cfg.InboxPrefix = "_INBOX_app"
	if rep := runBounded(t, cfg); rep.Dispenser.OK != 50 || fake.tagCounts()["leaf-segment-test"] != 50 {
		t.Fatalf("with --inbox-prefix: %d OK (errors %v), the fake answered %v; want 50", rep.Dispenser.OK, rep.Dispenser.Errors, fake.tagCounts())
	}

	cfg.InboxPrefix = ""
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	_, err = run(ctx, cfg, nil, nil)
	if err == nil || !strings.Contains(err.Error(), "--inbox-prefix") || !strings.Contains(err.Error(), "_INBOX.") {
		t.Fatalf("without --inbox-prefix: run = %v, want an error naming the refused inbox and --inbox-prefix", err)
	}
	if took := time.Since(start); took >= cfg.Timeout {
		t.Errorf("without --inbox-prefix: the error took %v, at least a request's --timeout %v", took, cfg.Timeout)
	}
	if got := fake.tagCounts()["leaf-segment-test"]; got != 50 {
		t.Errorf("without --inbox-prefix: %d requests reached the fake, want none after the first run's 50", got-50)
	}
}

func TestRunEchoBaseline(t *testing.T) {
	tests := []struct {
		name           string
		responders     int
		rate           float64
		wantResponders int
	}{
		{"ClosedLoopDefaultResponders", 0, 0, 1},
		{"OpenLoopTwoResponders", 2, 2000, 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n := testenv.StartNATS(t)
			startFake(t, n, faults{})
			cfg := testConfig(n.URL())
			cfg.Baseline, cfg.EchoResponders, cfg.Batch = "echo", tt.responders, 10
			if tt.rate > 0 {
				cfg.Rate, cfg.Inflight = tt.rate, 1
			}
			rep := runBounded(t, cfg)
			b := rep.Baseline
			if b == nil || b.Error != "" || b.Echo == nil {
				t.Fatalf("baseline = %+v, want an echo run", b)
			}
			if b.Responders != tt.wantResponders {
				t.Errorf("responders = %d (%s), want %d", b.Responders, b.RespondersSource, tt.wantResponders)
			}
			// The canned reply is as long as a real one: ten 4-digit IDs and 9 newlines.
			if len(b.PayloadBytes) != 1 || b.PayloadBytes[0] != 49 {
				t.Errorf("payload bytes = %v, want [49]", b.PayloadBytes)
			}
			if b.Echo.OK != cfg.Requests || len(b.Echo.Errors) != 0 || b.Echo.IDs != 10*cfg.Requests {
				t.Errorf("echo ok %d ids %d errors %v, want %d good replies", b.Echo.OK, b.Echo.IDs, b.Echo.Errors, cfg.Requests)
			}
			if len(b.Ratios) < 7 { // 8 where CPU time is measured (Linux)
				t.Fatalf("ratios = %+v, want 7 or 8 rows", b.Ratios)
			}
			for _, r := range b.Ratios {
				if r.Ratio == nil || *r.Ratio <= 0 {
					t.Errorf("ratio %s = %v (dispenser %v, echo %v), want a positive number", r.Metric, r.Ratio, r.Dispenser, r.Echo)
				}
			}
			var text bytes.Buffer
			if err := rep.WriteText(&text); err != nil || !strings.Contains(text.String(), "dispenser/echo") {
				t.Errorf("text report (err %v) lacks the comparison table:\n%s", err, text.String())
			}
		})
	}
}

func TestCountResponders(t *testing.T) {
	n := testenv.StartNATS(t)
	for i := range 2 {
		nc := n.Connect(t)
		svc, err := micro.AddService(nc, micro.Config{Name: "leaf", Version: "1.0.0", QueueGroup: "leaf"})
		if err != nil {
			t.Fatalf("AddService %d: %v", i, err)
		}
		t.Cleanup(func() { svc.Stop() })
		nop := micro.HandlerFunc(func(micro.Request) {})
		if err := svc.AddEndpoint("segment", nop, micro.WithEndpointSubject("leaf.segment.*")); err != nil {
			t.Fatalf("AddEndpoint: %v", err)
		}
		if err := svc.AddEndpoint("snowflake", nop, micro.WithEndpointSubject("leaf.snowflake.*")); err != nil {
			t.Fatalf("AddEndpoint: %v", err)
		}
		if err := nc.Flush(); err != nil { // the server knows the subscriptions before we ask
			t.Fatalf("Flush: %v", err)
		}
	}
	nc := n.Connect(t)
	tests := []struct {
		name, prefix, subject string
		want                  int
	}{
		{"TwoInstances", "leaf", "leaf.segment.orders", 2},
		{"OtherKindOnly", "leaf", "leaf.decode.snowflake", 0},
		{"NoService", "other", "other.segment.orders", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := countResponders(nc, tt.prefix, tt.subject, time.Second)
			if err != nil || got != tt.want {
				t.Fatalf("countResponders(%s, %s) = %d, %v; want %d", tt.prefix, tt.subject, got, err, tt.want)
			}
		})
	}
}

func TestSubjectMatches(t *testing.T) {
	tests := []struct {
		pattern, subject string
		want             bool
	}{
		{"leaf.segment.*", "leaf.segment.orders", true},
		{"leaf.segment.*", "leaf.segment", false},
		{"leaf.segment.*", "leaf.segment.a.b", false},
		{"leaf.>", "leaf.segment.orders", true},
		{"leaf.>", "leaf", false},
		{"leaf.segment.orders", "leaf.segment.orders", true},
		{"leaf.snowflake.*", "leaf.segment.orders", false},
	}
	for _, tt := range tests {
		if got := subjectMatches(tt.pattern, tt.subject); got != tt.want {
			t.Errorf("subjectMatches(%q, %q) = %v, want %v", tt.pattern, tt.subject, got, tt.want)
		}
	}
}

// TestBenchCommand runs the command as a user would and checks its exit status and output.
func TestBenchCommand(t *testing.T) {
	n := testenv.StartNATS(t)
	startFake(t, n, faults{dupAt: 5})
	tests := []struct {
		name     string
		args     []string
		wantCode int
		wantOut  string
	}{
		{"DuplicateFailsJSON", []string{"--nats", n.URL(), "--requests", "50", "--warmup", "0", "--check", "--json"}, exitFailed, `"duplicates": 1`},
		{"CleanRunText", []string{"--nats", n.URL(), "--requests", "50", "--warmup", "0", "--batch", "2"}, exitOK, "requests/s"},
		{"EmbeddedSegmentChecked", []string{"--embedded", "--requests", "3000", "--warmup", "0", "--batch", "7", "--tags", "a,b", "--check", "--json"}, exitOK, `"duplicates": 0`},
		{"EmbeddedSnowflakeSlowStore", []string{"--embedded", "--kind", "snowflake", "--store-delay", "5ms", "--requests", "500", "--warmup", "0", "--check"}, exitOK, "requests/s"},
		{"BadFlag", []string{"--kind", "uuid"}, exitTrouble, `--kind "uuid"`},
		{"Help", []string{"--help"}, exitOK, "Exit status"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			done := make(chan int, 1)
			go func() { done <- bench(context.Background(), tt.args, &stdout, &stderr, false) }()
			select {
			case code := <-done:
				out := stdout.String() + stderr.String()
				if code != tt.wantCode || !strings.Contains(out, tt.wantOut) {
					t.Fatalf("bench %v = exit %d, want %d with %q in:\n%s", tt.args, code, tt.wantCode, tt.wantOut, out)
				}
				if tt.wantCode != exitTrouble && strings.Contains(tt.wantOut, `"`) {
					var rep Report
					if err := json.Unmarshal(stdout.Bytes(), &rep); err != nil {
						t.Fatalf("--json output is not one JSON object: %v", err)
					}
				}
			case <-time.After(30 * time.Second):
				t.Fatalf("bench %v did not finish within 30s", tt.args)
			}
		})
	}
}

func TestParseFlags(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		check   func(c Config) bool
		wantErr bool
	}{
		{"Defaults", nil, func(c Config) bool {
			return c.Kind == wire.Segment && c.Encoding == wire.Text && c.Prefix == "leaf" && c.Tags[0] == "leaf-segment-test" && c.Duration == 10*time.Second && c.Conn.URLs == "nats://127.0.0.1:4222"
		}, false},
		{"RequestsAloneDropsDefaultDuration", []string{"--requests", "5"}, func(c Config) bool { return c.Duration == 0 && c.Requests == 5 }, false},
		{"RequestsAndDuration", []string{"--requests", "5", "--duration", "3s"}, func(c Config) bool { return c.Duration == 3*time.Second }, false},
		{"TagsSplit", []string{"--tags", "a, b,,c"}, func(c Config) bool { return strings.Join(c.Tags, "|") == "a|b|c" }, false},
		{"OpenLoop", []string{"--rate", "500"}, func(c Config) bool { return c.Rate == 500 }, false},
		{"Spill", []string{"--check", "--check-spill", "/tmp", "--check-mem", "4096"}, func(c Config) bool { return c.CheckMem == 4096 }, false},
		{"ErrBadTag", []string{"--tags", "a\x01b"}, nil, true},
		{"ErrInflightWithRate", []string{"--rate", "10", "--inflight", "2"}, nil, true},
		{"ErrEmbeddedWithNats", []string{"--embedded", "--nats", "nats://x:4222"}, nil, true},
		{"ErrEmbeddedWithNatsPassword", []string{"--embedded", "--nats", "nats://bob:s3cr3t@x:4222"}, nil, true},
		{"ErrStoreDelayWithoutEmbedded", []string{"--store-delay", "10ms"}, nil, true},
		{"ErrStoreDelayNegative", []string{"--embedded", "--store-delay", "-1s"}, nil, true},
		{"ErrSpillWithoutCheck", []string{"--check-spill", "/tmp"}, nil, true},
		{"ErrBaseline", []string{"--baseline", "redis"}, nil, true},
		{"BothBaselines", []string{"--baseline", "echo,echo-process"}, func(c Config) bool { return len(c.baselines()) == 2 }, false},
		{"EchoAt", []string{"--baseline", "echo-process", "--echo-at", "_bench.echo.x"}, func(c Config) bool { return c.EchoAt == "_bench.echo.x" }, false},
		{"Rounds", []string{"--baseline", "echo", "--rounds", "5"}, func(c Config) bool { return c.Rounds == 5 }, false},
		{"ErrRoundsWithoutBaseline", []string{"--rounds", "5"}, nil, true},
		{"ErrRoundsWithCheck", []string{"--baseline", "echo", "--rounds", "5", "--check"}, nil, true},
		{"ErrRoundsZero", []string{"--rounds", "0"}, nil, true},
		{"CPUPID", []string{"--cpu-pid", "dispenser=12", "--cpu-pid", "34"}, func(c Config) bool { return c.CPUPIDs["dispenser"] == 12 && c.CPUPIDs["pid 34"] == 34 }, false},
		{"ErrCPUPID", []string{"--cpu-pid", "bench=12"}, nil, true},
		{"ErrBaselineTwice", []string{"--baseline", "echo,echo"}, nil, true},
		{"ErrEchoAtWithoutProcess", []string{"--baseline", "echo", "--echo-at", "x"}, nil, true},
		{"ErrEchoAtWildcard", []string{"--baseline", "echo-process", "--echo-at", "x.>"}, nil, true},
		{"ErrEncoding", []string{"--encoding", "json"}, nil, true},
		{"ErrBatch", []string{"--batch", "0"}, nil, true},
		{"ErrTimeout", []string{"--timeout", "0s"}, nil, true},
		{"Binary", []string{"--encoding", "binary", "--kind", "snowflake"}, func(c Config) bool { return c.Encoding == wire.Binary && c.Kind == wire.Snowflake }, false},
		{"ErrPrefix", []string{"--prefix", "le af"}, nil, true},
		{"ErrPrefixDot", []string{"--prefix", "leaf.prod"}, nil, true}, // the dispenser refuses it too
		{"ErrPrefixTooLong", []string{"--prefix", strings.Repeat("p", wire.MaxPrefixLen+1)}, nil, true},
		{"ErrTagTooLong", []string{"--tags", strings.Repeat("t", wire.MaxTagLen+1)}, nil, true},
		{"ErrAuth", []string{"--token", "t", "--user", "u"}, nil, true},
		{"ErrPositional", []string{"extra"}, nil, true},
		{"HTTP", []string{"--http", "http://127.0.0.1:8080", "--batch", "5"}, func(c Config) bool { return c.HTTP == "http://127.0.0.1:8080" && c.Batch == 5 }, false},
		{"ErrHTTPWithNats", []string{"--http", "http://127.0.0.1:8080", "--nats", "nats://x:4222"}, nil, true},
		{"ErrHTTPWithEmbedded", []string{"--http", "http://127.0.0.1:8080", "--embedded"}, nil, true},
		{"ErrHTTPBinary", []string{"--http", "http://127.0.0.1:8080", "--encoding", "binary"}, nil, true},
		{"ErrHTTPBaseline", []string{"--http", "http://127.0.0.1:8080", "--baseline", "echo"}, nil, true},
		{"ErrHTTPNotAURL", []string{"--http", "127.0.0.1:8080"}, nil, true},
		{"InboxPrefix", []string{"--inbox-prefix", "_INBOX_client-a"}, func(c Config) bool { return c.InboxPrefix == "_INBOX_client-a" }, false},
		{"InboxPrefixTokens", []string{"--inbox-prefix", "apps.billing"}, func(c Config) bool { return c.InboxPrefix == "apps.billing" }, false},
		{"ErrInboxPrefixWildcard", []string{"--inbox-prefix", "_INBOX.*"}, nil, true},
		{"ErrInboxPrefixTrailingDot", []string{"--inbox-prefix", "_INBOX_a."}, nil, true},
		{"ErrInboxPrefixSpace", []string{"--inbox-prefix", "_INBOX a"}, nil, true},
		{"ErrInboxPrefixDispenserSubject", []string{"--inbox-prefix", "leaf.bench"}, nil, true},
		{"ErrInboxPrefixDollar", []string{"--inbox-prefix", "$X"}, nil, true},
		{"ErrRequestsUnderRounds", []string{"--baseline", "echo", "--requests", "3", "--rounds", "5"}, nil, true},
		{"RequestsOverRounds", []string{"--baseline", "echo", "--requests", "5", "--rounds", "5"}, func(c Config) bool { return c.Rounds == 5 && c.Requests == 5 }, false},
		{"ErrInboxPrefixWithHTTP", []string{"--http", "http://127.0.0.1:8080", "--inbox-prefix", "_INBOX_a"}, nil, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := parseFlags(tt.args, &bytes.Buffer{}, func(string) string { return "" })
			if tt.wantErr {
				if !errors.Is(err, ErrInvalidConfig) {
					t.Fatalf("parseFlags(%v) error = %v, want ErrInvalidConfig", tt.args, err)
				}
				if strings.Contains(err.Error(), "s3cr3t") {
					t.Errorf("the error shows the password: %v", err)
				}
				return
			}
			if err != nil || !tt.check(cfg) {
				t.Fatalf("parseFlags(%v) = %+v, %v", tt.args, cfg, err)
			}
		})
	}
}

// TestParseFlagsEnv: when bench loads NATS, where the deployment is and who connects
// also come from LEAFBUS_<NAME>, as for the dispenser and its commands, so a role's
// password need not be on the command line; a flag given wins, and nothing else is read
// from the environment.
func TestParseFlagsEnv(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		check   func(c Config) bool
		wantErr bool
		env     map[string]string
	}{
		{"Env", nil, func(c Config) bool {
			return c.Conn.URLs == "nats://n1:4222" && c.Conn.User == "client-a" && c.Conn.Password == "secret" && c.InboxPrefix == "_INBOX_client-a" && c.Prefix == "ids"
		}, false, map[string]string{"LEAFBUS_NATS": "nats://n1:4222", "LEAFBUS_USER": "client-a", "LEAFBUS_PASSWORD": "secret", "LEAFBUS_INBOX_PREFIX": "_INBOX_client-a", "LEAFBUS_PREFIX": "ids"}},
		{"EnvToken", nil, func(c Config) bool { return c.Conn.Token == "t" && c.Conn.User == "" }, false, map[string]string{"LEAFBUS_TOKEN": "t"}},
		{"FlagWinsOverEnv", []string{"--user", "operator"}, func(c Config) bool { return c.Conn.User == "operator" && c.Conn.Password == "secret" },
			false, map[string]string{"LEAFBUS_USER": "client-a", "LEAFBUS_PASSWORD": "secret"}},
		{"EnvNotForEmbedded", []string{"--embedded"}, func(c Config) bool { return c.Conn.URLs == "nats://127.0.0.1:4222" && c.Conn.User == "" },
			false, map[string]string{"LEAFBUS_NATS": "nats://n1:4222", "LEAFBUS_USER": "client-a"}},
		{"EnvNotForHTTP", []string{"--http", "http://127.0.0.1:8080"}, func(c Config) bool { return c.InboxPrefix == "" },
			false, map[string]string{"LEAFBUS_INBOX_PREFIX": "_INBOX_client-a"}},
		{"LoadFlagsNotFromEnv", nil, func(c Config) bool { return c.HTTP == "" && c.Duration == 10*time.Second },
			false, map[string]string{"LEAFBUS_HTTP": "127.0.0.1:8080", "LEAFBUS_DURATION": "1s"}},
		{"ErrEnvInboxPrefix", nil, nil, true, map[string]string{"LEAFBUS_INBOX_PREFIX": "leaf.x"}},
		{"ErrEnvTwoMethods", nil, nil, true, map[string]string{"LEAFBUS_USER": "u", "LEAFBUS_TOKEN": "t"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := parseFlags(tt.args, &bytes.Buffer{}, func(k string) string { return tt.env[k] })
			if tt.wantErr {
				if !errors.Is(err, ErrInvalidConfig) {
					t.Fatalf("parseFlags(%v) with %v: error = %v, want ErrInvalidConfig", tt.args, tt.env, err)
				}
				return
			}
			if err != nil || !tt.check(cfg) {
				t.Fatalf("parseFlags(%v) with %v = %+v, %v", tt.args, tt.env, cfg, err)
			}
		})
	}
}

func TestRunStopsOnInterrupt(t *testing.T) {
	tests := []struct {
		name string
		rate float64
	}{
		{"ClosedLoop", 0},
		{"OpenLoop", 1000},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			n := testenv.StartNATS(t)
			fake := startFake(t, n, faults{})
			cfg := testConfig(n.URL())
			cfg.Requests, cfg.Duration, cfg.Rate = 0, 0, tt.rate // no end but the signal
			if tt.rate > 0 {
				cfg.Inflight = 1
			}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			type result struct {
				rep *Report
				err error
			}
			done := make(chan result, 1)
			go func() {
				rep, err := run(ctx, cfg, nil, nil)
				done <- result{rep, err}
			}()
			// Interrupt once some requests were answered (and after at least 300 ms), not
			// at a fixed time: a loaded machine may not have sent one by then.
			go func() {
				time.Sleep(300 * time.Millisecond)
				for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
					fake.mu.Lock()
					answered := fake.replies
					fake.mu.Unlock()
					if answered >= 5 {
						break
					}
				}
				cancel()
			}()
			select {
			case r := <-done:
				if r.err != nil || !r.rep.Interrupted || r.rep.Dispenser.OK == 0 || len(r.rep.Dispenser.Errors) != 0 {
					t.Fatalf("interrupted run = %+v, %v; want good replies, no errors, Interrupted", r.rep, r.err)
				}
			case <-time.After(10 * time.Second):
				t.Fatalf("run did not stop within 10s of the interrupt")
			}
		})
	}
}

// TestEchoAnswersInboxesOnly: the echo answers a request whose reply subject is an
// inbox, and drops one aimed at a KV key or a dispenser subject, as the dispenser does
// (PROTOCOL.md "Reply subjects").
func TestEchoAnswersInboxesOnly(t *testing.T) {
	n := testenv.StartNATS(t)
	cfg := testConfig(n.URL())
	echo, err := startEcho(cfg.Conn, wire.Subjects{Prefix: cfg.Prefix}, newEchoPrefix(), []string{"t"}, [][]byte{[]byte("42")}, 1, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(echo.stop)
	nc := n.Connect(t)
	if m, err := nc.Request(echo.subject("t"), nil, 5*time.Second); err != nil || string(m.Data) != "42" {
		t.Fatalf("request from an inbox = %v, %v; want 42", m, err)
	}
	for _, aimed := range []string{"$KV.leaf_forever.node-1", "leaf.segment.orders"} {
		sub, err := nc.SubscribeSync(aimed)
		if err != nil {
			t.Fatal(err)
		}
		if err := nc.PublishRequest(echo.subject("t"), aimed, nil); err != nil {
			t.Fatal(err)
		}
		if m, err := sub.NextMsg(200 * time.Millisecond); err == nil {
			t.Errorf("the echo answered on %s: %q", aimed, m.Data)
		}
		sub.Unsubscribe()
	}
}

// BenchmarkLoadgenEcho measures the bench itself: closed-loop requests through runLoad
// against a bare responder, everything in one process. Its ns/op bounds the request
// rate a bench process can drive on this machine.
func BenchmarkLoadgenEcho(b *testing.B) {
	b.ReportAllocs()
	n := testenv.StartNATS(b)
	cfg := testConfig(n.URL())
	cfg.Clients, cfg.Inflight = 2, 16
	echo, err := startEcho(cfg.Conn, wire.Subjects{Prefix: cfg.Prefix}, newEchoPrefix(), cfg.Tags, [][]byte{[]byte("1860000000000000001")}, 1, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(echo.stop)
	clients, err := connectClients(cfg, nil)
	b.Cleanup(func() { closeClients(clients) })
	if err != nil {
		b.Fatal(err)
	}
	cfg.Requests = int64(b.N)
	spec := newLoadSpec(cfg, "echo", echo.subject)
	b.ResetTimer()
	res, err := runLoad(context.Background(), clients, spec, nil, nil)
	if err != nil {
		b.Fatal(err)
	}
	if res.ok != int64(b.N) {
		b.Fatalf("%d good replies of %d (errors %v)", res.ok, b.N, res.errors)
	}
	b.ReportMetric(float64(res.hist.Percentile(50).Microseconds()), "p50-µs")
	b.ReportMetric(float64(res.hist.Percentile(99).Microseconds()), "p99-µs")
}
