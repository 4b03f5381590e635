package snowflake_test

import (
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/leafbus/leafbus/internal/testutil"
	"github.com/leafbus/leafbus/snowflake"
)

// t0 falls on a millisecond boundary; tests add sub-millisecond offsets where they matter.
var t0 = time.Date(2025, 11, 22, 6, 20, 0, 0, time.UTC)

var ms0 = t0.UnixMilli()

// recClock is a FakeClock that records every Sleep and lets a test decide how far a sleep
// really moves the clock, or act during it.
type recClock struct {
	*snowflake.FakeClock
	mu      sync.Mutex
	sleeps  []time.Duration
	onSleep func(c *recClock, d time.Duration) // nil: advance by d
}

func newRecClock(t time.Time) *recClock { return &recClock{FakeClock: snowflake.NewFakeClock(t)} }

func (c *recClock) Sleep(d time.Duration) {
	c.mu.Lock()
	c.sleeps = append(c.sleeps, d)
	on := c.onSleep
	c.mu.Unlock()
	if on != nil {
		on(c, d)
		return
	}
	c.FakeClock.Sleep(d)
}

func (c *recClock) Sleeps() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.sleeps)
}

// fixedRand returns a Rand that always answers v and records the bounds it was asked for.
func fixedRand(v int, asked *[]int) func(int) int {
	return func(n int) int {
		if asked != nil {
			*asked = append(*asked, n)
		}
		return v
	}
}

func newGen(tb testing.TB, cfg snowflake.Config) *snowflake.Generator {
	tb.Helper()
	g, err := snowflake.New(cfg)
	if err != nil {
		tb.Fatalf("New(%+v): %v", cfg, err)
	}
	return g
}

// next calls g.Next and decodes the ID, failing tb on any error.
func next(tb testing.TB, g *snowflake.Generator) snowflake.Decoded {
	tb.Helper()
	id, err := g.Next()
	if err != nil {
		tb.Fatalf("Next(): %v", err)
	}
	d, err := g.Layout().Decode(id)
	if err != nil {
		tb.Fatalf("Decode(%d): %v", id, err)
	}
	return d
}

// fill calls g.Fill for n IDs and checks they are strictly increasing.
func fill(tb testing.TB, g *snowflake.Generator, n int) []int64 {
	tb.Helper()
	ids := make([]int64, n)
	if err := g.Fill(ids); err != nil {
		tb.Fatalf("Fill(%d): %v", n, err)
	}
	checkIncreasing(tb, ids)
	return ids
}

func checkIncreasing(tb testing.TB, ids []int64) {
	tb.Helper()
	for i := 1; i < len(ids); i++ {
		if ids[i] <= ids[i-1] {
			tb.Fatalf("ids[%d] = %d after ids[%d] = %d: not strictly increasing", i, ids[i], i-1, ids[i-1])
		}
	}
}

func decode(tb testing.TB, l snowflake.Layout, id int64) snowflake.Decoded {
	tb.Helper()
	d, err := l.Decode(id)
	if err != nil {
		tb.Fatalf("Decode(%d): %v", id, err)
	}
	return d
}

func TestNew(t *testing.T) {
	def := snowflake.DefaultLayout()
	tests := []struct {
		name    string
		cfg     snowflake.Config
		wantErr error
		wantMsg string
	}{
		{name: "OK/zeroConfig", cfg: snowflake.Config{}},
		{name: "OK/maxWorker", cfg: snowflake.Config{WorkerID: 1023}},
		{name: "OK/maxBackwardWait1s", cfg: snowflake.Config{MaxBackwardWait: time.Second}},
		{name: "OK/floorJustBelowEnd", cfg: snowflake.Config{Floor: def.MaxTimestamp() - 1}},
		{name: "OK/otherLayout", cfg: snowflake.Config{Layout: snowflake.Layout{Epoch: 0, TimeBits: 43, WorkerBits: 8, SequenceBits: 12}, WorkerID: 255}},
		{name: "ErrInvalidConfig/layout", cfg: snowflake.Config{Layout: snowflake.Layout{Epoch: 1}}, wantErr: snowflake.ErrInvalidConfig, wantMsg: "TimeBits is 0"},
		{name: "ErrInvalidConfig/negativeWorker", cfg: snowflake.Config{WorkerID: -1}, wantErr: snowflake.ErrInvalidConfig, wantMsg: "WorkerID is -1, must be 0 to 1023"},
		{name: "ErrInvalidConfig/workerTooLarge", cfg: snowflake.Config{WorkerID: 1024}, wantErr: snowflake.ErrInvalidConfig, wantMsg: "WorkerID is 1024, must be 0 to 1023 with 10 worker bits"},
		{
			name:    "ErrInvalidConfig/workerOfOtherLayout",
			cfg:     snowflake.Config{Layout: snowflake.Layout{Epoch: 0, TimeBits: 43, WorkerBits: 8, SequenceBits: 12}, WorkerID: 256},
			wantErr: snowflake.ErrInvalidConfig, wantMsg: "WorkerID is 256, must be 0 to 255",
		},
		{name: "ErrInvalidConfig/negativeBackwardWait", cfg: snowflake.Config{MaxBackwardWait: -time.Millisecond}, wantErr: snowflake.ErrInvalidConfig, wantMsg: "MaxBackwardWait is -1ms, must be 0 to 1s"},
		{name: "ErrInvalidConfig/longBackwardWait", cfg: snowflake.Config{MaxBackwardWait: time.Second + 1}, wantErr: snowflake.ErrInvalidConfig, wantMsg: "MaxBackwardWait is 1.000000001s"},
		{name: "ErrInvalidConfig/negativeBorrow", cfg: snowflake.Config{BorrowMax: -1}, wantErr: snowflake.ErrInvalidConfig, wantMsg: "BorrowMax is -1ns, must be at least 0"},
		{name: "ErrInvalidConfig/negativeFloor", cfg: snowflake.Config{Floor: -1}, wantErr: snowflake.ErrInvalidConfig, wantMsg: "Floor is -1"},
		{name: "ErrInvalidConfig/floorAtEnd", cfg: snowflake.Config{Floor: def.MaxTimestamp()}, wantErr: snowflake.ErrInvalidConfig, wantMsg: "2080-07-10T17:30:30.208Z"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g, err := snowflake.New(tt.cfg)
			testutil.CheckErr(t, "New()", err, tt.wantErr, tt.wantMsg)
			if err != nil {
				return
			}
			wantLayout := tt.cfg.Layout
			if wantLayout == (snowflake.Layout{}) {
				wantLayout = def
			}
			if g.Layout() != wantLayout || g.WorkerID() != tt.cfg.WorkerID || g.Issued() != tt.cfg.Floor {
				t.Errorf("New() = layout %+v, worker %d, issued %d; want %+v, %d, %d",
					g.Layout(), g.WorkerID(), g.Issued(), wantLayout, tt.cfg.WorkerID, tt.cfg.Floor)
			}
		})
	}
}

