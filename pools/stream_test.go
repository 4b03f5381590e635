package pools

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/leafbus/leafbus/client"
	"github.com/leafbus/leafbus/internal/testutil"
	"github.com/leafbus/leafbus/segment"
	"github.com/leafbus/leafbus/testenv"
	"github.com/leafbus/leafbus/wire"
)

// testAckWait is the pool consumers' ack wait in these tests: short, so that a batch
// held by a killed job comes back within the test (the product's floor is 30 s).
const testAckWait = 2 * time.Second

// newJS connects a JetStream client to ns, closed at cleanup.
func newJS(tb testing.TB, ns *testenv.NATS, opts ...nats.Option) jetstream.JetStream {
	tb.Helper()
	js, err := jetstream.New(ns.Connect(tb, opts...))
	if err != nil {
		tb.Fatalf("jetstream.New: %v", err)
	}
	return js
}

// mustNewStream builds a Stream with the test ack wait and a fast poll.
func mustNewStream(tb testing.TB, cfg StreamConfig) *Stream {
	tb.Helper()
	if cfg.Prefix == "" {
		cfg.Prefix = "leaf"
	}
	if cfg.AckWait == 0 {
		cfg.AckWait = testAckWait
	}
	if cfg.Poll == 0 {
		cfg.Poll = 10 * time.Millisecond
	}
	if cfg.Logger == nil {
		cfg.Logger = testutil.Logger(tb)
	}
	s, err := newStream(cfg, time.Second)
	if err != nil {
		tb.Fatalf("newStream: %v", err)
	}
	return s
}

// subjectCount reads how many messages the pool subject holds.
func subjectCount(tb testing.TB, js jetstream.JetStream, subject string) int {
	tb.Helper()
	n, err := tryCount(js, subject)
	if err != nil {
		tb.Fatalf("count %s: %v", subject, err)
	}
	return n
}

func tryCount(js jetstream.JetStream, subject string) (int, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	st, err := js.Stream(ctx, wire.Subjects{Prefix: "leaf"}.PoolStream())
	if err != nil {
		return 0, err
	}
	info, err := st.Info(ctx, jetstream.WithSubjectFilter(subject))
	if err != nil {
		return 0, err
	}
	return int(info.State.Subjects[subject]), nil
}

// waitCount polls the subject until it holds want messages, failing after 15s. The
// stream may not exist yet, or (on a new cluster) not answer yet.
func waitCount(tb testing.TB, js jetstream.JetStream, subject string, want int) {
	tb.Helper()
	deadline := time.After(15 * time.Second)
	for {
		got, err := tryCount(js, subject)
		if err == nil && got == want {
			return
		}
		select {
		case <-deadline:
			tb.Fatalf("%s holds %d messages (error %v) after 15s, want %d", subject, got, err, want)
		case <-time.After(5 * time.Millisecond):
		}
	}
}

// waitPublished waits until the feeders of streams (one pool each) together report
// want batches stored, and fails if they report another number or not within 15 s. A
// feeder counts a batch once the server has acknowledged it, a moment after the stream
// holds it: a count read at once can lag the stream by the acknowledgements in flight.
func waitPublished(tb testing.TB, streams []*Stream, want int) {
	tb.Helper()
	published := func() (n uint64) {
		for _, s := range streams {
			n += s.Stats()[0].Published
		}
		return n
	}
	deadline := time.After(15 * time.Second)
	for published() < uint64(want) {
		select {
		case <-deadline:
			tb.Fatalf("feeders stored %d batches after 15s, want %d", published(), want)
		case <-time.After(5 * time.Millisecond):
		}
	}
	if got := published(); got != uint64(want) {
		var stats []StreamStats
		for _, s := range streams {
			stats = append(stats, s.Stats()[0])
		}
		tb.Errorf("feeders stored %d batches (%+v), want %d taken and ready", got, stats, want)
	}
}

// waitStreamStats polls pool i's stats until ok says so, failing after 5s.
func waitStreamStats(tb testing.TB, s *Stream, i int, what string, ok func(StreamStats) bool) {
	tb.Helper()
	deadline := time.After(5 * time.Second)
	for {
		st := s.Stats()[i]
		if ok(st) {
			return
		}
		select {
		case <-deadline:
			tb.Fatalf("stream pool %s:%s: waited 5s for %s; stats %+v", st.Kind, st.Tag, what, st)
		case <-time.After(2 * time.Millisecond):
		}
	}
}

