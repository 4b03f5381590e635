package core_test

import (
	"testing"
	"time"

	"github.com/leafbus/leafbus/core"
	"github.com/leafbus/leafbus/metrics"
	"github.com/leafbus/leafbus/pools"
	"github.com/leafbus/leafbus/segment"
	"github.com/leafbus/leafbus/snowflake"
	"github.com/leafbus/leafbus/wire"
	"github.com/leafbus/leafbus/workerid"
)

type fakeHeartbeat workerid.HeartbeatStats

func (f fakeHeartbeat) Stats() workerid.HeartbeatStats { return workerid.HeartbeatStats(f) }

type fakeStream []pools.StreamStats

func (f fakeStream) Stats() []pools.StreamStats { return f }

type fakeTagStats []segment.TagStats

func (f fakeTagStats) TagStats() []segment.TagStats { return f }

func TestSegmentState(t *testing.T) {
	last := time.Unix(1_763_792_399, 0)
	got := core.SegmentState(fakeTagStats{{
		Tag: "orders", Current: segment.Window{Value: 5, Max: 11, Step: 10}, Next: segment.Window{Value: 11, Max: 31, Step: 20},
		NextReady: true, Step: 20, Issued: 4, Loads: 2, LoadErrors: 1, LoadTime: 1500 * time.Millisecond,
		LastLoad: last, LastError: "boom",
	}})()
	want := metrics.SegmentTag{
		Tag: "orders", Current: metrics.Segment{Value: 5, Max: 11, Step: 10}, Next: metrics.Segment{Value: 11, Max: 31, Step: 20},
		NextReady: true, Step: 20, Issued: 4, Loads: 2, LoadErrors: 1, LoadSeconds: 1.5, LastLoad: last, LastError: "boom",
	}
	if len(got) != 1 || got[0] != want {
		t.Fatalf("SegmentState = %+v\nwant [%+v]", got, want)
	}
	if got := core.SegmentState(nil)(); got != nil {
		t.Errorf("SegmentState(nil) = %+v, want nil", got)
	}
}

func TestSnowflakeState(t *testing.T) {
	gen, clock := newSnowflakes(t, 12)
	ids := make([]int64, 3)
	if err := gen.Fill(ids); err != nil {
		t.Fatal(err)
	}
	clock.Add(-20 * time.Millisecond) // a step back: the generator's offset
	beat := time.Unix(1_763_792_399, 0)
	for _, c := range []struct {
		name string
		hb   workerid.HeartbeatStats
		want string
	}{
		{"Held", workerid.HeartbeatStats{Record: 1_763_792_400_000, LastSuccess: beat}, metrics.LeaseHeld},
		{"Suspended", workerid.HeartbeatStats{Suspended: true, SuspendReason: "heartbeat record not written"}, metrics.LeaseSuspended},
		{"Lost", workerid.HeartbeatStats{Suspended: true, LeaseLost: true}, metrics.LeaseLost},
	} {
		t.Run(c.name, func(t *testing.T) {
			got, ok := core.SnowflakeState(gen, fakeHeartbeat(c.hb), "kv", 30*time.Second)()
			if !ok || got.Lease != c.want || got.WorkerID != 12 || got.Registry != "kv" || got.LeaseTTL != 30*time.Second {
				t.Fatalf("SnowflakeState = %+v, %v, want worker 12 from kv, lease %s, TTL 30s", got, ok, c.want)
			}
			if got.Offset != 20*time.Millisecond || got.Issued != sfTime.UnixMilli() || got.Record != c.hb.Record || !got.LastRecord.Equal(c.hb.LastSuccess) {
				t.Errorf("SnowflakeState = %+v: want offset 20ms, issued %d and the heartbeat's record", got, sfTime.UnixMilli())
			}
		})
	}
	if _, ok := core.SnowflakeState(nil, nil, "kv", 0)(); ok {
		t.Error("SnowflakeState without a generator says it has a worker")
	}
}

func TestPoolState(t *testing.T) {
	sf, _ := newSnowflakes(t, 1)
	batches, err := pools.New(pools.Config{
		Specs:      []pools.Spec{{Kind: wire.Snowflake, Tag: "bulk", Size: 100, Depth: 4}},
		Snowflakes: sf,
	})
	if err != nil {
		t.Fatal(err)
	}
	stream := fakeStream{{Kind: "segment", Tag: "etl", Size: 10000, Depth: 8, Stored: 5}}
	got := core.PoolState(batches, stream)()
	want := []metrics.Pool{
		{Kind: "snowflake", Tag: "bulk", Where: "replies", Size: 100, Depth: 4, Ready: 0},
		{Kind: "segment", Tag: "etl", Where: "stream", Size: 10000, Depth: 8, Ready: 5},
	}
	if len(got) != len(want) || got[0] != want[0] || got[1] != want[1] {
		t.Errorf("PoolState = %+v, want %+v", got, want)
	}
	if got := core.PoolState(nil, nil)(); len(got) != 0 {
		t.Errorf("PoolState(nil, nil) = %v, want none", got)
	}
}

type fakeSegments segment.Stats

func (f fakeSegments) Stats() segment.Stats { return segment.Stats(f) }

func TestHealthOf(t *testing.T) {
	gen, clock := newSnowflakes(t, 1)
	if err := gen.Fill(make([]int64, 1)); err != nil {
		t.Fatal(err)
	}
	clock.Add(-7 * time.Millisecond)
	beat := time.Now()
	h := core.HealthOf(fakeSegments{Ready: true}, gen, fakeHeartbeat{LastSuccess: beat, SuspendReason: "x"}).Health()
	want := core.Health{TagsLoaded: true, WorkerIDHeld: true, LastBeat: beat, Suspended: "x", ClockBehind: 7 * time.Millisecond}
	if h != want {
		t.Errorf("HealthOf = %+v, want %+v", h, want)
	}
	if h := core.HealthOf(fakeSegments{}, nil, fakeHeartbeat{LeaseLost: true}).Health(); h.TagsLoaded || h.WorkerIDHeld {
		t.Errorf("HealthOf of a node starting with a lost lease = %+v, want neither tags nor worker ID", h)
	}
}

// sfTime is where the fake clock of newSnowflakes stands.
var sfTime = time.UnixMilli(1_763_792_400_123)

// newSnowflakes returns a snowflake generator with worker ID worker on a fake clock.
func newSnowflakes(tb testing.TB, worker int64) (*snowflake.Generator, *snowflake.FakeClock) {
	tb.Helper()
	clock := snowflake.NewFakeClock(sfTime)
	gen, err := snowflake.New(snowflake.Config{WorkerID: worker, Clock: clock, DenseSequence: true})
	if err != nil {
		tb.Fatalf("snowflake.New: %v", err)
	}
	return gen, clock
}
