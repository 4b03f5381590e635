package dispenser

import (
	"context"
	"fmt"
	"path/filepath"
	"time"

	"github.com/leafbus/leafbus/core"
	"github.com/leafbus/leafbus/metrics"
	"github.com/leafbus/leafbus/monotonic"
	"github.com/leafbus/leafbus/opaque"
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
	mc.CodeOf = core.CodeOf
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
	if d.idKey != nil {
		mc.IDKey = opaque.Fingerprint(d.idKey) // idkey.go
	}
	mono, err := monotonic.New(ctx, mc)
	if err != nil {
		return fmt.Errorf("monotonic tags: %w", err)
	}
	d.mono = mono
	// The tags' ranges live beside their marks; the Shaper gives every segment reply,
	// and every pool batch, its tag's range.
	if d.shaper, err = core.NewShaper(mono, d.idKey); err != nil {
		return fmt.Errorf("--id-key-file: %w", err)
	}
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

// withMarks makes /readyz wait for the monotonic marks as Ready does: until they are
// loaded no segment tag can be served (it is not known which are monotonic), so the tags
// count as not loaded.
func (d *Dispenser) withMarks(r core.Readiness) core.Readiness {
	return core.ReadinessFunc(func() core.Health {
		h := r.Health()
		select {
		case <-d.mono.Ready():
		default:
			h.TagsLoaded = false
		}
		return h
	})
}

// describeRange is the status page's range of a tag: "" for the default, what refuses
// it when it is refused.
func (d *Dispenser) describeRange(tag string) string {
	r, _, err := d.shaper.Range(tag)
	switch {
	case err != nil:
		code, _ := core.CodeOf(err)
		return fmt.Sprintf("%s (refused here: %d)", r, code)
	case r.IsDefault():
		return ""
	}
	return r.String()
}
