package core_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	neturl "net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leafbus/leafbus/bus"
	"github.com/leafbus/leafbus/core"
	"github.com/leafbus/leafbus/httpapi"
	"github.com/leafbus/leafbus/internal/testutil"
	"github.com/leafbus/leafbus/segment"
	"github.com/leafbus/leafbus/snowflake"
	"github.com/leafbus/leafbus/testenv"
	"github.com/leafbus/leafbus/wire"
)

func TestMain(m *testing.M) { testenv.Main(m) }

// The parity table: one core behind both faces (a NATS service on a real server and the
// HTTP face on a real port), and every kind of request the core decides something about,
// each asked through both faces. The faces only parse and encode, so every row must
// come out the same way through both: the same code, the same number of IDs, and the
// same wait (whether the core answered at once, held the request, or refused it for
// overload), counted by the core itself.

// paritySegments serves segment tags by name: "orders" from memory; "cold" only after a
// load (Fill); "down" never (a store that does not answer: Fill waits out its ctx);
// "gone" is not in the store; "stall" waits until released; "tİny" is the row "tiny"
// to the store's collation (ErrTagSpelling).
type paritySegments struct {
	next    atomic.Int64
	release chan struct{}
}

func (s *paritySegments) fill(dst []int64) {
	base := s.next.Add(int64(len(dst))) - int64(len(dst))
	for i := range dst {
		dst[i] = base + int64(i) + 1
	}
}

func (s *paritySegments) TryFill(tag string, dst []int64) (bool, error) {
	if tag == "orders" {
		s.fill(dst)
		return true, nil
	}
	return false, nil
}

