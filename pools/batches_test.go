package pools

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/leafbus/leafbus/internal/testutil"
	"github.com/leafbus/leafbus/snowflake"
	"github.com/leafbus/leafbus/wire"
)

// countingSource is a fake of both sources: consecutive IDs from 1, and an error
// instead while failWith is set. Pools are not a store, so a fake is honest here.
type countingSource struct {
	mu       sync.Mutex
	next     int64
	failWith error
	calls    int
}

func (s *countingSource) Fill(ctx context.Context, tag string, dst []int64) error {
	return s.fill(dst)
}

func (s *countingSource) fill(dst []int64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.calls++
	if s.failWith != nil {
		return s.failWith
	}
	for i := range dst {
		s.next++
		dst[i] = s.next
	}
	return nil
}

func (s *countingSource) setFail(err error) {
	s.mu.Lock()
	s.failWith = err
	s.mu.Unlock()
}

// snowflakeFake adapts countingSource to SnowflakeSource.
type snowflakeFake struct{ *countingSource }

func (s snowflakeFake) Fill(dst []int64) error { return s.fill(dst) }

// waitStats polls pool i's stats until ok says so, failing after 5s.
func waitStats(tb testing.TB, b *Batches, i int, what string, ok func(PoolStats) bool) PoolStats {
	tb.Helper()
	deadline := time.After(5 * time.Second)
	for {
		s := b.Stats()[i]
		if ok(s) {
			return s
		}
		select {
		case <-deadline:
			tb.Fatalf("pool %s:%s: waited 5s for %s; stats %+v", s.Kind, s.Tag, what, s)
		case <-time.After(2 * time.Millisecond):
		}
	}
}

func mustNew(tb testing.TB, cfg Config) *Batches {
	tb.Helper()
	if cfg.Logger == nil {
		cfg.Logger = testutil.Logger(tb)
	}
	b, err := New(cfg)
	if err != nil {
		tb.Fatalf("New: %v", err)
	}
	return b
}

// decodeReply reads a reply in enc and checks it holds n strictly increasing IDs.
func decodeReply(tb testing.TB, reply []byte, enc wire.Encoding, n int) []int64 {
	tb.Helper()
	ids, err := parseReply(reply, enc, n)
	if err != nil {
		tb.Fatal(err)
	}
	return ids
}

// parseReply is decodeReply for goroutines other than the test's.
func parseReply(reply []byte, enc wire.Encoding, n int) ([]int64, error) {
	var ids []int64
	if enc == wire.Binary {
		if len(reply) != 8*n {
			return nil, fmt.Errorf("binary reply of %d bytes, want %d", len(reply), 8*n)
		}
		for i := 0; i < len(reply); i += 8 {
			ids = append(ids, int64(binary.BigEndian.Uint64(reply[i:])))
		}
	} else {
		for _, f := range strings.Split(string(reply), "\n") {
			id, err := strconv.ParseInt(f, 10, 64)
			if err != nil {
				return nil, fmt.Errorf("text reply %q: field %q is not an ID", reply, f)
			}
			ids = append(ids, id)
		}
	}
	if len(ids) != n {
		return nil, fmt.Errorf("reply holds %d IDs, want %d", len(ids), n)
	}
	for i := 1; i < len(ids); i++ {
		if ids[i] <= ids[i-1] {
			return nil, fmt.Errorf("reply IDs not strictly increasing at %d: %d after %d", i, ids[i], ids[i-1])
		}
	}
	return ids, nil
}

