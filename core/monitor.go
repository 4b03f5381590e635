package core

import (
	"time"

	"github.com/leafbus/leafbus/metrics"
	"github.com/leafbus/leafbus/pools"
	"github.com/leafbus/leafbus/segment"
	"github.com/leafbus/leafbus/snowflake"
	"github.com/leafbus/leafbus/workerid"
)

// The adapters below turn the dispenser's parts into the snapshots /metrics, the status
// page and /readyz read (the faces take them from the core, and import no source), so
// that the dispenser's wiring is one line per source. Each takes the parts through the
// small interfaces their Stats methods satisfy.

// SnowflakeStats is what *snowflake.Generator offers for monitoring.
type SnowflakeStats interface {
	Stats() snowflake.Stats
	WorkerID() int64
}

// HeartbeatStats is what *workerid.Heartbeat offers for monitoring.
type HeartbeatStats interface {
	Stats() workerid.HeartbeatStats
}

// SegmentStats is what *segment.Generator offers for monitoring.
type SegmentStats interface {
	Stats() segment.Stats
}

// TagStatsSource is what *segment.Generator offers for the per-tag figures.
type TagStatsSource interface {
	TagStats() []segment.TagStats
}

// SegmentState returns a metrics.Sources.SegmentTags func: each tag's double buffer
// from the generator, ranked by IDs issued where a bound applies.
func SegmentState(gen TagStatsSource) func() []metrics.SegmentTag {
	return func() []metrics.SegmentTag {
		if gen == nil {
			return nil
		}
		stats := gen.TagStats()
		out := make([]metrics.SegmentTag, 0, len(stats))
		for _, t := range stats {
			out = append(out, metrics.SegmentTag{
				Tag:       t.Tag,
				Current:   metrics.Segment(t.Current),
				Next:      metrics.Segment(t.Next),
				NextReady: t.NextReady, Step: t.Step, Issued: t.Issued,
				Loads: t.Loads, LoadErrors: t.LoadErrors, LoadSeconds: t.LoadTime.Seconds(),
				LastLoad: t.LastLoad, LastError: t.LastError,
			})
		}
		return out
	}
}

// SnowflakeState returns a metrics.Sources.Snowflake func: the generator's clock
// figures and the heartbeat's record and lease, with the registry the worker ID came
// from (--worker-registry) and the lease's TTL (0: held for good).
func SnowflakeState(gen SnowflakeStats, hb HeartbeatStats, registry string, ttl time.Duration) func() (metrics.Snowflake, bool) {
	return func() (metrics.Snowflake, bool) {
		if gen == nil || hb == nil {
			return metrics.Snowflake{}, false
		}
		st, beat := gen.Stats(), hb.Stats()
		lease := metrics.LeaseHeld
		switch {
		case beat.LeaseLost:
			lease = metrics.LeaseLost
		case beat.Suspended:
			lease = metrics.LeaseSuspended
		}
		return metrics.Snowflake{
			WorkerID: gen.WorkerID(), Registry: registry, Lease: lease, LeaseTTL: ttl,
			SuspendReason: beat.SuspendReason, Record: beat.Record, LastRecord: beat.LastSuccess,
			Offset: st.Offset, Borrowed: st.Borrowed, Issued: st.Issued, Refused: st.Refused,
		}, true
	}
}

// PoolState returns a metrics.Sources.Pools func over the reply batches and the pool
// stream: a batch pool's ready count is its ready replies, a stream pool's the batches
// stored on its subject. Either may be a nil interface (not a nil pointer: its Stats
// would be called).
func PoolState(batches interface{ Stats() []pools.PoolStats }, stream interface{ Stats() []pools.StreamStats }) func() []metrics.Pool {
	return func() []metrics.Pool {
		var out []metrics.Pool
		if batches != nil {
			for _, p := range batches.Stats() {
				out = append(out, metrics.Pool{Kind: p.Kind, Tag: p.Tag, Where: "replies", Size: p.Size, Depth: p.Depth, Ready: p.Ready})
			}
		}
		if stream != nil {
			for _, p := range stream.Stats() {
				out = append(out, metrics.Pool{Kind: p.Kind, Tag: p.Tag, Where: "stream", Size: p.Size, Depth: p.Depth, Ready: p.Stored})
			}
		}
		return out
	}
}

// HealthOf is the Readiness of a dispenser: tags loaded from the segment generator,
// the worker ID, last record and suspension from the heartbeat, and how far the clock
// is behind from the snowflake generator.
func HealthOf(segs SegmentStats, gen SnowflakeStats, hb HeartbeatStats) Readiness {
	return ReadinessFunc(func() Health {
		var h Health
		if segs != nil {
			h.TagsLoaded = segs.Stats().Ready
		}
		if hb != nil {
			beat := hb.Stats()
			h.WorkerIDHeld = !beat.LeaseLost
			h.LastBeat = beat.LastSuccess
			h.Suspended = beat.SuspendReason
		}
		if gen != nil {
			h.ClockBehind = gen.Stats().Offset
		}
		return h
	})
}