func mustConsumer(tb testing.TB, js jetstream.JetStream, kind wire.Kind, tag string) *client.Consumer {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, err := client.NewConsumer(ctx, js, "leaf", kind, tag)
	if err != nil {
		tb.Fatalf("NewConsumer(%s, %s): %v", kind, tag, err)
	}
	return c
}

func TestNewStream(t *testing.T) {
	ns := testenv.StartNATS(t)
	js := newJS(t, ns)
	segs := &countingSource{}
	sfs := snowflakeFake{&countingSource{}}
	orders := Spec{Kind: wire.Segment, Tag: "orders", Size: 100, Depth: 4}
	tests := []struct {
		name    string
		cfg     StreamConfig
		wantErr error
	}{
		{"OK", StreamConfig{JetStream: js, Prefix: "leaf", Specs: []Spec{orders}, Segments: segs}, nil},
		{"OKNoPools", StreamConfig{JetStream: js, Prefix: "leaf"}, nil},
		{"ErrNoJetStream", StreamConfig{Prefix: "leaf", Specs: []Spec{orders}, Segments: segs}, ErrInvalidPool},
		{"ErrPrefix", StreamConfig{JetStream: js, Prefix: "a.b", Specs: []Spec{orders}, Segments: segs}, ErrInvalidPool},
		{"ErrAckWaitBelowFloor", StreamConfig{JetStream: js, Prefix: "leaf", AckWait: 29 * time.Second}, ErrInvalidPool},
		{"ErrReplicas", StreamConfig{JetStream: js, Prefix: "leaf", Replicas: 6}, ErrInvalidPool},
		{"ErrNoSegmentSource", StreamConfig{JetStream: js, Prefix: "leaf", Specs: []Spec{orders}, Snowflakes: sfs}, ErrInvalidPool},
		{"ErrNoSnowflakeSource", StreamConfig{JetStream: js, Prefix: "leaf", Specs: []Spec{{Kind: wire.Snowflake, Tag: "x", Size: 10, Depth: 1}}, Segments: segs}, ErrInvalidPool},
		{"ErrDuplicatePool", StreamConfig{JetStream: js, Prefix: "leaf", Specs: []Spec{orders, orders}, Segments: segs}, ErrInvalidPool},
		{"ErrBadSpec", StreamConfig{JetStream: js, Prefix: "leaf", Specs: []Spec{{Kind: wire.Segment, Tag: "orders", Size: 0, Depth: 1}}, Segments: segs}, ErrInvalidPool},
		// 10^6 IDs as text may take 20 MB, over the server's default 1 MB max payload.
		{"ErrOverMaxPayload", StreamConfig{JetStream: js, Prefix: "leaf", Specs: []Spec{{Kind: wire.Segment, Tag: "big", Size: wire.MaxBatchLimit, Depth: 1}}, Segments: segs}, ErrInvalidPool},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := NewStream(tt.cfg)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("NewStream: got error %v, want %v", err, tt.wantErr)
			}
		})
	}
}

// TestStreamConfigValidate: DefaultStreamConfig with JetStream is valid, and each
// refusal names the field, its value and the bound.
func TestStreamConfigValidate(t *testing.T) {
	js := newJS(t, testenv.StartNATS(t))
	tests := []struct {
		name    string
		change  func(*StreamConfig)
		wantErr string // "" for OK
	}{
		{"OK", func(c *StreamConfig) {}, ""},
		{"ErrJetStream", func(c *StreamConfig) { c.JetStream = nil }, "JetStream is nil"},
		{"ErrReplicas", func(c *StreamConfig) { c.Replicas = 0 }, "Replicas 0 must be between 1 and 5"},
		{"ErrAckWait", func(c *StreamConfig) { c.AckWait = 10 * time.Second }, "AckWait 10s must be at least 30s"},
		{"ErrPoll", func(c *StreamConfig) { c.Poll = 0 }, "Poll 0s must be > 0"},
		{"ErrPublishTimeout", func(c *StreamConfig) { c.PublishTimeout = -time.Second }, "PublishTimeout -1s must be > 0"},
		{"ErrPrefix", func(c *StreamConfig) { c.Prefix = "a.b" }, "Prefix"},
		{"ErrNoSnowflakeSource", func(c *StreamConfig) { c.Specs = []Spec{{Kind: wire.Snowflake, Tag: "x", Size: 10, Depth: 1}} }, "no snowflake source (Snowflakes is nil)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultStreamConfig()
			cfg.JetStream = js
			tt.change(&cfg)
			var wantIs error
			if tt.wantErr != "" {
				wantIs = ErrInvalidPool
			}
			testutil.CheckErr(t, "Validate()", cfg.Validate(), wantIs, tt.wantErr)
		})
	}
}

