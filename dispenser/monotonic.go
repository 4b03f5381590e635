package dispenser

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"github.com/leafbus/leafbus/httpapi"
	"github.com/leafbus/leafbus/metrics"
	"github.com/leafbus/leafbus/monotonic"
	"github.com/leafbus/leafbus/service"
	"github.com/leafbus/leafbus/wire"
)

// Monotonic tags (PROTOCOL.md "Monotonic tags"): the Manager is built after the segment
// generator, whose fresh segments its leaders serve from, and the worker ID (so a start
// that it refuses gives the worker ID back, as any late step's does), and before the
// pools, which must refuse those tags; the service asks it about every segment request, and HTTP's
// segment requests go through it too. Run runs it as an actor stopped after the service
// and HTTP, so that the requests they wait on are answered; Ready waits for its marks.

// MonotonicTagsFileName is the file in --data-dir that remembers the tags this node
// treated as monotonic (package monotonic's memory).
const MonotonicTagsFileName = "monotonic.tags"

// minMonotonicLeaseTTL is the shortest --monotonic-lease-ttl: renewals come every
// sixth of it, and a KV round trip must fit well inside one.
const minMonotonicLeaseTTL = 600 * time.Millisecond

// checkMonotonic checks --monotonic-lease-ttl.
func (c Config) checkMonotonic() []error {
	if c.MonotonicLeaseTTL < minMonotonicLeaseTTL {
		return []error{fmt.Errorf("--monotonic-lease-ttl %v: want at least %v (renewed every sixth of it)", c.MonotonicLeaseTTL, minMonotonicLeaseTTL)}
	}
	return nil
}

// newMonotonic builds the Manager of monotonic tags on the dispenser's JetStream
// connection (the service's connection may only answer requests), taking fresh segments
// from the generator. Its lease is --monotonic-lease-ttl, renewed every sixth. Nothing
// runs until Run, and New holds nothing that needs undoing but the buckets it created,
// which stay (they are the deployment's), so there is no undo.
func (d *Dispenser) newMonotonic(ctx context.Context) error {
	cfg := d.cfg
	mc := monotonic.DefaultConfig()
	mc.Prefix, mc.NodeID, mc.Replicas = cfg.Prefix, cfg.NodeID, cfg.KVReplicas
	mc.Conn, mc.JetStream, mc.Segments = d.nc, d.js, d.segments
	mc.CodeOf = service.CodeOf
	mc.FoldCase = cfg.SegmentStore == "mysql"
	mc.LeaseTTL, mc.RenewInterval = cfg.MonotonicLeaseTTL, cfg.MonotonicLeaseTTL/6
	// A forwarded message must fit the server's max_payload (8 bytes an ID) and carry at
	// least one request; a --max-batch too large for that is refused by monotonic.New.
	mc.MaxBatch = cfg.MaxBatch
	mc.MaxForward = max(cfg.MaxBatch, min(mc.MaxForward, int(d.nc.MaxPayload()/8)))
	mc.Logger = d.log.With("component", "monotonic")
	// The tags it treats as monotonic are remembered in the data dir; its leases name
	// the service's $SRV instance (built later, asked when Run starts).
	mc.MemoryFile = filepath.Join(cfg.DataDir, MonotonicTagsFileName)
	mc.ServiceID = func() string { return d.svc.Info().ID }
	mc.SegmentMarks = d.marks // a tag never served here needs no settling when marked
	mono, err := monotonic.New(ctx, mc)
	if err != nil {
		return fmt.Errorf("monotonic tags: %w", err)
	}
	d.mono = mono
	return nil
}

// monotonicState is the monotonic tags' snapshot for /metrics: the figures $SRV.STATS
// shows, so that an operator can alert on a tag no dispenser leads.
func monotonicState(m *monotonic.Manager) func() metrics.Monotonic {
	return func() metrics.Monotonic {
		s := m.Stats()
		out := metrics.Monotonic{RefusedReplies: s.RefusedReplies, Tags: make([]metrics.MonotonicTag, 0, len(s.Tags))}
		for _, t := range s.Tags {
			out.Tags = append(out.Tags, metrics.MonotonicTag{
				Tag: t.Tag, Role: t.Role, Terms: t.Terms,
				Forwarded: t.Forwarded, ForwardErrors: t.ForwardErrors, ForwardMessages: t.ForwardMessages,
			})
		}
		return out
	}
}

// httpSegments routes HTTP's segment requests as the service routes NATS ones: a
// monotonic tag to the Manager (its leader's one sequence), never to the buffers, whose
// segments are cut ahead of time; every other tag to the generator.
type httpSegments struct {
	mono interface {
		httpapi.SegmentSource
		Ready() <-chan struct{}
		IsMonotonic(tag string) (bool, error)
	}
	ordinary httpapi.SegmentSource
}

func (h httpSegments) TryFill(tag string, dst []int64) (bool, error) {
	select {
	case <-h.mono.Ready():
	default:
		return false, nil // Fill waits for the marks
	}
	mono, err := h.mono.IsMonotonic(tag)
	switch {
	case err != nil:
		return false, err
	case mono:
		return h.mono.TryFill(tag, dst)
	}
	return h.ordinary.TryFill(tag, dst)
}

// Fill waits for the marks while they load (a dispenser just started), within the
// request's wait, as the service does for NATS (waitForMarks): no tag can be served
// before its mark is known, and a 503 at once would send the first requests back.
func (h httpSegments) Fill(ctx context.Context, tag string, dst []int64) error {
	select {
	case <-h.mono.Ready():
	case <-ctx.Done(): // IsMonotonic says what is missing
	}
	mono, err := h.mono.IsMonotonic(tag)
	switch {
	case err != nil:
		return err
	case mono:
		return h.mono.Fill(ctx, tag, dst)
	}
	return h.ordinary.Fill(ctx, tag, dst)
}

// httpBatches keeps HTTP from answering a monotonic tag with a pre-filled batch: a pool
// filled before the tag was marked may still hold some. (The service checks the mark
// before its pools itself.)
type httpBatches struct {
	mono     *monotonic.Manager
	ordinary httpapi.Batches
}

func (h httpBatches) Take(kind wire.Kind, tag string, n int, enc wire.Encoding) ([]byte, bool) {
	if kind == wire.Segment {
		if mono, err := h.mono.IsMonotonic(tag); err != nil || mono {
			return nil, false // the segment source answers: the Manager, or the error
		}
	}
	return h.ordinary.Take(kind, tag, n, enc)
}

// withMarks makes /readyz wait for the monotonic marks as Ready does: until they are
// loaded no segment tag can be served (it is not known which are monotonic), so the tags
// count as not loaded.
func (d *Dispenser) withMarks(r httpapi.Readiness) httpapi.Readiness {
	return httpapi.ReadinessFunc(func() httpapi.Health {
		h := r.Health()
		select {
		case <-d.mono.Ready():
		default:
			h.TagsLoaded = false
		}
		return h
	})
}