func TestNew(t *testing.T) {
	seg := &countingSource{}
	sf := snowflakeFake{&countingSource{}}
	tests := []struct {
		name    string
		cfg     Config
		wantErr error
	}{
		{"OK", Config{Specs: []Spec{{wire.Segment, "a", 10, 2}, {wire.Snowflake, "a", 10, 2}}, Segments: seg, Snowflakes: sf}, nil},
		{"OK/NoPools", Config{}, nil},
		{"ErrInvalidPool/NoSegmentSource", Config{Specs: []Spec{{wire.Segment, "a", 10, 2}}, Snowflakes: sf}, ErrInvalidPool},
		{"ErrInvalidPool/NoSnowflakeSource", Config{Specs: []Spec{{wire.Snowflake, "a", 10, 2}}, Segments: seg}, ErrInvalidPool},
		{"ErrInvalidPool/Duplicate", Config{Specs: []Spec{{wire.Segment, "a", 10, 2}, {wire.Segment, "a", 5, 1}}, Segments: seg}, ErrInvalidPool},
		{"ErrInvalidPool/SizeZero", Config{Specs: []Spec{{wire.Segment, "a", 0, 2}}, Segments: seg}, ErrInvalidPool},
		{"ErrInvalidPool/SizeOverLimit", Config{Specs: []Spec{{wire.Segment, "a", wire.MaxBatchLimit + 1, 2}}, Segments: seg}, ErrInvalidPool},
		{"ErrInvalidPool/DepthZero", Config{Specs: []Spec{{wire.Segment, "a", 10, 0}}, Segments: seg}, ErrInvalidPool},
		{"ErrInvalidPool/DepthOverMax", Config{Specs: []Spec{{wire.Segment, "a", 10, MaxDepth + 1}}, Segments: seg}, ErrInvalidPool},
		{"ErrInvalidPool/BadTag", Config{Specs: []Spec{{wire.Segment, "a\nb", 10, 2}}, Segments: seg}, ErrInvalidPool},
		{"ErrInvalidPool/ConsumerNameTooLong", Config{Specs: []Spec{{wire.Segment, strings.Repeat("订", 28), 10, 2}}, Segments: seg}, ErrInvalidPool},
		{"OK/LeafTag", Config{Specs: []Spec{{wire.Segment, "order:create 订单", 10, 2}}, Segments: seg}, nil},
		{"ErrInvalidPool/BadKind", Config{Specs: []Spec{{wire.Kind(7), "a", 10, 2}}, Segments: seg}, ErrInvalidPool},
		{"ErrInvalidPool/NegativeIdle", Config{IdleAfter: -time.Second}, ErrInvalidPool},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := New(tt.cfg)
			if tt.wantErr == nil && err != nil {
				t.Fatalf("New() = %v, want nil", err)
			}
			if tt.wantErr != nil && !errors.Is(err, tt.wantErr) {
				t.Fatalf("New() = %v, want %v", err, tt.wantErr)
			}
		})
	}
}

// TestConfigValidate: DefaultConfig with sources is valid, and each refusal names the
// field, its value and the bound.
func TestConfigValidate(t *testing.T) {
	orders := Spec{wire.Segment, "orders", 10, 2}
	tests := []struct {
		name    string
		change  func(*Config)
		wantErr string // "" for OK
	}{
		{"OK", func(c *Config) {}, ""},
		{"OKNoPause", func(c *Config) { c.FillPause = 0 }, ""},
		{"ErrIdleAfter", func(c *Config) { c.IdleAfter = 0 }, "IdleAfter 0s must be > 0"},
		{"ErrFillPause", func(c *Config) { c.FillPause = -time.Millisecond }, "FillPause -1ms must be >= 0"},
		{"ErrNoSegmentSource", func(c *Config) { c.Segments = nil }, "pool segment:orders:10:2: no segment source (Segments is nil)"},
		{"ErrDuplicate", func(c *Config) { c.Specs = append(c.Specs, Spec{wire.Segment, "orders", 5, 1}) }, "segment:orders is already configured as segment:orders:10:2"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := DefaultConfig()
			cfg.Specs, cfg.Segments = []Spec{orders}, &countingSource{}
			tt.change(&cfg)
			var wantIs error
			if tt.wantErr != "" {
				wantIs = ErrInvalidPool
			}
			testutil.CheckErr(t, "Validate()", cfg.Validate(), wantIs, tt.wantErr)
		})
	}
}