// TestStreamSetUp: Run creates the stream and consumers as PROTOCOL.md names them and
// fills each pool to exactly its depth; taking batches makes it top up again.
func TestStreamSetUp(t *testing.T) {
	ns := testenv.StartNATS(t)
	js := newJS(t, ns)
	specs := []Spec{
		{Kind: wire.Segment, Tag: "orders", Size: 100, Depth: 5},
		{Kind: wire.Snowflake, Tag: "events", Size: 50, Depth: 3},
		{Kind: wire.Segment, Tag: "order:create 订单", Size: 10, Depth: 2},
	}
	s := mustNewStream(t, StreamConfig{JetStream: js, Specs: specs,
		Segments: &countingSource{}, Snowflakes: snowflakeFake{&countingSource{next: 1 << 40}}})
	testutil.Run(t, "Stream.Run", s.Run)
	waitCount(t, js, "leaf.pool.segment.orders", 5)
	waitCount(t, js, "leaf.pool.snowflake.events", 3)
	waitCount(t, js, "leaf.pool.segment.order%3Acreate%20%E8%AE%A2%E5%8D%95", 2)

	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	st, err := js.Stream(ctx, "LEAF_POOL")
	if err != nil {
		t.Fatalf("js.Stream(LEAF_POOL): %v", err)
	}
	sc := st.CachedInfo().Config
	if sc.Retention != jetstream.WorkQueuePolicy || !slices.Equal(sc.Subjects, []string{"leaf.pool.>"}) || sc.Replicas != 1 || sc.Duplicates != DuplicateWindow {
		t.Errorf("stream config: retention %v subjects %v replicas %d duplicates %v; want work queue, [leaf.pool.>], 1, %v",
			sc.Retention, sc.Subjects, sc.Replicas, sc.Duplicates, DuplicateWindow)
	}
	for _, want := range []struct{ name, filter string }{
		{"segment_orders", "leaf.pool.segment.orders"},
		{"snowflake_events", "leaf.pool.snowflake.events"},
		{"segment_order%3Acreate%20%E8%AE%A2%E5%8D%95", "leaf.pool.segment.order%3Acreate%20%E8%AE%A2%E5%8D%95"},
	} {
		c, err := js.Consumer(ctx, "LEAF_POOL", want.name)
		if err != nil {
			t.Fatalf("js.Consumer(%s): %v", want.name, err)
		}
		cc := c.CachedInfo().Config
		if cc.Durable != want.name || cc.FilterSubject != want.filter || cc.AckPolicy != jetstream.AckExplicitPolicy || cc.AckWait != testAckWait {
			t.Errorf("consumer %s: durable %q filter %q ack %v wait %v; want %q %q explicit %v",
				want.name, cc.Durable, cc.FilterSubject, cc.AckPolicy, cc.AckWait, want.name, want.filter, testAckWait)
		}
	}

	c := mustConsumer(t, js, wire.Segment, "orders")
	var prev int64
	for i := 0; i < 7; i++ {
		ids, err := c.Next(ctx)
		if err != nil {
			t.Fatalf("Next #%d: %v", i, err)
		}
		if len(ids) != 100 || ids[0] <= prev {
			t.Fatalf("Next #%d: %d IDs from %d, want 100 IDs above %d", i, len(ids), ids[0], prev)
		}
		prev = ids[len(ids)-1]
	}
	waitCount(t, js, "leaf.pool.segment.orders", 5)
	if got := c.Stats(); got.Used != 7 {
		t.Errorf("Consumer.Stats: %+v, want 7 used", got)
	}
	waitStreamStats(t, s, 0, "12 published, none dropped, 5 stored", func(st StreamStats) bool {
		return st.Published == 12 && st.Dropped == 0 && st.Stored == 5
	})
}