func TestDecodeRoundTrip(t *testing.T) {
	tests := []struct {
		name   string
		layout snowflake.Layout
		worker int64
	}{
		{name: "default/worker0", layout: snowflake.DefaultLayout(), worker: 0},
		{name: "default/worker3", layout: snowflake.DefaultLayout(), worker: 3},
		{name: "default/worker1023", layout: snowflake.DefaultLayout(), worker: 1023},
		{name: "unixEpoch/42+5+16", layout: snowflake.Layout{Epoch: 0, TimeBits: 42, WorkerBits: 5, SequenceBits: 16}, worker: 17},
		{name: "recentEpoch/41+12+10", layout: snowflake.Layout{Epoch: ms0 - 1000, TimeBits: 41, WorkerBits: 12, SequenceBits: 10}, worker: 4095},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clock := snowflake.NewFakeClock(t0.Add(400 * time.Microsecond))
			g := newGen(t, snowflake.Config{Layout: tt.layout, WorkerID: tt.worker, Clock: clock, Rand: fixedRand(42, nil)})
			for i, want := range []snowflake.Decoded{
				{Timestamp: ms0, WorkerID: tt.worker, Sequence: 42},
				{Timestamp: ms0, WorkerID: tt.worker, Sequence: 43},
				{Timestamp: ms0 + 7, WorkerID: tt.worker, Sequence: 42},
			} {
				if i == 2 {
					clock.Add(7 * time.Millisecond)
				}
				got := next(t, g)
				want.ID = got.ID
				if got != want {
					t.Fatalf("call %d: Decode(Next()) = %+v, want %+v", i, got, want)
				}
				if got.Time() != time.UnixMilli(want.Timestamp).UTC() {
					t.Errorf("call %d: Time() = %v", i, got.Time())
				}
			}
		})
	}
}

func TestSequenceStart(t *testing.T) {
	tests := []struct {
		name      string
		layout    snowflake.Layout
		dense     bool
		rand      int
		wantStart int64
		wantAsked []int // the bounds Rand was called with
	}{
		{name: "random", layout: snowflake.DefaultLayout(), rand: 37, wantStart: 37, wantAsked: []int{100, 100}},
		{name: "randomHighest", layout: snowflake.DefaultLayout(), rand: 99, wantStart: 99, wantAsked: []int{100, 100}},
		{name: "dense", layout: snowflake.DefaultLayout(), dense: true, rand: 37, wantStart: 0},
		{name: "randomOutOfRange", layout: snowflake.DefaultLayout(), rand: 100, wantStart: 0, wantAsked: []int{100, 100}},
		{name: "randomNegative", layout: snowflake.DefaultLayout(), rand: -5, wantStart: 0, wantAsked: []int{100, 100}},
		// With 3 sequence bits (8 per ms) the start is kept within the first half of the ms.
		{name: "smallSequence", layout: snowflake.Layout{Epoch: 0, TimeBits: 41, WorkerBits: 19, SequenceBits: 3}, rand: 3, wantStart: 3, wantAsked: []int{4, 4}},
		{name: "oneSequenceBit", layout: snowflake.Layout{Epoch: 0, TimeBits: 41, WorkerBits: 21, SequenceBits: 1}, rand: 1, wantStart: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var asked []int
			clock := snowflake.NewFakeClock(t0)
			g := newGen(t, snowflake.Config{Layout: tt.layout, Clock: clock, DenseSequence: tt.dense, Rand: fixedRand(tt.rand, &asked)})
			// The first millisecond starts at the start and is usable to its end.
			left := int(tt.layout.MaxSequence() - tt.wantStart + 1)
			ids := fill(t, g, left)
			first, last := decode(t, tt.layout, ids[0]), decode(t, tt.layout, ids[len(ids)-1])
			if first.Sequence != tt.wantStart || first.Timestamp != ms0 {
				t.Errorf("first ID %+v, want sequence %d at %d", first, tt.wantStart, ms0)
			}
			if last.Sequence != tt.layout.MaxSequence() || last.Timestamp != ms0 {
				t.Errorf("ID %d of the ms: %+v, want sequence %d at %d", left, last, tt.layout.MaxSequence(), ms0)
			}
			// The next millisecond starts the same way.
			clock.Add(time.Millisecond)
			if d := next(t, g); d.Sequence != tt.wantStart || d.Timestamp != ms0+1 {
				t.Errorf("first ID of the next ms %+v, want sequence %d at %d", d, tt.wantStart, ms0+1)
			}
			if !slices.Equal(asked, tt.wantAsked) {
				t.Errorf("Rand called with %v, want %v", asked, tt.wantAsked)
			}
		})
	}
}

