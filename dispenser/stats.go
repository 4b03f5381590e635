package dispenser

import (
	"github.com/leafbus/leafbus/pools"
	"github.com/leafbus/leafbus/snowflake"
	"github.com/leafbus/leafbus/wire"
)

// endpointStats is the data of the ID endpoints in $SRV.STATS: the segment buffers and
// monotonic tags, the
// snowflake generator and clock, the worker ID and its range, and the pools of each kind.
func (d *Dispenser) endpointStats(endpoint string) any {
	switch endpoint {
	case "segment":
		return map[string]any{
			"tags":        d.segments.Stats(),
			"monotonic":   d.mono.Stats(),
			"pools":       ofKind(d.batches.Stats(), wire.Segment, poolKind),
			"pool_stream": ofKind(d.poolStream.Stats(), wire.Segment, streamKind),
			"recovery":    d.recovery.Stats(),
		}
	case "snowflake":
		return d.rangeStats(map[string]any{
			"generator":   generatorStats(d.snowflakes.Stats()),
			"clock":       d.heartbeat.Stats(),
			"pools":       ofKind(d.batches.Stats(), wire.Snowflake, poolKind),
			"pool_stream": ofKind(d.poolStream.Stats(), wire.Snowflake, streamKind),
			"recovery":    d.recovery.Stats(),
			"worker":      d.workerStats(),
		})
	}
	return nil
}

// generatorStats shows the snowflake generator in $SRV.STATS: how far its clock is
// behind (a step back), how far it borrowed ahead, and how many requests it refused.
func generatorStats(s snowflake.Stats) map[string]any {
	return map[string]any{
		"issued":          s.Issued,
		"borrowed_ms":     s.Borrowed.Milliseconds(),
		"clock_offset_ms": s.Offset.Milliseconds(),
		"refused":         s.Refused,
	}
}

func poolKind(s pools.PoolStats) string     { return s.Kind }
func streamKind(s pools.StreamStats) string { return s.Kind }

// ofKind keeps the pool stats of one kind for $SRV.STATS (an empty list when none).
func ofKind[S any](all []S, kind wire.Kind, kindOf func(S) string) []S {
	out := []S{}
	for _, s := range all {
		if kindOf(s) == kind.String() {
			out = append(out, s)
		}
	}
	return out
}