// TestStreamSetUpUpdatesOnlyWhatDiffers: a dispenser starting on an existing pool
// stream leaves it alone when its settings match (an update, even a no-op one, races
// consumer creation inside nats-server), keeps limits an operator added, and puts back
// a setting of its own that differs.
func TestStreamSetUpUpdatesOnlyWhatDiffers(t *testing.T) {
	ns := testenv.StartNATS(t)
	js := newJS(t, ns)
	updates, err := ns.Connect(t).SubscribeSync("$JS.EVENT.ADVISORY.STREAM.UPDATED.LEAF_POOL")
	if err != nil {
		t.Fatalf("subscribe to stream update advisories: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	spec := Spec{Kind: wire.Segment, Tag: "orders", Size: 10, Depth: 3}
	ensure := func(what string) jetstream.StreamConfig {
		t.Helper()
		s := mustNewStream(t, StreamConfig{JetStream: js, Specs: []Spec{spec}, Segments: &countingSource{}})
		if err := s.ensure(ctx); err != nil {
			t.Fatalf("ensure %s: %v", what, err)
		}
		st, err := js.Stream(ctx, "LEAF_POOL")
		if err != nil {
			t.Fatalf("js.Stream after ensure %s: %v", what, err)
		}
		return st.CachedInfo().Config
	}
	// wantUpdates takes want update advisories, then gives a stray one 50ms to show
	// (the server queues advisories apart from API replies).
	wantUpdates := func(what string, want int) {
		t.Helper()
		for i := range want {
			if _, err := updates.NextMsg(5 * time.Second); err != nil {
				t.Fatalf("%s: stream update advisory #%d: %v, want %d updates", what, i+1, err, want)
			}
		}
		if _, err := updates.NextMsg(50 * time.Millisecond); err == nil {
			t.Fatalf("%s: more than %d stream updates", what, want)
		}
	}

	ensure("on no stream")
	ensure("on a matching stream")
	wantUpdates("ensure twice", 0)

	cfg := ensure("again")
	cfg.MaxAge = time.Hour // an operator's limit: not ours to undo
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		t.Fatalf("UpdateStream(MaxAge 1h): %v", err)
	}
	wantUpdates("the operator's update", 1)
	if got := ensure("with an operator's limit"); got.MaxAge != time.Hour {
		t.Errorf("after ensure MaxAge = %v, want the operator's 1h kept", got.MaxAge)
	}
	wantUpdates("ensure with an operator's limit", 0)

	cfg.Duplicates = time.Minute // one of ours, changed
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		t.Fatalf("UpdateStream(Duplicates 1m): %v", err)
	}
	wantUpdates("the duplicate window's change", 1)
	if got := ensure("with a setting of ours changed"); got.Duplicates != DuplicateWindow {
		t.Errorf("after ensure Duplicates = %v, want %v back", got.Duplicates, DuplicateWindow)
	}
	wantUpdates("ensure with a setting of ours changed", 1)
}

// TestStreamTwoFeedersBounded: two dispensers feed the same pool while a job drains it;
// once the job stops, the pool holds exactly its depth: no feeder ever added a message
// past the bound (published by both minus taken = depth), however they interleaved.
func TestStreamTwoFeedersBounded(t *testing.T) {
	ns := testenv.StartNATS(t)
	spec := Spec{Kind: wire.Segment, Tag: "orders", Size: 10, Depth: 3}
	var streams []*Stream
	for i, start := range []int64{0, 1 << 40} {
		s := mustNewStream(t, StreamConfig{JetStream: newJS(t, ns), Specs: []Spec{spec}, Segments: &countingSource{next: start}})
		if i == 1 {
			s.cfg.Poll = 3 * time.Millisecond // out of step with the first
		}
		testutil.Run(t, "Stream.Run", s.Run)
		streams = append(streams, s)
	}
	js := newJS(t, ns)
	waitCount(t, js, "leaf.pool.segment.orders", 3)
	c := mustConsumer(t, js, wire.Segment, "orders")
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	const taken = 60
	for i := 0; i < taken; i++ {
		if _, err := c.Next(ctx); err != nil {
			t.Fatalf("Next #%d: %v", i, err)
		}
		if n := subjectCount(t, js, "leaf.pool.segment.orders"); n > spec.Depth {
			t.Fatalf("after %d batches taken the pool holds %d messages, over its depth %d", i+1, n, spec.Depth)
		}
	}
	waitCount(t, js, "leaf.pool.segment.orders", 3)
	// Compare what the feeders stored with what was taken and what is left.
	waitPublished(t, streams, taken+spec.Depth)
	t.Logf("feeders: %+v; %+v", streams[0].Stats()[0], streams[1].Stats()[0])
	if used := c.Stats().Used; used != taken {
		t.Errorf("consumer used %d batches, want %d", used, taken)
	}
}