func TestSequenceExhaustion(t *testing.T) {
	tests := []struct {
		name       string
		offset     time.Duration // of the clock past t0
		borrow     time.Duration
		fills      []int           // Fill calls (all succeed)
		wantSleeps []time.Duration // during the fills, then one Next
		wantLastTS int64           // Issued after the fills
		wantNextTS int64           // of the Next after them
	}{
		{
			name: "waitsForNextMs", offset: 300 * time.Microsecond,
			fills:      []int{4096},
			wantSleeps: []time.Duration{700 * time.Microsecond}, wantLastTS: ms0, wantNextTS: ms0 + 1,
		},
		{
			name: "fillSpansMs", offset: 250 * time.Microsecond,
			fills:      []int{10000},
			wantSleeps: []time.Duration{750 * time.Microsecond, time.Millisecond}, wantLastTS: ms0 + 2, wantNextTS: ms0 + 2,
		},
		{
			name: "borrowsUpToBorrowMax", offset: 250 * time.Microsecond, borrow: 2 * time.Millisecond,
			fills:      []int{4096, 4096, 4096},
			wantSleeps: []time.Duration{750 * time.Microsecond}, wantLastTS: ms0 + 2, wantNextTS: ms0 + 3,
		},
		{
			name: "borrowRoundsDown", offset: 0, borrow: 1999 * time.Microsecond,
			fills:      []int{8192},
			wantSleeps: []time.Duration{time.Millisecond}, wantLastTS: ms0 + 1, wantNextTS: ms0 + 2,
		},
		{
			name: "borrowOneFill", offset: 0, borrow: 3 * time.Millisecond,
			fills:      []int{4096 * 4},
			wantSleeps: []time.Duration{time.Millisecond}, wantLastTS: ms0 + 3, wantNextTS: ms0 + 4,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clock := newRecClock(t0.Add(tt.offset))
			g := newGen(t, snowflake.Config{Clock: clock, DenseSequence: true, BorrowMax: tt.borrow})
			var all []int64
			for _, n := range tt.fills {
				all = append(all, fill(t, g, n)...)
				if ahead := g.Issued() - clock.Now().UnixMilli(); time.Duration(ahead)*time.Millisecond > tt.borrow {
					t.Fatalf("Issued() %d is %dms ahead of the clock, more than BorrowMax %v", g.Issued(), ahead, tt.borrow)
				}
			}
			if got := g.Issued(); got != tt.wantLastTS {
				t.Errorf("Issued() after the fills = %d, want %d", got, tt.wantLastTS)
			}
			d := next(t, g)
			all = append(all, d.ID)
			checkIncreasing(t, all)
			if d.Timestamp != tt.wantNextTS {
				t.Errorf("Next() after the fills at %d, want %d", d.Timestamp, tt.wantNextTS)
			}
			if got := clock.Sleeps(); !slices.Equal(got, tt.wantSleeps) {
				t.Errorf("slept %v, want %v", got, tt.wantSleeps)
			}
			// Every ID of a spent ms was used: the dense sequence leaves no gap.
			for i, id := range all[:len(all)-1] {
				if want := decode(t, g.Layout(), all[0]).Timestamp + int64(i/4096); decode(t, g.Layout(), id).Timestamp != want {
					t.Fatalf("ID %d is at %d, want %d", i, decode(t, g.Layout(), id).Timestamp, want)
				}
			}
		})
	}
}

func TestBorrowedAheadOfClock(t *testing.T) {
	// A clock behind the borrowed timestamp but not behind its own highest reading is no
	// backwards step: the generator keeps issuing from the borrowed ms on.
	clock := newRecClock(t0)
	g := newGen(t, snowflake.Config{Clock: clock, DenseSequence: true, BorrowMax: 5 * time.Millisecond})
	fill(t, g, 4096*3)
	if s := g.Stats(); s.Issued != ms0+2 || s.Borrowed != 2*time.Millisecond || s.Offset != 0 {
		t.Fatalf("Stats() = %+v, want Issued %d, Borrowed 2ms, Offset 0", s, ms0+2)
	}
	d := next(t, g)
	if d.Timestamp != ms0+3 || d.Sequence != 0 {
		t.Errorf("Next() = %+v, want sequence 0 at %d", d, ms0+3)
	}
	clock.Add(time.Millisecond)
	if d2 := next(t, g); d2.Timestamp != ms0+3 || d2.Sequence != 1 {
		t.Errorf("Next() = %+v, want sequence 1 at %d", d2, ms0+3)
	}
	clock.Add(10 * time.Millisecond)
	if s := g.Stats(); s.Borrowed != 0 {
		t.Errorf("Stats().Borrowed = %v once the clock passed, want 0", s.Borrowed)
	}
	if got := clock.Sleeps(); len(got) != 0 {
		t.Errorf("slept %v, want no sleep", got)
	}
}