// TestTake checks that Take hands over exactly the prepared bytes, in the encoding
// asked for, once, and declines what is not the pool's shape.
func TestTake(t *testing.T) {
	src := &countingSource{}
	b := mustNew(t, Config{Specs: []Spec{{wire.Segment, "orders", 5, 3}}, Segments: src})
	if _, ok := b.Take(wire.Segment, "orders", 5, wire.Text); ok {
		t.Fatalf("Take before Run: ok=true, want false (nothing filled yet)")
	}
	testutil.Run(t, "Batches.Run", b.Run)
	waitStats(t, b, 0, "3 ready batches", func(s PoolStats) bool { return s.Ready == 3 })

	declined := []struct {
		name string
		kind wire.Kind
		tag  string
		n    int
	}{
		{"OtherSize", wire.Segment, "orders", 4},
		{"OtherTag", wire.Segment, "users", 5},
		{"OtherKind", wire.Snowflake, "orders", 5},
		{"One", wire.Segment, "orders", 1},
	}
	for _, d := range declined {
		if reply, ok := b.Take(d.kind, d.tag, d.n, wire.Text); ok {
			t.Errorf("%s: Take(%v, %q, %d) = %q, true; want false", d.name, d.kind, d.tag, d.n, reply)
		}
	}

	// The first batches were filled in order: 1..5, then 6..10, then 11..15.
	tests := []struct {
		enc  wire.Encoding
		want []byte
	}{
		{wire.Text, []byte("1\n2\n3\n4\n5")},
		{wire.Binary, []byte{0, 0, 0, 0, 0, 0, 0, 6, 0, 0, 0, 0, 0, 0, 0, 7, 0, 0, 0, 0, 0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0, 9, 0, 0, 0, 0, 0, 0, 0, 10}},
		{wire.Text, []byte("11\n12\n13\n14\n15")},
	}
	for i, tt := range tests {
		got, ok := b.Take(wire.Segment, "orders", 5, tt.enc)
		if !ok || string(got) != string(tt.want) {
			t.Fatalf("Take #%d (%v) = %q, %v; want %q, true", i, tt.enc, got, ok, tt.want)
		}
		if cap(got) != len(got) && tt.enc == wire.Binary {
			t.Fatalf("Take #%d binary reply has cap %d > len %d: appending would overwrite the text", i, cap(got), len(got))
		}
	}
	s := waitStats(t, b, 0, "3 taken and refilled", func(s PoolStats) bool { return s.Taken == 3 && s.Ready == 3 })
	if s.Filled != 6 {
		t.Fatalf("Stats().Filled = %d, want 6 (3 taken + 3 ready)", s.Filled)
	}
	// The refills continue after 15: nothing handed out is ever prepared again.
	got, ok := b.Take(wire.Segment, "orders", 5, wire.Text)
	if !ok || string(got) != "16\n17\n18\n19\n20" {
		t.Fatalf("Take after refill = %q, %v; want \"16\\n17\\n18\\n19\\n20\", true", got, ok)
	}
}

