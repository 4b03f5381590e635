package dispenser

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/leafbus/leafbus/wire"
	"github.com/leafbus/leafbus/workerid"
)

// Worker-ID ranges (PROTOCOL.md "Worker-ID ranges"): --worker-id-min and --worker-id-max
// restrict the registry, the range is published in $SRV.INFO metadata (worker_id,
// worker_id_min, worker_id_max) and in the snowflake endpoint's $SRV.STATS, and every
// dispenser looks at its peers' metadata through $SRV discovery and warns about a
// misconfiguration it can see.
//
// The rule: dispensers of one datacenter share one range (their registry keeps their
// worker IDs apart), and datacenters get disjoint ranges. So a peer with the same range
// is a neighbour in the same deployment, one with a disjoint range is another
// datacenter's (seen across a supercluster's gateways), and a peer whose range differs
// from this node's yet overlaps it is a misconfiguration: two registries that cannot
// see each other may hand out the same worker ID. A peer (another node ID) that reports
// this node's very worker ID is warned about whatever the ranges: two datacenters left
// at the default range look like one deployment, and that is how they show.

// Peer range check timing: how often the peers are asked, how long their answers are
// collected (a peer across a gateway answers within milliseconds; quiet ends the wait
// once answers stop coming), and how often one peer's conflict is logged again.
const (
	peerCheckEvery = 30 * time.Second
	peerWindow     = 2 * time.Second
	peerQuiet      = 250 * time.Millisecond
	peerWarnEvery  = 10 * time.Minute
)

// workerRange is --worker-id-min..--worker-id-max.
func (c Config) workerRange() workerid.Range {
	return workerid.Range{Min: c.WorkerIDMin, Max: c.WorkerIDMax}
}

// checkWorkerRange checks --worker-id-min and --worker-id-max against the layout and each
// other, and --worker-id against them.
func (c Config) checkWorkerRange() []error {
	var errs []error
	add := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	maxID := c.Layout().MaxWorkerID()
	if c.WorkerIDMin < 0 || c.WorkerIDMin > maxID {
		add("--worker-id-min %d: want 0 to %d (the layout's highest worker ID)", c.WorkerIDMin, maxID)
	}
	if c.WorkerIDMax < 0 || c.WorkerIDMax > maxID {
		add("--worker-id-max %d: want 0 to %d (the layout's highest worker ID)", c.WorkerIDMax, maxID)
	}
	if c.WorkerIDMin > c.WorkerIDMax {
		add("--worker-id-min %d is above --worker-id-max %d: the range of worker IDs would be empty", c.WorkerIDMin, c.WorkerIDMax)
	}
	if c.WorkerRegistry == "static" && c.WorkerID >= 0 && c.WorkerID <= maxID && !c.workerRange().Contains(c.WorkerID) {
		add("--worker-id %d is outside --worker-id-min %d .. --worker-id-max %d, this deployment's range", c.WorkerID, c.WorkerIDMin, c.WorkerIDMax)
	}
	return errs
}

// rangeStats is the worker ID and range in the snowflake endpoint's $SRV.STATS, with the
// number of peers whose range conflicted with this node's at the last check.
func (d *Dispenser) rangeStats(data map[string]any) map[string]any {
	data[wire.MetaWorkerID] = d.snowflakes.WorkerID()
	data[wire.MetaWorkerIDMin] = d.cfg.WorkerIDMin
	data[wire.MetaWorkerIDMax] = d.cfg.WorkerIDMax
	data["worker_id_conflicts"] = d.peerRanges.conflicts.Load()
	return data
}

// peer is what a dispenser's $SRV.INFO says about its worker ID and range.
type peer struct {
	instance string // the service instance ID
	nodeID   string
	workerID int64 // -1: not published
	rng      workerid.Range
	hasRange bool
}

// parsePeer reads an $SRV.INFO answer.
func parsePeer(data []byte) (peer, error) {
	var info micro.Info
	if err := json.Unmarshal(data, &info); err != nil {
		return peer{}, err
	}
	m := info.Metadata
	p := peer{instance: info.ID, nodeID: m[wire.MetaNodeID], workerID: -1}
	if w, err := strconv.ParseInt(m[wire.MetaWorkerID], 10, 64); err == nil {
		p.workerID = w
	}
	lo, errLo := strconv.ParseInt(m[wire.MetaWorkerIDMin], 10, 64)
	hi, errHi := strconv.ParseInt(m[wire.MetaWorkerIDMax], 10, 64)
	if errLo == nil && errHi == nil {
		p.rng, p.hasRange = workerid.Range{Min: lo, Max: hi}, true
	}
	return p, nil
}

// rangeConflict says what is wrong with peer p next to a node of node ID nodeID with
// worker ID workerID and range mine; "" when nothing is.
func rangeConflict(nodeID string, workerID int64, mine workerid.Range, p peer) string {
	switch {
	case p.hasRange && mine.Conflicts(p.rng):
		return fmt.Sprintf("its worker IDs %s overlap this node's %s without being the same range: two deployments whose registries cannot see each other may hand out the same worker ID; give each datacenter a range of its own, disjoint from the others' (--worker-id-min, --worker-id-max), and every dispenser of one datacenter the same range",
			p.rng, mine)
	case p.workerID == workerID && p.nodeID != nodeID:
		return fmt.Sprintf("it runs with worker ID %d, the same as this node's: unless it is about to stop (its lease lost), two registries hand out the same worker IDs; give each datacenter a range of its own (--worker-id-min, --worker-id-max)",
			workerID)
	}
	return ""
}