func TestClockBackwards(t *testing.T) {
	tests := []struct {
		name       string
		maxWait    time.Duration
		back       time.Duration
		onSleep    func(c *recClock, d time.Duration)
		wantSleeps []time.Duration
		wantTS     int64 // of the ID after the step
		wantErr    error
		wantMsg    string
	}{
		{name: "OK/1ms", back: time.Millisecond, wantSleeps: []time.Duration{2 * time.Millisecond}, wantTS: ms0 + 1},
		{name: "OK/5ms", back: 5 * time.Millisecond, wantSleeps: []time.Duration{10 * time.Millisecond}, wantTS: ms0 + 5},
		{name: "OK/intoPreviousMs", back: 700 * time.Microsecond, wantSleeps: []time.Duration{2 * time.Millisecond}, wantTS: ms0 + 1},
		{name: "OK/withinSameMs", back: 300 * time.Microsecond, wantTS: ms0},
		{name: "OK/12msWithLongerWait", maxWait: 20 * time.Millisecond, back: 12 * time.Millisecond, wantSleeps: []time.Duration{24 * time.Millisecond}, wantTS: ms0 + 12},
		{
			name: "ErrClockBackwards/6ms", back: 6 * time.Millisecond,
			wantErr: snowflake.ErrClockBackwards, wantMsg: "clock moved backwards by 6ms, more than the 5ms it waits out",
		},
		{name: "ErrClockBackwards/12ms", back: 12 * time.Millisecond, wantErr: snowflake.ErrClockBackwards, wantMsg: "by 12ms"},
		{name: "ErrClockBackwards/1h", back: time.Hour, wantErr: snowflake.ErrClockBackwards, wantMsg: "by 3600000ms"},
		{name: "ErrClockBackwards/waitDisabled", maxWait: time.Nanosecond, back: time.Millisecond, wantErr: snowflake.ErrClockBackwards, wantMsg: "by 1ms"},
		{
			name: "ErrClockBackwards/stillBehind", back: 3 * time.Millisecond,
			onSleep:    func(c *recClock, d time.Duration) { c.Add(time.Millisecond) },
			wantSleeps: []time.Duration{6 * time.Millisecond},
			wantErr:    snowflake.ErrClockBackwards, wantMsg: "clock moved backwards by 3ms, still 2ms behind after waiting 6ms",
		},
		{
			name: "ErrClockBackwards/steppedAgainWhileWaiting", back: 2 * time.Millisecond,
			onSleep:    func(c *recClock, d time.Duration) { c.Add(-time.Second) },
			wantSleeps: []time.Duration{4 * time.Millisecond},
			wantErr:    snowflake.ErrClockBackwards, wantMsg: "still 1002ms behind",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clock := newRecClock(t0.Add(500 * time.Microsecond))
			g := newGen(t, snowflake.Config{Clock: clock, MaxBackwardWait: tt.maxWait})
			first := next(t, g)
			clock.Add(-tt.back)
			clock.onSleep = tt.onSleep
			id, err := g.Next()
			testutil.CheckErr(t, "Next() after the step", err, tt.wantErr, tt.wantMsg)
			if got := clock.Sleeps(); !slices.Equal(got, tt.wantSleeps) {
				t.Errorf("slept %v, want %v", got, tt.wantSleeps)
			}
			if err != nil {
				if id != 0 {
					t.Errorf("Next() = %d with error, want 0", id)
				}
				if s := g.Stats(); s.Refused != 1 || s.Offset <= 0 || s.Issued != ms0 {
					t.Errorf("Stats() = %+v, want Refused 1, an Offset, Issued %d", s, ms0)
				}
				return
			}
			d := decode(t, g.Layout(), id)
			if d.Timestamp != tt.wantTS || d.ID <= first.ID {
				t.Errorf("Next() after the step = %+v, want timestamp %d and above %d", d, tt.wantTS, first.ID)
			}
		})
	}
}

func TestClockBackwardsRefusedUntilCaughtUp(t *testing.T) {
	clock := newRecClock(t0)
	g := newGen(t, snowflake.Config{Clock: clock, DenseSequence: true})
	before := fill(t, g, 10) // sequences 0..9 at ms0
	clock.Add(-100 * time.Millisecond)
	for _, step := range []struct {
		add     time.Duration
		wantMsg string
	}{
		{0, "by 100ms"},
		{50 * time.Millisecond, "by 50ms"},
		{44 * time.Millisecond, "by 6ms"},
	} {
		clock.Add(step.add)
		_, err := g.Next()
		testutil.CheckErr(t, "Next()", err, snowflake.ErrClockBackwards, step.wantMsg)
		ids := make([]int64, 3)
		err = g.Fill(ids)
		testutil.CheckErr(t, "Fill()", err, snowflake.ErrClockBackwards, step.wantMsg)
		if ids[0] != 0 || ids[2] != 0 {
			t.Fatalf("Fill() left %v in dst on error, want zeros", ids)
		}
	}
	if s := g.Stats(); s.Refused != 6 || s.Offset != 6*time.Millisecond || s.Issued != ms0 {
		t.Errorf("Stats() = %+v, want Refused 6, Offset 6ms, Issued %d", s, ms0)
	}
	if len(clock.Sleeps()) != 0 {
		t.Errorf("slept %v while refusing, want nothing", clock.Sleeps())
	}
	// Back at the highest reading: the same millisecond goes on where it stopped.
	clock.Add(6 * time.Millisecond)
	d := next(t, g)
	if d.Timestamp != ms0 || d.Sequence != 10 || d.ID <= before[len(before)-1] {
		t.Errorf("Next() once caught up = %+v, want sequence 10 at %d", d, ms0)
	}
	if s := g.Stats(); s.Offset != 0 {
		t.Errorf("Stats().Offset = %v once caught up, want 0", s.Offset)
	}
}