func (s *paritySegments) Fill(ctx context.Context, tag string, dst []int64) error {
	switch tag {
	case "gone":
		return fmt.Errorf("segment: tag %q: %w", tag, segment.ErrTagNotFound)
	case "tİny":
		return segment.CheckSpelling(tag, "tiny")
	case "down":
		<-ctx.Done()
		return ctx.Err()
	case "stall":
		select {
		case <-s.release:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	s.fill(dst)
	return nil
}

// parityMonotonic marks "ordered" (with a leader: served from memory) and "leaderless"
// (no leader: the Manager's answer is a 503); its marks load when loaded is closed.
type parityMonotonic struct {
	loaded chan struct{}
	next   atomic.Int64
}

func (m *parityMonotonic) Ready() <-chan struct{} { return m.loaded }
func (m *parityMonotonic) IsMonotonic(tag string) (bool, error) {
	select {
	case <-m.loaded:
	default:
		return false, fmt.Errorf("%w: monotonic marks not loaded", wire.ErrUnavailable)
	}
	return tag == "ordered" || tag == "leaderless", nil
}
func (m *parityMonotonic) TryFill(tag string, dst []int64) (bool, error) {
	if tag != "ordered" {
		return false, nil
	}
	base := m.next.Add(int64(len(dst))) - int64(len(dst))
	for i := range dst {
		dst[i] = 1_000_000 + base + int64(i)
	}
	return true, nil
}
func (m *parityMonotonic) Fill(context.Context, string, []int64) error {
	return fmt.Errorf("%w: monotonic tag has no leader", wire.ErrUnavailable)
}
func (m *parityMonotonic) SetMonotonic(context.Context, string, bool) error { return nil }
func (m *parityMonotonic) MonotonicTags(context.Context) (map[string]bool, error) {
	return map[string]bool{"ordered": true, "leaderless": true}, nil
}

// paritySnowflakes is a real generator behind a switch: normal, suspended until a
// moment (then it issues), suspended for good, or with its clock stepped back.
type paritySnowflakes struct {
	gen   *snowflake.Generator
	mu    sync.Mutex
	state string    // "", "suspended", "behind"
	until time.Time // with "suspended": resumes then (zero: never)
}

func (s *paritySnowflakes) set(state string, until time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.state, s.until = state, until
}

func (s *paritySnowflakes) Fill(dst []int64) error {
	s.mu.Lock()
	state, until := s.state, s.until
	s.mu.Unlock()
	switch {
	case state == "behind":
		return fmt.Errorf("%w: by 20ms", snowflake.ErrClockBackwards)
	case state == "suspended" && (until.IsZero() || time.Now().Before(until)):
		return fmt.Errorf("%w: lease being renewed", snowflake.ErrSuspended)
	}
	return s.gen.Fill(dst)
}

// parityOutcome is what a row came to through one face.
type parityOutcome struct {
	Code       int
	IDs        int
	Waited     uint64 // the core's count of held requests went up by this
	Overloaded uint64 // its count of overload refusals
}

func TestFacesAgree(t *testing.T) {
	const waitMax = 300 * time.Millisecond
	segs := &paritySegments{release: make(chan struct{})}
	mono := &parityMonotonic{loaded: make(chan struct{})}
	gen, err := snowflake.New(snowflake.Config{WorkerID: 4})
	if err != nil {
		t.Fatal(err)
	}
	sfs := &paritySnowflakes{gen: gen}
	cc := core.DefaultConfig()
	cc.MaxBatch, cc.WaitMax, cc.MaxWaiting = 100, waitMax, 2
	cc.Segments, cc.Snowflakes, cc.Monotonic = segs, sfs, mono
	c, err := core.New(cc)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Stop)

	ns := testenv.StartNATS(t)
	svcCfg := bus.DefaultConfig()
	svcCfg.Core, svcCfg.Logger = c, testutil.Logger(t)
	svc, err := bus.New(ns.Connect(t), svcCfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = svc.Stop() })
	nc := ns.Connect(t)

	hc := httpapi.DefaultConfig()
	hc.Core, hc.Logger = c, testutil.Logger(t)
	srv, err := httpapi.New("127.0.0.1:0", hc)
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Listen(true); err != nil {
		t.Fatal(err)
	}
	testutil.Run(t, "http", srv.Run)
	base := "http://" + srv.Addr().String()

	faces := map[string]func(kind wire.Kind, tag, count string) (code, ids int){
		"nats": func(kind wire.Kind, tag, count string) (int, int) {
			msg, err := nc.Request(wire.Subjects{Prefix: "leaf"}.IDs(kind, tag), []byte(count), 10*time.Second)
			if err != nil {
				t.Fatalf("NATS %s %s %q: %v", kind, tag, count, err)
			}
			if code := msg.Header.Get(wire.ServiceErrorCodeHeader); code != "" {
				n, _ := strconv.Atoi(code)
				return n, 0
			}
			return 200, strings.Count(string(msg.Data), "\n") + 1
		},
		"http": func(kind wire.Kind, tag, count string) (int, int) {
			// The trailing slash keeps a dotted tag whole (Spring's suffix rule).
			url := base + "/api/" + kind.String() + "/get/" + neturl.PathEscape(tag) + "/"
			if count != "" {
				url += "?count=" + count
			}
			resp, err := http.Get(url)
			if err != nil {
				t.Fatalf("GET %s: %v", url, err)
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != 200 {
				return resp.StatusCode, 0
			}
			return 200, strings.Count(string(body), "\n") + 1
		},
	}

	type row struct {
		name  string
		kind  wire.Kind
		tag   string
		count string
		setup func() // before each face's request
		want  parityOutcome
	}
	seg, sf := wire.Segment, wire.Snowflake
	suspendBriefly := func() { sfs.set("suspended", time.Now().Add(50*time.Millisecond)) }
	run := func(rows []row) {
		for _, r := range rows {
			got := map[string]parityOutcome{}
			for face, ask := range faces {
				sfs.set("", time.Time{})
				if r.setup != nil {
					r.setup()
				}
				before := c.Stats(r.kind)
				code, ids := ask(r.kind, r.tag, r.count)
				after := c.Stats(r.kind)
				got[face] = parityOutcome{code, ids, after.Waited - before.Waited, after.Overloaded - before.Overloaded}
			}
			if got["nats"] != got["http"] || got["nats"] != r.want {
				t.Errorf("%s: NATS %+v, HTTP %+v; want both %+v", r.name, got["nats"], got["http"], r.want)
			}
		}
	}

	// While the marks load, every segment request waits for them (here in vain: they
	// load only below); snowflakes do not depend on them.
	run([]row{
		{"MarksLoading", seg, "orders", "", nil, parityOutcome{503, 0, 1, 0}},
		{"SnowflakeWhileMarksLoad", sf, "any", "", nil, parityOutcome{200, 1, 0, 0}},
	})
	close(mono.loaded)

	var stalled sync.WaitGroup
	overload := func() {
		// Fill both waiting slots with requests that wait until released.
		for range cc.MaxWaiting {
			stalled.Add(1)
			if err := c.Wait(core.Request{Kind: wire.Segment, Tag: "stall", Count: 1}, func(a core.Answer) {
				a.Release()
				stalled.Done()
			}); err != nil {
				t.Fatalf("fill a waiting slot: %v", err)
			}
		}
	}
	run([]row{
		{"OneFromMemory", seg, "orders", "", nil, parityOutcome{200, 1, 0, 0}},
		{"BatchFromMemory", seg, "orders", "5", nil, parityOutcome{200, 5, 0, 0}},
		{"LargestBatch", seg, "orders", "100", nil, parityOutcome{200, 100, 0, 0}},
		{"ErrCountTooLarge", seg, "orders", "101", nil, parityOutcome{400, 0, 0, 0}},
		{"ErrCountNotANumber", seg, "orders", "abc", nil, parityOutcome{400, 0, 0, 0}},
		{"ErrBadTag", seg, "a\nb", "", nil, parityOutcome{400, 0, 0, 0}},
		{"ErrTagTooLong", seg, strings.Repeat("订", wire.MaxTagLen+1), "", nil, parityOutcome{400, 0, 0, 0}},
		{"EncodedTag", seg, "com.acme.订单 x:y", "2", nil, parityOutcome{200, 2, 1, 0}},
		{"ColdTagLoads", seg, "cold", "3", nil, parityOutcome{200, 3, 1, 0}},
		{"ErrUnknownTag", seg, "gone", "", nil, parityOutcome{404, 0, 1, 0}},
		{"ErrTagSpelling", seg, "tİny", "", nil, parityOutcome{400, 0, 1, 0}},
		{"ErrStoreDown", seg, "down", "", nil, parityOutcome{503, 0, 1, 0}},
		{"MonotonicWithLeader", seg, "ordered", "4", nil, parityOutcome{200, 4, 0, 0}},
		{"ErrMonotonicWithoutLeader", seg, "leaderless", "", nil, parityOutcome{503, 0, 1, 0}},
		{"Snowflake", sf, "any", "7", nil, parityOutcome{200, 7, 0, 0}},
		{"SnowflakeSuspendedBriefly", sf, "any", "2", suspendBriefly, parityOutcome{200, 2, 1, 0}},
		{"ErrSnowflakeSuspended", sf, "any", "", func() { sfs.set("suspended", time.Time{}) }, parityOutcome{503, 0, 1, 0}},
		{"ErrClockBehind", sf, "any", "", func() { sfs.set("behind", time.Time{}) }, parityOutcome{503, 0, 0, 0}},
	})
	overload()
	run([]row{
		{"ErrOverloadedSegment", seg, "cold", "", nil, parityOutcome{503, 0, 0, 1}},
		{"ErrOverloadedSnowflake", sf, "any", "", func() { sfs.set("suspended", time.Time{}) }, parityOutcome{503, 0, 0, 1}},
		{"InMemoryWhileOverloaded", seg, "orders", "", nil, parityOutcome{200, 1, 0, 0}},
	})
	close(segs.release)
	stalled.Wait()
}