// peerRangeWatch is the state of the peer range check: how many peers conflicted at
// the last check, and when each conflict was last logged.
type peerRangeWatch struct {
	conflicts atomic.Int64

	mu     sync.Mutex
	warned map[string]time.Time // peer instance + reason: last logged
}

// watchPeerRanges asks $SRV.INFO.<prefix> at once and then every peerCheckEvery, and
// warns about each peer whose worker ID or range conflicts with this node's (logged
// again for the same peer at most every peerWarnEvery). It never fails: a check that
// gets no answers (no peers, or no permission to ask) finds nothing.
func (d *Dispenser) watchPeerRanges(ctx context.Context) error {
	every, warnEvery := d.opts.peerCheckEvery, d.opts.peerWarnEvery
	if every <= 0 {
		every = peerCheckEvery
	}
	if warnEvery <= 0 {
		warnEvery = peerWarnEvery
	}
	subject, err := micro.ControlSubject(micro.InfoVerb, d.cfg.Prefix, "")
	if err != nil {
		return err
	}
	log := d.log.With("component", "peer-ranges")
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		answers, err := fanIn(ctx, d.nc, subject, peerWindow)
		if errors.Is(err, errPeersRefused) {
			// Asking again would only repeat the server's refusal every check.
			log.Warn("peer range check off: this node's NATS user may not ask its peers, so a peer with an overlapping worker-ID range goes unnoticed; allow it to publish to "+subject,
				"err", err)
			<-ctx.Done()
			return nil
		}
		if err != nil && ctx.Err() == nil {
			log.Debug("peer range check: cannot ask the peers", "subject", subject, "err", err)
		}
		d.checkPeers(answers, warnEvery, log)
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		}
	}
}

// checkPeers compares every answer of a check with this node and logs the conflicts
// that are due.
func (d *Dispenser) checkPeers(answers []*nats.Msg, warnEvery time.Duration, log *slog.Logger) {
	self := d.svc.Info().ID
	mine := d.cfg.workerRange()
	workerID := d.snowflakes.WorkerID() // the one its IDs carry
	w := &d.peerRanges
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.warned == nil {
		w.warned = map[string]time.Time{}
	}
	now := time.Now()
	for k, at := range w.warned {
		if now.Sub(at) >= warnEvery {
			delete(w.warned, k)
		}
	}
	var conflicts int64
	for _, m := range answers {
		p, err := parsePeer(m.Data)
		if err != nil || p.instance == self {
			continue
		}
		reason := rangeConflict(d.cfg.NodeID, workerID, mine, p)
		if reason == "" {
			continue
		}
		conflicts++
		key := p.instance + "\x00" + reason
		if _, recent := w.warned[key]; recent {
			continue
		}
		w.warned[key] = now
		log.Warn("a peer dispenser's worker-ID range conflicts with this one's: "+reason,
			"peer_node", p.nodeID, "peer_instance", p.instance, "peer_worker_id", p.workerID, "peer_range", rangeText(p),
			"worker_id", workerID, "range", mine.String())
	}
	w.conflicts.Store(conflicts)
}

// rangeText is a peer's range for logs, "none" when it publishes none.
func rangeText(p peer) string {
	if !p.hasRange {
		return "none"
	}
	return p.rng.String()
}

// errPeersRefused is fanIn's error when the server refused the request: the
// connection's user may not publish to the discovery subject (deploy/nats-roles.conf).
var errPeersRefused = errors.New("the NATS server refuses the discovery request")

// fanIn publishes an empty request on subject and collects every answer until window
// passed, ctx ended, or no answer came for peerQuiet after the last one. NATS' "no
// responders" status ends it with no answers; a refused publish with errPeersRefused.
func fanIn(ctx context.Context, nc *nats.Conn, subject string, window time.Duration) ([]*nats.Msg, error) {
	ctx, cancel := context.WithTimeout(ctx, window)
	defer cancel()
	inbox := nc.NewRespInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return nil, err
	}
	defer sub.Unsubscribe() //nolint:errcheck // the inbox is ours alone
	if err := nc.PublishRequest(subject, inbox, nil); err != nil {
		return nil, err
	}
	// A refusal comes back asynchronously, before the answer to a round trip.
	if err := nc.FlushWithContext(ctx); err != nil {
		return nil, err
	}
	if err := nc.LastError(); errors.Is(err, nats.ErrPermissionViolation) && strings.Contains(err.Error(), subject) {
		return nil, fmt.Errorf("%w: %w", errPeersRefused, err)
	}
	var out []*nats.Msg
	for {
		wait, stop := ctx, context.CancelFunc(func() {})
		if len(out) > 0 {
			wait, stop = context.WithTimeout(ctx, peerQuiet)
		}
		m, err := sub.NextMsgWithContext(wait)
		stop()
		switch {
		case errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled):
			return out, nil
		case err != nil:
			return out, err
		case m.Header.Get("Status") == "503":
			return out, nil // no responders
		}
		out = append(out, m)
	}
}