func TestFloor(t *testing.T) {
	tests := []struct {
		name    string
		layout  snowflake.Layout
		floor   int64
		clock   time.Time
		wantTS  int64 // 0: refused
		wantMsg string
	}{
		{name: "ErrClockBackwards/behindFloor", floor: ms0 + 5, clock: t0, wantMsg: "clock reads 1763792400000, 6ms short of passing the floor 1763792400005"},
		{name: "ErrClockBackwards/atFloor", floor: ms0 + 5, clock: t0.Add(5*time.Millisecond + 999*time.Microsecond), wantMsg: "1ms short of passing the floor"},
		{name: "OK/pastFloor", floor: ms0 + 5, clock: t0.Add(6 * time.Millisecond), wantTS: ms0 + 6},
		{name: "OK/noFloor", clock: t0, wantTS: ms0},
		{
			name: "ErrClockBackwards/beforeEpoch", layout: snowflake.Layout{Epoch: ms0 + 10, TimeBits: 41, WorkerBits: 10, SequenceBits: 12},
			clock: t0, wantMsg: "11ms short of passing the layout's epoch",
		},
		{
			name: "ErrClockBackwards/atEpoch", layout: snowflake.Layout{Epoch: ms0, TimeBits: 41, WorkerBits: 10, SequenceBits: 12},
			clock: t0, wantMsg: "1ms short of passing the layout's epoch",
		},
		{
			name: "OK/pastEpoch", layout: snowflake.Layout{Epoch: ms0 - 1, TimeBits: 41, WorkerBits: 10, SequenceBits: 12},
			clock: t0, wantTS: ms0,
		},
		{name: "ErrClockBackwards/before1970", clock: time.UnixMilli(-5), wantMsg: "clock reads -5"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clock := newRecClock(tt.clock)
			g := newGen(t, snowflake.Config{Layout: tt.layout, Clock: clock, Floor: tt.floor, DenseSequence: true})
			if got := g.Issued(); got != tt.floor {
				t.Errorf("Issued() before the first ID = %d, want the floor %d", got, tt.floor)
			}
			id, err := g.Next()
			if tt.wantTS == 0 {
				testutil.CheckErr(t, "Next()", err, snowflake.ErrClockBackwards, tt.wantMsg)
				if g.Issued() != tt.floor || g.Stats().Refused != 1 {
					t.Errorf("after refusing: Issued() = %d, Refused %d; want %d, 1", g.Issued(), g.Stats().Refused, tt.floor)
				}
				return
			}
			testutil.CheckErr(t, "Next()", err, nil, "")
			d := decode(t, g.Layout(), id)
			if d.Timestamp != tt.wantTS || d.ID <= 0 {
				t.Errorf("Next() = %+v, want timestamp %d", d, tt.wantTS)
			}
			if len(clock.Sleeps()) != 0 {
				t.Errorf("slept %v, want nothing", clock.Sleeps())
			}
		})
	}
}

func TestFloorPassedLater(t *testing.T) {
	clock := snowflake.NewFakeClock(t0)
	g := newGen(t, snowflake.Config{Clock: clock, Floor: ms0 + 2})
	for range 3 {
		if _, err := g.Next(); !errors.Is(err, snowflake.ErrClockBackwards) {
			t.Fatalf("Next() behind the floor: error %v, want ErrClockBackwards", err)
		}
		clock.Add(time.Millisecond)
	}
	if d := next(t, g); d.Timestamp != ms0+3 {
		t.Errorf("Next() past the floor at %d, want %d", d.Timestamp, ms0+3)
	}
}

func TestCeiling(t *testing.T) {
	clock := newRecClock(t0)
	g := newGen(t, snowflake.Config{Clock: clock, DenseSequence: true})
	g.SetCeiling(ms0 + 1)
	for _, tt := range []struct {
		at      time.Duration
		set     bool  // call SetCeiling(ceiling) first
		ceiling int64 // 0 or negative: no limit
		wantErr error
		wantMsg string
	}{
		{at: 0},
		{at: time.Millisecond},
		{at: 2 * time.Millisecond, wantErr: snowflake.ErrCeiling, wantMsg: "timestamp 1763792400002 is 1ms past the ceiling 1763792400001"},
		{at: 2 * time.Millisecond, set: true, ceiling: ms0 + 2},
		{at: 9 * time.Millisecond, wantErr: snowflake.ErrCeiling, wantMsg: "7ms past the ceiling"},
		{at: 9 * time.Millisecond, set: true, ceiling: 0},
		{at: 10 * time.Millisecond, set: true, ceiling: -7},
	} {
		clock.Set(t0.Add(tt.at))
		if tt.set {
			g.SetCeiling(tt.ceiling)
		}
		_, err := g.Next()
		testutil.CheckErr(t, fmt.Sprintf("Next() at +%v with ceiling %d", tt.at, tt.ceiling), err, tt.wantErr, tt.wantMsg)
	}
	if s := g.Stats(); s.Refused != 2 || s.Issued != ms0+10 {
		t.Errorf("Stats() = %+v, want Refused 2, Issued %d", s, ms0+10)
	}
}

func TestCeilingStopsBorrowing(t *testing.T) {
	// A spent millisecond at the ceiling is refused at once, not waited for.
	clock := newRecClock(t0)
	g := newGen(t, snowflake.Config{Clock: clock, DenseSequence: true, BorrowMax: 10 * time.Millisecond})
	g.SetCeiling(ms0 + 1)
	fill(t, g, 4096*2)
	if _, err := g.Next(); !errors.Is(err, snowflake.ErrCeiling) {
		t.Fatalf("Next() past the ceiling: error %v, want ErrCeiling", err)
	}
	ids := make([]int64, 1)
	if err := g.Fill(ids); !errors.Is(err, snowflake.ErrCeiling) {
		t.Fatalf("Fill() past the ceiling: error %v, want ErrCeiling", err)
	}
	if len(clock.Sleeps()) != 0 || g.Issued() != ms0+1 {
		t.Errorf("slept %v, Issued() %d; want no sleep, %d", clock.Sleeps(), g.Issued(), ms0+1)
	}
}

func TestFillAllOrNothing(t *testing.T) {
	// A Fill that runs into the ceiling halfway returns nothing; what it took is skipped,
	// and later IDs are still above everything returned before.
	clock := newRecClock(t0)
	g := newGen(t, snowflake.Config{Clock: clock, DenseSequence: true, BorrowMax: 10 * time.Millisecond})
	g.SetCeiling(ms0 + 1)
	before := fill(t, g, 100)
	ids := make([]int64, 10000)
	err := g.Fill(ids)
	testutil.CheckErr(t, "Fill(10000)", err, snowflake.ErrCeiling, "")
	if i := slices.IndexFunc(ids, func(id int64) bool { return id != 0 }); i >= 0 {
		t.Fatalf("Fill() failed but left ids[%d] = %d", i, ids[i])
	}
	if got := g.Issued(); got != ms0+1 {
		t.Errorf("Issued() after the failed Fill = %d, want %d (its IDs count as taken)", got, ms0+1)
	}
	g.SetCeiling(0)
	after := fill(t, g, 5000)
	if after[0] <= before[len(before)-1] {
		t.Fatalf("Fill() after the failure starts at %d, not above %d", after[0], before[len(before)-1])
	}
	if d := decode(t, g.Layout(), after[0]); d.Timestamp != ms0+2 {
		t.Errorf("first ID after the failed Fill at %d, want %d (past what it took)", d.Timestamp, ms0+2)
	}
	if s := g.Stats(); s.Refused != 1 {
		t.Errorf("Stats().Refused = %d, want 1", s.Refused)
	}
	if err := g.Fill(nil); err != nil {
		t.Errorf("Fill(nil) = %v, want nil", err)
	}
}