// TestStreamPublishOnce: a retried publish of a batch the server already stored is
// acknowledged as a duplicate and stored once; a batch whose outcome stayed unknown past
// half the duplicate window is dropped, never published again.
func TestStreamPublishOnce(t *testing.T) {
	ns := testenv.StartNATS(t)
	js := newJS(t, ns)
	spec := Spec{Kind: wire.Segment, Tag: "orders", Size: 3, Depth: 5}
	s := mustNewStream(t, StreamConfig{JetStream: js, Specs: []Spec{spec}, Segments: &countingSource{}})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := s.ensure(ctx); err != nil {
		t.Fatalf("ensure: %v", err)
	}
	p := s.pools[0]
	b := &streamBatch{body: []byte("1\n2\n3"), msgID: "segment.orders.1"}
	for i, want := range []pubResult{pubStored, pubDuplicate, pubDuplicate} {
		// As after a publish that timed out: the feeder does not know it was stored.
		b.unsureSince = time.Now()
		got, err := s.publish(ctx, p, b)
		if err != nil || got != want {
			t.Fatalf("publish #%d: got %v, %v; want %v", i, got, err, want)
		}
	}
	if n := subjectCount(t, js, p.subject); n != 1 {
		t.Fatalf("subject holds %d messages after three publishes of one batch, want 1", n)
	}
	stale := &streamBatch{body: []byte("4\n5\n6"), msgID: "segment.orders.4", unsureSince: time.Now().Add(-DuplicateWindow / 2)}
	if got, err := s.publish(ctx, p, stale); err != nil || got != pubDropped {
		t.Fatalf("publish of a batch unsure for half the window: got %v, %v; want pubDropped", got, err)
	}
	if n := subjectCount(t, js, p.subject); n != 1 {
		t.Fatalf("subject holds %d messages after the stale batch, want 1", n)
	}
}