// TestTakeConcurrent takes from many goroutines while the filler refills: no batch is
// handed out twice and no ID appears in two replies.
func TestTakeConcurrent(t *testing.T) {
	const size, want = 50, 2000 // batches
	src := &countingSource{}
	sf := snowflakeFake{&countingSource{next: 1 << 40}}
	b := mustNew(t, Config{
		Specs:      []Spec{{wire.Segment, "orders", size, 8}, {wire.Snowflake, "orders", size, 8}},
		Segments:   src,
		Snowflakes: sf,
		FillPause:  time.Microsecond,
	})
	testutil.Run(t, "Batches.Run", b.Run)

	var (
		mu    sync.Mutex
		seen  = make(map[int64]bool, 2*want*size)
		total int
	)
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	deadline := time.Now().Add(15 * time.Second)
	for g := range 16 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			kind := wire.Kind(g % 2)
			enc := wire.Encoding(g / 2 % 2)
			for time.Now().Before(deadline) {
				mu.Lock()
				done := total >= want
				mu.Unlock()
				if done {
					return
				}
				reply, ok := b.Take(kind, "orders", size, enc)
				if !ok {
					time.Sleep(10 * time.Microsecond)
					continue
				}
				ids, err := parseReply(reply, enc, size)
				if err != nil {
					errs <- err
					return
				}
				mu.Lock()
				total++
				for _, id := range ids {
					if seen[id] {
						mu.Unlock()
						errs <- fmt.Errorf("ID %d handed out twice", id)
						return
					}
					seen[id] = true
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if total < want {
		t.Fatalf("took %d batches within 15s, want %d", total, want)
	}
	for _, s := range b.Stats() {
		if s.Ready > s.Depth {
			t.Fatalf("pool %s: %d ready, above its depth %d", s.Kind, s.Ready, s.Depth)
		}
	}
}

// TestAdaptive: an idle pool halves its target down to one batch, dropping the
// batches above it; Takes that find it empty raise the target back to Depth.
func TestAdaptive(t *testing.T) {
	src := &countingSource{}
	b := mustNew(t, Config{
		Specs:     []Spec{{wire.Segment, "orders", 10, 16}},
		Segments:  src,
		IdleAfter: 20 * time.Millisecond,
	})
	testutil.Run(t, "Batches.Run", b.Run)
	s := waitStats(t, b, 0, "target lowered to 1", func(s PoolStats) bool { return s.Target == 1 && s.Ready <= 1 })
	if s.Dropped == 0 {
		t.Fatalf("idle pool lowered its target without dropping a batch: %+v", s)
	}
	// Drain it faster than it refills: each empty Take raises the target.
	deadline := time.After(5 * time.Second)
	for b.Stats()[0].Target < 16 {
		b.Take(wire.Segment, "orders", 10, wire.Binary)
		select {
		case <-deadline:
			t.Fatalf("target never rose back to the depth under demand: %+v", b.Stats()[0])
		default:
		}
	}
	s = waitStats(t, b, 0, "a raised pool refilled", func(s PoolStats) bool { return s.Ready >= 8 })
	if s.Ready > s.Depth {
		t.Fatalf("ready %d above depth %d", s.Ready, s.Depth)
	}
}

// TestFillErrors: a failing source is counted and retried; the pool answers ok=false
// (so the service takes its normal path) until the source works again.
func TestFillErrors(t *testing.T) {
	errStore := errors.New("store down")
	src := &countingSource{failWith: errStore}
	b := mustNew(t, Config{Specs: []Spec{{wire.Segment, "orders", 10, 4}}, Segments: src})
	testutil.Run(t, "Batches.Run", b.Run)
	s := waitStats(t, b, 0, "fill errors counted", func(s PoolStats) bool { return s.FillErrors >= 2 })
	if !strings.Contains(s.LastError, "store down") {
		t.Fatalf("Stats().LastError = %q, want it to name the source's error", s.LastError)
	}
	if reply, ok := b.Take(wire.Segment, "orders", 10, wire.Text); ok {
		t.Fatalf("Take with a failing source = %q, true; want false", reply)
	}
	src.setFail(nil)
	waitStats(t, b, 0, "refilled after the source recovered", func(s PoolStats) bool { return s.Ready == 4 })
	if reply, ok := b.Take(wire.Segment, "orders", 10, wire.Text); !ok {
		t.Fatalf("Take after recovery = %q, false; want a batch", reply)
	}
}

// TestRun: Run returns when its context ends, even while a source keeps failing, and
// refuses a second call.
func TestRun(t *testing.T) {
	src := &countingSource{failWith: errors.New("down")}
	b := mustNew(t, Config{Specs: []Spec{{wire.Segment, "a", 10, 4}, {wire.Snowflake, "a", 10, 4}}, Segments: src, Snowflakes: snowflakeFake{&countingSource{}}})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- b.Run(ctx) }()
	waitStats(t, b, 1, "snowflake pool full", func(s PoolStats) bool { return s.Ready == 4 })
	if err := b.Run(ctx); err == nil {
		t.Fatalf("second Run = nil, want an error")
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run = %v, want nil", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatalf("Run did not return within 5s of cancel")
	}
	// Batches ready when the fillers stopped are still valid IDs and stay takeable.
	if _, ok := b.Take(wire.Snowflake, "a", 10, wire.Text); !ok {
		t.Fatalf("Take after Run returned: ok=false, want the batch still ready")
	}
}

// TestSnowflakeBorrowed: with a real generator allowed to borrow and a clock that does
// not move, batches of more than one millisecond's sequence are cut ahead of the clock,
// and Stats shows how far.
func TestSnowflakeBorrowed(t *testing.T) {
	clock := snowflake.NewFakeClock(time.Date(2026, 11, 23, 0, 0, 0, 0, time.UTC))
	gen, err := snowflake.New(snowflake.Config{WorkerID: 3, Clock: clock, BorrowMax: time.Second, DenseSequence: true})
	if err != nil {
		t.Fatalf("snowflake.New: %v", err)
	}
	b := mustNew(t, Config{Specs: []Spec{{wire.Snowflake, "etl", 10000, 4}}, Snowflakes: gen})
	testutil.Run(t, "Batches.Run", b.Run)
	s := waitStats(t, b, 0, "4 ready", func(s PoolStats) bool { return s.Ready == 4 })
	// 4 batches of 10000 at 4096 per millisecond need 10 milliseconds (9 borrowed).
	if s.Borrowed < 9*time.Millisecond || s.Borrowed > time.Second {
		t.Fatalf("Stats().Borrowed = %v, want 9ms..1s", s.Borrowed)
	}
	seen := make(map[int64]bool, 40000)
	for range 4 {
		reply, ok := b.Take(wire.Snowflake, "etl", 10000, wire.Binary)
		if !ok {
			t.Fatalf("Take: ok=false, want a batch")
		}
		for _, id := range decodeReply(t, reply, wire.Binary, 10000) {
			if seen[id] {
				t.Fatalf("ID %d twice", id)
			}
			seen[id] = true
		}
	}
}

// TestTakeAllocs: Take allocates nothing, whether it finds a batch or not.
func TestTakeAllocs(t *testing.T) {
	b := mustNew(t, Config{Specs: []Spec{{wire.Segment, "orders", 10, MaxDepth}}, Segments: &countingSource{}})
	p := b.pools[poolKey{wire.Segment, "orders"}]
	batch, _ := prepare([]int64{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, nil, true)
	for range MaxDepth {
		p.ready <- batch
	}
	hit := testing.AllocsPerRun(1000, func() { b.Take(wire.Segment, "orders", 10, wire.Text) })
	for len(p.ready) > 0 {
		<-p.ready
	}
	miss := testing.AllocsPerRun(1000, func() { b.Take(wire.Segment, "orders", 10, wire.Text) })
	if hit != 0 || miss != 0 {
		t.Fatalf("Take allocates %v per call with a batch ready, %v without; want 0", hit, miss)
	}
}

func TestPrepare(t *testing.T) {
	tests := []struct {
		name     string
		ids      []int64
		withText bool
		want     string
	}{
		{"One", []int64{1001}, true, "\x00\x00\x00\x00\x00\x00\x03\xe9" + "1001"},
		{"Two", []int64{1, 9223372036854775807}, true, "\x00\x00\x00\x00\x00\x00\x00\x01\x7f\xff\xff\xff\xff\xff\xff\xff" + "1\n9223372036854775807"},
		{"BinaryOnly", []int64{1, 2}, false, "\x00\x00\x00\x00\x00\x00\x00\x01\x00\x00\x00\x00\x00\x00\x00\x02"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, _ := prepare(tt.ids, []byte("stale scratch"), tt.withText)
			if string(got) != tt.want || cap(got) != len(got) {
				t.Fatalf("prepare(%v, withText=%v) = %q (cap %d), want %q (exact capacity)", tt.ids, tt.withText, got, cap(got), tt.want)
			}
		})
	}
}

func benchIDs(n int) []int64 {
	ids := make([]int64, n)
	base := int64(1_860_000_000_000_000_000) // a snowflake-sized ID: the longest text
	for i := range ids {
		ids[i] = base + int64(i)
	}
	return ids
}

// BenchmarkPrepare is the background cost of one ready batch of 1000 IDs, per ID.
func BenchmarkPrepare(b *testing.B) {
	ids := benchIDs(1000)
	for _, bc := range []struct {
		name string
		run  func(dst []byte) []byte
	}{
		{"Text", func(dst []byte) []byte { return wire.AppendIDs(dst[:0], ids, wire.Text) }},
		{"Binary", func(dst []byte) []byte { return wire.AppendIDs(dst[:0], ids, wire.Binary) }},
		{"Batch/BinaryOnly", func(dst []byte) []byte { batch, _ := prepare(ids, dst, false); return batch }},
		{"Batch/Both", func(dst []byte) []byte { batch, _ := prepare(ids, dst, true); return batch }},
	} {
		b.Run(bc.name, func(b *testing.B) {
			b.ReportAllocs()
			dst := make([]byte, 0, 20*len(ids))
			for b.Loop() {
				bc.run(dst)
			}
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*len(ids)), "ns/ID")
		})
	}
}

// BenchmarkTake is the request path's cost of a pooled reply.
func BenchmarkTake(b *testing.B) {
	bt := mustNew(b, Config{Specs: []Spec{{wire.Segment, "orders", 1000, MaxDepth}}, Segments: &countingSource{}})
	p := bt.pools[poolKey{wire.Segment, "orders"}]
	batch, _ := prepare(benchIDs(1000), nil, false)
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if len(p.ready) == 0 {
			b.StopTimer()
			for range MaxDepth {
				p.ready <- batch
			}
			b.StartTimer()
		}
		if _, ok := bt.Take(wire.Segment, "orders", 1000, wire.Binary); !ok {
			b.Fatal("Take: ok=false")
		}
	}
}