func TestSuspend(t *testing.T) {
	errLease := errors.New("workerid: lease lost")
	tests := []struct {
		name     string
		reason   error
		wantMsg  string
		wantIsTo error
	}{
		{name: "reason", reason: errLease, wantMsg: "snowflake: generator suspended: workerid: lease lost", wantIsTo: errLease},
		{name: "wrappedReason", reason: fmt.Errorf("renew: %w", errLease), wantMsg: "snowflake: generator suspended: renew: workerid: lease lost", wantIsTo: errLease},
		{name: "nil", reason: nil, wantMsg: "snowflake: generator suspended", wantIsTo: snowflake.ErrSuspended},
		{name: "alreadySuspended", reason: fmt.Errorf("lost: %w", snowflake.ErrSuspended), wantMsg: "lost: snowflake: generator suspended", wantIsTo: snowflake.ErrSuspended},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clock := snowflake.NewFakeClock(t0)
			g := newGen(t, snowflake.Config{Clock: clock})
			first := next(t, g)
			g.Suspend(tt.reason)
			_, err := g.Next()
			testutil.CheckErr(t, "Next() suspended", err, tt.wantIsTo, "")
			testutil.CheckErr(t, "Next() suspended", err, snowflake.ErrSuspended, "")
			if err.Error() != tt.wantMsg {
				t.Errorf("Next() suspended: error %q, want %q", err, tt.wantMsg)
			}
			ids := make([]int64, 5)
			testutil.CheckErr(t, "Fill() suspended", g.Fill(ids), tt.wantIsTo, "")
			if s := g.Stats(); s.Refused != 2 {
				t.Errorf("Stats().Refused = %d, want 2", s.Refused)
			}
			g.Resume()
			if d := next(t, g); d.ID <= first.ID {
				t.Errorf("Next() after Resume = %d, not above %d", d.ID, first.ID)
			}
		})
	}
}

func TestInterruptedWait(t *testing.T) {
	// What happens to a Next that waits for the next millisecond when something changes
	// during its first sleep.
	errLease := errors.New("lease lost")
	tests := []struct {
		name       string
		during     func(c *recClock, g *snowflake.Generator) // instead of the first sleep
		wantSleeps []time.Duration
		wantTS     int64
		wantErr    error
		wantMsg    string
	}{
		{
			name:       "ErrSuspended",
			during:     func(c *recClock, g *snowflake.Generator) { g.Suspend(errLease); c.FakeClock.Sleep(time.Millisecond) },
			wantSleeps: []time.Duration{time.Millisecond}, wantErr: errLease,
		},
		{
			name:       "ErrCeiling",
			during:     func(c *recClock, g *snowflake.Generator) { g.SetCeiling(ms0); c.FakeClock.Sleep(time.Millisecond) },
			wantSleeps: []time.Duration{time.Millisecond}, wantErr: snowflake.ErrCeiling,
		},
		{
			name:       "ErrClockBackwards",
			during:     func(c *recClock, g *snowflake.Generator) { c.Add(-time.Second) },
			wantSleeps: []time.Duration{time.Millisecond}, wantErr: snowflake.ErrClockBackwards, wantMsg: "by 1000ms",
		},
		{
			// A small step back is waited out (4ms for 2ms), which overshoots the
			// millisecond waited for: the ID takes the clock's millisecond.
			name:       "OK/smallStepWaitedOut",
			during:     func(c *recClock, g *snowflake.Generator) { c.Add(-2 * time.Millisecond) },
			wantSleeps: []time.Duration{time.Millisecond, 4 * time.Millisecond}, wantTS: ms0 + 2,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			clock := newRecClock(t0)
			g := newGen(t, snowflake.Config{Clock: clock, DenseSequence: true})
			first := true
			clock.onSleep = func(c *recClock, d time.Duration) {
				if first {
					first = false
					tt.during(c, g)
					return
				}
				c.FakeClock.Sleep(d)
			}
			before := fill(t, g, 4096)
			id, err := g.Next()
			testutil.CheckErr(t, "Next() interrupted", err, tt.wantErr, tt.wantMsg)
			if got := clock.Sleeps(); !slices.Equal(got, tt.wantSleeps) {
				t.Errorf("slept %v, want %v", got, tt.wantSleeps)
			}
			if err != nil {
				return
			}
			if d := decode(t, g.Layout(), id); d.Timestamp != tt.wantTS || id <= before[len(before)-1] {
				t.Errorf("Next() = %+v, want timestamp %d and above %d", d, tt.wantTS, before[len(before)-1])
			}
		})
	}
}