// TestStreamETL is the scenario: two dispensers (two Streams, each with its own
// segment.Generator on one store) top up a pool of 10,000-ID batches while three jobs
// drain a million IDs. A fourth job takes a batch and dies before acking it: that batch
// comes back and is used by exactly one other job; every ID is used at most once.
func TestStreamETL(t *testing.T) {
	const (
		size  = 10_000
		total = 1_000_000
		jobs  = 3
	)
	ns := testenv.StartNATS(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	store := segment.NewInmemStore()
	if _, err := store.AddTag(ctx, segment.Tag{Name: "etl", MaxID: 1, Step: 100_000}); err != nil {
		t.Fatalf("AddTag: %v", err)
	}
	spec := Spec{Kind: wire.Segment, Tag: "etl", Size: size, Depth: 4}
	for i := 0; i < 2; i++ {
		segCfg := segment.DefaultConfig()
		segCfg.Store = store
		gen, err := segment.New(segCfg)
		if err != nil {
			t.Fatalf("segment.New: %v", err)
		}
		testutil.Run(t, fmt.Sprintf("segment generator %d", i), gen.Run)
		select {
		case <-gen.Ready():
		case <-time.After(5 * time.Second):
			t.Fatalf("segment generator %d not ready within 5s", i)
		}
		// Registered after the generator's cleanup, so it stops first.
		testutil.Run(t, "Stream.Run", mustNewStream(t, StreamConfig{JetStream: newJS(t, ns), Specs: []Spec{spec}, Segments: gen}).Run)
	}

	var (
		mu      sync.Mutex
		batches [][]int64 // every batch a job used
		usedIDs atomic.Int64
		held    []int64 // the batch the killed job held
		wg      sync.WaitGroup
		errs    = make(chan error, jobs)
	)
	waitCount(t, newJS(t, ns), "leaf.pool.segment.etl", spec.Depth)
	jctx, jcancel := context.WithCancel(ctx)
	defer jcancel()
	sawHeld := func() bool {
		mu.Lock()
		defer mu.Unlock()
		if held == nil {
			return false
		}
		for _, b := range batches {
			if b[0] == held[0] {
				return true
			}
		}
		return false
	}
	for j := 0; j < jobs; j++ {
		c := mustConsumer(t, newJS(t, ns), wire.Segment, "etl")
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				ids, err := c.Next(jctx)
				if err != nil {
					if jctx.Err() == nil {
						errs <- err
					}
					return
				}
				if len(ids) != size {
					errs <- errors.New("a batch of the wrong size")
					return
				}
				mu.Lock()
				batches = append(batches, ids)
				mu.Unlock()
				if usedIDs.Add(size) >= total && sawHeld() {
					jcancel()
				}
			}
		}()
	}

	// The job that dies: it receives a batch once the others are under way, and its
	// connection closes before it acks.
	deadline := time.After(30 * time.Second)
	for usedIDs.Load() < total/4 {
		select {
		case <-deadline:
			t.Fatalf("jobs used %d IDs in 30s, want %d before the kill", usedIDs.Load(), total/4)
		case err := <-errs:
			t.Fatalf("job: %v", err)
		case <-time.After(time.Millisecond):
		}
	}
	func() {
		nc, err := nats.Connect(ns.URL())
		if err != nil {
			t.Fatalf("connect the doomed job: %v", err)
		}
		defer nc.Close() // the job dies here, its batch unacked
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatalf("jetstream.New: %v", err)
		}
		cons, err := js.Consumer(ctx, "LEAF_POOL", "segment_etl")
		if err != nil {
			t.Fatalf("doomed job: consumer: %v", err)
		}
		mb, err := cons.Fetch(1, jetstream.FetchMaxWait(10*time.Second))
		if err != nil {
			t.Fatalf("doomed job: fetch: %v", err)
		}
		for m := range mb.Messages() {
			ids, err := wire.DecodeIDs(nil, m.Data(), wire.Text)
			if err != nil {
				t.Fatalf("doomed job: %v", err)
			}
			mu.Lock()
			held = ids
			mu.Unlock()
		}
		if held == nil {
			t.Fatalf("doomed job received no batch: %v", mb.Error())
		}
	}()

	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case err := <-errs:
		t.Fatalf("job: %v", err)
	case <-time.After(45 * time.Second):
		jcancel()
		t.Fatalf("jobs did not drain %d IDs and the killed job's batch within 45s (used %d, saw held batch %v)", total, usedIDs.Load(), sawHeld())
	}
	select {
	case err := <-errs:
		t.Fatalf("job: %v", err)
	default:
	}

	var all []int64
	heldUses := 0
	for _, b := range batches {
		if !slices.IsSorted(b) {
			t.Fatalf("a batch is not increasing")
		}
		if b[0] == held[0] {
			heldUses++
			if !slices.Equal(b, held) {
				t.Fatalf("the redelivered batch differs from the one the killed job held")
			}
		}
		all = append(all, b...)
	}
	if heldUses != 1 {
		t.Errorf("the killed job's batch was used %d times, want exactly once", heldUses)
	}
	if len(all) < total {
		t.Errorf("jobs used %d IDs, want at least %d", len(all), total)
	}
	slices.Sort(all)
	for i := 1; i < len(all); i++ {
		if all[i] == all[i-1] {
			t.Fatalf("ID %d used twice", all[i])
		}
	}
	t.Logf("%d batches, %d IDs used by %d jobs, all unique; the killed job's batch used once", len(batches), len(all), jobs)
}