func TestTimestampOverflow(t *testing.T) {
	// A layout whose last timestamp is ms0+1 (40 time bits, so that its epoch is after 1970).
	end := snowflake.Layout{Epoch: ms0 + 1 - (1<<40 - 1), TimeBits: 40, WorkerBits: 11, SequenceBits: 12}
	if end.MaxTimestamp() != ms0+1 {
		t.Fatalf("MaxTimestamp() = %d, want %d", end.MaxTimestamp(), ms0+1)
	}
	t.Run("borrowIntoTheEnd", func(t *testing.T) {
		clock := newRecClock(t0)
		g := newGen(t, snowflake.Config{Layout: end, WorkerID: 2047, Clock: clock, DenseSequence: true, BorrowMax: time.Second})
		ids := fill(t, g, 8192)
		if last := ids[len(ids)-1]; last != 1<<63-1 {
			t.Errorf("last ID of the layout = %d, want %d", last, int64(1<<63-1))
		}
		_, err := g.Next()
		testutil.CheckErr(t, "Next() past the end", err, snowflake.ErrTimestampOverflow, "timestamp 1763792400002 is past the layout's last, 1763792400001")
		if len(clock.Sleeps()) != 0 {
			t.Errorf("slept %v, want an immediate refusal", clock.Sleeps())
		}
	})
	t.Run("waitIntoTheEnd", func(t *testing.T) {
		clock := newRecClock(t0.Add(time.Millisecond))
		g := newGen(t, snowflake.Config{Layout: end, Clock: clock, DenseSequence: true})
		fill(t, g, 4096)
		_, err := g.Next()
		testutil.CheckErr(t, "Next() past the end", err, snowflake.ErrTimestampOverflow, "")
	})
	for _, at := range []time.Duration{2 * time.Millisecond, time.Hour, 24 * 365 * time.Hour} {
		t.Run(fmt.Sprintf("clockAt+%v", at), func(t *testing.T) {
			clock := newRecClock(t0.Add(at))
			g := newGen(t, snowflake.Config{Layout: end, Clock: clock})
			id, err := g.Next()
			testutil.CheckErr(t, "Next() past the end", err, snowflake.ErrTimestampOverflow, "")
			if id != 0 {
				t.Errorf("Next() = %d with error, want 0", id)
			}
		})
	}
	t.Run("defaultLayoutIn2080", func(t *testing.T) {
		def := snowflake.DefaultLayout()
		clock := newRecClock(time.UnixMilli(def.MaxTimestamp()))
		g := newGen(t, snowflake.Config{Clock: clock, WorkerID: 1023})
		if d := next(t, g); d.Timestamp != def.MaxTimestamp() || d.ID <= 0 {
			t.Errorf("Next() on the last ms = %+v", d)
		}
		clock.Add(time.Millisecond)
		_, err := g.Next()
		testutil.CheckErr(t, "Next() in 2080", err, snowflake.ErrTimestampOverflow, "2080-07-10T17:30:30.208Z")
	})
}

func TestStats(t *testing.T) {
	clock := snowflake.NewFakeClock(t0)
	g := newGen(t, snowflake.Config{Clock: clock, Floor: ms0 - 10, BorrowMax: time.Second, DenseSequence: true})
	if s := g.Stats(); s != (snowflake.Stats{Issued: ms0 - 10}) {
		t.Errorf("Stats() before any ID = %+v, want only Issued = the floor", s)
	}
	fill(t, g, 4096*4)
	if s := g.Stats(); s != (snowflake.Stats{Issued: ms0 + 3, Borrowed: 3 * time.Millisecond}) {
		t.Errorf("Stats() after borrowing = %+v", s)
	}
	clock.Add(-20 * time.Millisecond)
	_, _ = g.Next()
	if s := g.Stats(); s != (snowflake.Stats{Issued: ms0 + 3, Borrowed: 23 * time.Millisecond, Offset: 20 * time.Millisecond, Refused: 1}) {
		t.Errorf("Stats() during a backwards step = %+v", s)
	}
}

func TestNextDoesNotAllocate(t *testing.T) {
	g := newGen(t, snowflake.Config{WorkerID: 1, BorrowMax: time.Hour})
	ids := make([]int64, 100)
	allocs := testing.AllocsPerRun(1000, func() {
		if _, err := g.Next(); err != nil {
			t.Fatal(err)
		}
		if err := g.Fill(ids); err != nil {
			t.Fatal(err)
		}
	})
	if allocs != 0 {
		t.Errorf("Next and Fill allocate %v times per call, want 0", allocs)
	}
}

func TestMillionStrictlyIncreasing(t *testing.T) {
	g := newGen(t, snowflake.Config{WorkerID: 7})
	prev := int64(0)
	for i := range 1_000_000 {
		id, err := g.Next()
		if err != nil {
			t.Fatalf("Next() #%d: %v", i, err)
		}
		if id <= prev {
			t.Fatalf("Next() #%d = %d, not above %d", i, id, prev)
		}
		prev = id
	}
	if d := decode(t, g.Layout(), prev); d.WorkerID != 7 {
		t.Errorf("last ID's worker = %d, want 7", d.WorkerID)
	}
}

func TestConcurrentUnique(t *testing.T) {
	tests := []struct {
		name   string
		borrow time.Duration
	}{
		{name: "wait", borrow: 0},
		{name: "borrow", borrow: 3 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			const workers, calls = 8, 5000
			g := newGen(t, snowflake.Config{WorkerID: 513, BorrowMax: tt.borrow})
			results := make([][]int64, workers)
			var wg sync.WaitGroup
			stop := make(chan struct{})
			for w := range workers {
				wg.Go(func() {
					var mine []int64
					buf := make([]int64, 1+w*7)
					for i := range calls {
						if i%2 == 0 {
							id, err := g.Next()
							if err != nil {
								t.Errorf("Next(): %v", err)
								return
							}
							mine = append(mine, id)
							continue
						}
						if err := g.Fill(buf); err != nil {
							t.Errorf("Fill(%d): %v", len(buf), err)
							return
						}
						for j := 1; j < len(buf); j++ {
							if buf[j] <= buf[j-1] {
								t.Errorf("Fill() not increasing at %d: %d after %d", j, buf[j], buf[j-1])
								return
							}
						}
						mine = append(mine, buf...)
					}
					results[w] = mine
				})
			}
			// Readers of the lock-free settings and the stats run alongside.
			var side sync.WaitGroup
			side.Go(func() {
				for {
					select {
					case <-stop:
						return
					default:
						g.SetCeiling(0)
						_ = g.Stats()
						_ = g.Issued()
						g.Resume()
					}
				}
			})
			done := make(chan struct{})
			go func() { wg.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(2 * time.Minute):
				t.Fatal("generators did not finish within 2 minutes")
			}
			close(stop)
			side.Wait()

			seen := make(map[int64]int, workers*calls*16)
			for w, ids := range results {
				for _, id := range ids {
					if prev, dup := seen[id]; dup {
						t.Fatalf("ID %d issued to goroutine %d and %d", id, prev, w)
					}
					seen[id] = w
				}
			}
			if s := g.Stats(); s.Refused != 0 {
				t.Errorf("Stats().Refused = %d, want 0", s.Refused)
			}
			t.Logf("%d unique IDs", len(seen))
		})
	}
}

func TestConcurrentSuspendAndCeiling(t *testing.T) {
	// Refusals toggled from another goroutine never let a repeat through.
	errLease := errors.New("lease lost")
	g := newGen(t, snowflake.Config{WorkerID: 2, BorrowMax: time.Millisecond})
	stop := make(chan struct{})
	var side sync.WaitGroup
	side.Go(func() {
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			switch i % 4 {
			case 0:
				g.Suspend(errLease)
			case 1:
				g.Resume()
			case 2:
				g.SetCeiling(time.Now().UnixMilli() - 1)
			case 3:
				g.SetCeiling(0)
			}
		}
	})
	var ok, refused int
	seen := make(map[int64]bool)
	deadline := time.After(time.Minute)
	for i := 0; i < 200000; i++ {
		select {
		case <-deadline:
			t.Fatal("did not finish within a minute")
		default:
		}
		id, err := g.Next()
		switch {
		case err == nil:
			if seen[id] {
				t.Fatalf("ID %d repeated", id)
			}
			seen[id] = true
			ok++
		case errors.Is(err, errLease) && errors.Is(err, snowflake.ErrSuspended), errors.Is(err, snowflake.ErrCeiling):
			refused++
		default:
			t.Fatalf("Next(): unexpected error %v", err)
		}
	}
	close(stop)
	side.Wait()
	if s := g.Stats(); s.Refused != uint64(refused) {
		t.Errorf("Stats().Refused = %d, want %d", s.Refused, refused)
	}
	t.Logf("%d issued, %d refused", ok, refused)
}

func TestFakeClock(t *testing.T) {
	c := snowflake.NewFakeClock(t0)
	if !c.Now().Equal(t0) {
		t.Fatalf("Now() = %v, want %v", c.Now(), t0)
	}
	c.Sleep(3 * time.Millisecond)
	c.Sleep(0)
	c.Sleep(-time.Second)
	c.Add(-time.Millisecond)
	if want := t0.Add(2 * time.Millisecond); !c.Now().Equal(want) {
		t.Errorf("Now() = %v, want %v", c.Now(), want)
	}
	if c.Slept() != 3*time.Millisecond {
		t.Errorf("Slept() = %v, want 3ms (Add is not sleep)", c.Slept())
	}
	later := t0.Add(time.Hour)
	c.Set(later)
	if !c.Now().Equal(later) {
		t.Errorf("Now() after Set = %v, want %v", c.Now(), later)
	}
}

func TestSystemClock(t *testing.T) {
	c := snowflake.SystemClock()
	for _, d := range []time.Duration{0, -time.Millisecond, 100 * time.Microsecond, 1500 * time.Microsecond, 3 * time.Millisecond} {
		start := time.Now()
		c.Sleep(d)
		if got := time.Since(start); got < d {
			t.Errorf("Sleep(%v) returned after %v", d, got)
		}
	}
	if got := c.Now(); got.Sub(time.Now()).Abs() > time.Minute {
		t.Errorf("Now() = %v, far from time.Now()", got)
	}
}

// A generator that lost its worker ID is moved to the next one without being rebuilt:
// Rebind refuses while it issues, then it issues with the new worker ID above the new
// floor, and never below what it issued before.
func TestGeneratorRebind(t *testing.T) {
	clock := snowflake.NewFakeClock(time.UnixMilli(snowflake.DefaultLayout().Epoch + 10_000))
	g, err := snowflake.New(snowflake.Config{WorkerID: 3, Clock: clock, DenseSequence: true})
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	before, err := g.Next()
	if err != nil {
		t.Fatalf("Next: %v", err)
	}
	if err := g.Rebind(4, 0); !errors.Is(err, snowflake.ErrInvalidConfig) {
		t.Fatalf("Rebind while issuing = %v, want snowflake.ErrInvalidConfig", err)
	}
	g.Suspend(errors.New("lease lost"))
	if err := g.Rebind(1024, 0); !errors.Is(err, snowflake.ErrInvalidConfig) {
		t.Fatalf("Rebind(1024) = %v, want snowflake.ErrInvalidConfig", err)
	}
	floor := clock.Now().UnixMilli() + 50
	if err := g.Rebind(4, floor); err != nil {
		t.Fatalf("Rebind: %v", err)
	}
	if _, err := g.Next(); !errors.Is(err, snowflake.ErrSuspended) {
		t.Fatalf("Next after Rebind = %v, want still suspended", err)
	}
	g.Resume()
	if _, err := g.Next(); !errors.Is(err, snowflake.ErrClockBackwards) {
		t.Fatalf("Next below the new floor = %v, want snowflake.ErrClockBackwards", err)
	}
	clock.Add(51 * time.Millisecond)
	after, err := g.Next()
	if err != nil {
		t.Fatalf("Next past the new floor: %v", err)
	}
	d, err := snowflake.DefaultLayout().Decode(after)
	if err != nil {
		t.Fatalf("Decode: %v", err)
	}
	if d.WorkerID != 4 || d.Timestamp <= floor || after <= before || g.WorkerID() != 4 {
		t.Fatalf("after Rebind: ID %d (worker %d, ts %d), WorkerID() %d; want worker 4 past the floor %d and above %d",
			after, d.WorkerID, d.Timestamp, g.WorkerID(), floor, before)
	}
}