// TestStreamReplicated: on a 3-node cluster with an R3 stream (--kv-replicas 3), two
// dispensers connected to different nodes keep the pool at its depth and never past it
// (replicated streams report publish conflicts with their own error code).
func TestStreamReplicated(t *testing.T) {
	cl := testenv.StartNATSCluster(t, 3)
	spec := Spec{Kind: wire.Segment, Tag: "orders", Size: 10, Depth: 3}
	var streams []*Stream
	for i, start := range []int64{0, 1 << 40} {
		nc := cl.Nodes[i].Connect(t)
		js, err := jetstream.New(nc)
		if err != nil {
			t.Fatalf("jetstream.New: %v", err)
		}
		s := mustNewStream(t, StreamConfig{JetStream: js, Specs: []Spec{spec}, Segments: &countingSource{next: start}, Replicas: 3,
			// A new cluster may take a while to answer its first stream create: retry sooner.
			PublishTimeout: time.Second})
		testutil.Run(t, "Stream.Run", s.Run)
		streams = append(streams, s)
	}
	js, err := jetstream.New(cl.Nodes[2].Connect(t))
	if err != nil {
		t.Fatalf("jetstream.New: %v", err)
	}
	waitCount(t, js, "leaf.pool.segment.orders", 3)
	// An R3 consumer answers pulls only once its group has elected a leader, some time
	// after the create returned; until then a pull gets "no responders".
	testutil.Eventually(t, 15*time.Second, "the pool consumer's leader", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		cons, err := js.Consumer(ctx, "LEAF_POOL", "segment_orders")
		return err == nil && cons.CachedInfo().Cluster != nil && cons.CachedInfo().Cluster.Leader != ""
	})
	c := mustConsumer(t, js, wire.Segment, "orders")
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	const taken = 20
	seen := make(map[int64]bool)
	for i := 0; i < taken; i++ {
		ids, err := c.Next(ctx)
		if err != nil {
			t.Fatalf("Next #%d: %v", i, err)
		}
		for _, id := range ids {
			if seen[id] {
				t.Fatalf("ID %d used twice", id)
			}
			seen[id] = true
		}
	}
	waitCount(t, js, "leaf.pool.segment.orders", 3)
	waitPublished(t, streams, taken+spec.Depth)
	t.Logf("feeders: %+v; %+v", streams[0].Stats()[0], streams[1].Stats()[0])
	st, err := js.Stream(ctx, "LEAF_POOL")
	if err != nil {
		t.Fatalf("js.Stream: %v", err)
	}
	if r := st.CachedInfo().Config.Replicas; r != 3 {
		t.Errorf("stream replicas %d, want 3", r)
	}
}

// TestStreamExcludedTag: once a pool's tag may no longer be pooled (it was marked
// monotonic), the batches already in the stream are purged, so no job takes IDs cut
// before the mark, nothing more is published, and a job's Next finds nothing; a failed
// answer pauses the pool without purging; once the tag may be pooled again the pool
// fills up again.
func TestStreamExcludedTag(t *testing.T) {
	t.Parallel()
	ns := testenv.StartNATS(t)
	const subject = "leaf.pool.segment.orders"
	var mode atomic.Int32 // 0 pooled, 1 excluded, 2 unknown
	excluded := func(tag string) (bool, error) {
		if tag != "orders" {
			t.Errorf("Excluded asked about %q", tag)
		}
		switch mode.Load() {
		case 1:
			return true, nil
		case 2:
			return false, errors.New("marks not loaded")
		}
		return false, nil
	}
	s := mustNewStream(t, StreamConfig{
		JetStream: newJS(t, ns),
		Specs:     []Spec{{Kind: wire.Segment, Tag: "orders", Size: 10, Depth: 3}, {Kind: wire.Snowflake, Tag: "events", Size: 10, Depth: 2}},
		Segments:  &countingSource{}, Snowflakes: snowflakeFake{&countingSource{}}, Excluded: excluded,
	})
	testutil.Run(t, "Stream.Run", s.Run)
	js := newJS(t, ns)
	waitCount(t, js, subject, 3)

	mode.Store(2)
	waitStreamStats(t, s, 0, "a fill error while the answer is unknown", func(st StreamStats) bool { return st.FillErrors > 0 })
	if n := subjectCount(t, js, subject); n != 3 {
		t.Fatalf("the pool holds %d batches while the answer is unknown, want the 3 it had", n)
	}

	mode.Store(1)
	waitCount(t, js, subject, 0)
	published := s.Stats()[0].Published
	c := mustConsumer(t, js, wire.Segment, "orders")
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	if ids, err := c.Next(ctx); err == nil {
		t.Fatalf("a job took %d IDs of an excluded tag", len(ids))
	}
	if got := s.Stats()[0].Published; got != published {
		t.Fatalf("published %d batches after the tag was excluded", got-published)
	}
	waitCount(t, js, "leaf.pool.snowflake.events", 2) // other pools carry on

	mode.Store(0)
	waitCount(t, js, subject, 3)
}
