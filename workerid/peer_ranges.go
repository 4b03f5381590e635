package workerid

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
)

// The peers' worker-ID range check (PROTOCOL.md "Worker-ID ranges"): every dispenser
// publishes its worker ID and range in its $SRV.INFO metadata, and looks at its peers'
// through $SRV discovery, warning about a misconfiguration it can see.
//
// The rule: dispensers of one datacenter share one range (their registry keeps their
// worker IDs apart), and datacenters get disjoint ranges. So a peer with the same range
// is a neighbour in the same deployment, one with a disjoint range is another
// datacenter's (seen across a supercluster's gateways), and a peer whose range differs
// from this node's yet overlaps it is a misconfiguration: two registries that cannot
// see each other may hand out the same worker ID. A peer (another node ID) that reports
// this node's very worker ID is warned about whatever the ranges: two datacenters left
// at the default range look like one deployment, and that is how they show.

// Peer range check defaults: how often the peers are asked, how long their answers are
// collected (a peer across a gateway answers within milliseconds; quiet ends the wait
// once answers stop coming), and how often one peer's conflict is logged again.
const (
	DefaultPeerCheckEvery = 30 * time.Second
	DefaultPeerWarnEvery  = 10 * time.Minute
	peerWindow            = 2 * time.Second
	peerQuiet             = 250 * time.Millisecond
)

// PeersConfig configures the peers' worker-ID range check of a Keeper.
type PeersConfig struct {
	// Conn asks the peers; nil turns the check off.
	Conn *nats.Conn
	// Service is the micro service's name, the dispensers' prefix: the check asks
	// $SRV.INFO.<Service>. Required with Conn.
	Service string
	// Range is this deployment's worker IDs (--worker-id-min, --worker-id-max).
	Range Range
	// Self is this dispenser's service instance ID, whose own answer is skipped; nil or
	// "" skips none.
	Self func() string
	// Every is how often the peers are asked (0: DefaultPeerCheckEvery), WarnEvery how
	// often one peer's conflict is logged again (0: DefaultPeerWarnEvery).
	Every, WarnEvery time.Duration
	// Layout is the name of this node's snowflake layout (snowflake.Layout.Name); a peer
	// running another is a conflict. "" skips the comparison.
	Layout string
}

func (c PeersConfig) validate() error {
	const component = "peer range check"
	switch {
	case c.Conn != nil && c.Service == "":
		return invalid(component, "Service is empty, want the service name the peers answer $SRV.INFO under")
	case c.Every < 0 || c.WarnEvery < 0:
		return invalid(component, "Every %s and WarnEvery %s: want >= 0 (0: the defaults)", c.Every, c.WarnEvery)
	}
	return nil
}

// peer is what a dispenser's $SRV.INFO says about its worker ID and range.
type peer struct {
	instance string // the service instance ID
	nodeID   string
	workerID int64 // -1: not published
	rng      Range
	hasRange bool
	layout   string // its snowflake layout's name
}

// legacyLayout is the layout of a peer that publishes none: one from before
// --snowflake-layout, which had Leaf's alone.
const legacyLayout = "leaf"

// parsePeer reads an $SRV.INFO answer.
func parsePeer(data []byte) (peer, error) {
	var info micro.Info
	if err := json.Unmarshal(data, &info); err != nil {
		return peer{}, err
	}
	m := info.Metadata
	p := peer{instance: info.ID, nodeID: m[wire.MetaNodeID], workerID: -1, layout: m[wire.MetaSnowflakeLayout]}
	if p.layout == "" {
		p.layout = legacyLayout
	}
	if w, err := strconv.ParseInt(m[wire.MetaWorkerID], 10, 64); err == nil {
		p.workerID = w
	}
	lo, errLo := strconv.ParseInt(m[wire.MetaWorkerIDMin], 10, 64)
	hi, errHi := strconv.ParseInt(m[wire.MetaWorkerIDMax], 10, 64)
	if errLo == nil && errHi == nil {
		p.rng, p.hasRange = Range{Min: lo, Max: hi}, true
	}
	return p, nil
}

// rangeConflict says what is wrong with peer p next to a node of node ID nodeID with
// worker ID workerID and range mine; "" when nothing is.
func rangeConflict(nodeID string, workerID int64, mine Range, p peer) string {
	return peerConflict(nodeID, workerID, mine, "", p)
}

// peerConflict is rangeConflict that also compares the snowflake layout (layout "":
// not compared).
func peerConflict(nodeID string, workerID int64, mine Range, layout string, p peer) string {
	switch {
	case layout != "" && p.layout != layout:
		return layoutConflict(layout, p)
	case p.hasRange && mine.Conflicts(p.rng):
		return fmt.Sprintf("its worker IDs %s overlap this node's %s without being the same range: two deployments whose registries cannot see each other may hand out the same worker ID; give each datacenter a range of its own, disjoint from the others' (--worker-id-min, --worker-id-max), and every dispenser of one datacenter the same range",
			p.rng, mine)
	case p.workerID == workerID && p.nodeID != nodeID:
		return fmt.Sprintf("it runs with worker ID %d, the same as this node's: unless it is about to stop (its lease lost), two registries hand out the same worker IDs; give each datacenter a range of its own (--worker-id-min, --worker-id-max)",
			workerID)
	}
	return ""
}

// peerRanges is the state of the peer range check: how many peers conflicted at the
// last check, and when each conflict was last logged.
type peerRanges struct {
	cfg      PeersConfig
	nodeID   string
	workerID func() int64 // the one this node's IDs carry
	log      *slog.Logger

	conflicts atomic.Int64

	mu     sync.Mutex
	warned map[string]time.Time // peer instance + reason: last logged
}

func newPeerRanges(cfg PeersConfig, nodeID string, workerID func() int64, log *slog.Logger) *peerRanges {
	if cfg.Every <= 0 {
		cfg.Every = DefaultPeerCheckEvery
	}
	if cfg.WarnEvery <= 0 {
		cfg.WarnEvery = DefaultPeerWarnEvery
	}
	return &peerRanges{cfg: cfg, nodeID: nodeID, workerID: workerID, log: log, warned: map[string]time.Time{}}
}

// start runs the check until the returned stop is called (which waits for it); without
// a connection it does nothing.
func (w *peerRanges) start() (stop func()) {
	if w.cfg.Conn == nil {
		return func() {}
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		w.run(ctx)
	}()
	return func() {
		cancel()
		<-done
	}
}

// run asks $SRV.INFO.<service> at once and then every Every, and warns about each peer
// whose worker ID or range conflicts with this node's (logged again for the same peer
// at most every WarnEvery), until ctx ends. A check that gets no answers (no peers, or
// no permission to ask) finds nothing.
func (w *peerRanges) run(ctx context.Context) {
	subject, err := micro.ControlSubject(micro.InfoVerb, w.cfg.Service, "")
	if err != nil {
		w.log.Warn("peer range check off", "err", err)
		return
	}
	tick := time.NewTicker(w.cfg.Every)
	defer tick.Stop()
	for {
		answers, err := fanIn(ctx, w.cfg.Conn, subject, peerWindow)
		if errors.Is(err, errPeersRefused) {
			// Asking again would only repeat the server's refusal every check.
			w.log.Warn("peer range check off: this node's NATS user may not ask its peers, so a peer with an overlapping worker-ID range goes unnoticed; allow it to publish to "+subject,
				"err", err)
			return
		}
		if err != nil && ctx.Err() == nil {
			w.log.Debug("peer range check: cannot ask the peers", "subject", subject, "err", err)
		}
		w.check(answers, time.Now())
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// check compares every answer of a check with this node and logs the conflicts that
// are due.
func (w *peerRanges) check(answers []*nats.Msg, now time.Time) {
	self := ""
	if w.cfg.Self != nil {
		self = w.cfg.Self()
	}
	mine := w.cfg.Range
	workerID := w.workerID()
	w.mu.Lock()
	defer w.mu.Unlock()
	for k, at := range w.warned {
		if now.Sub(at) >= w.cfg.WarnEvery {
			delete(w.warned, k)
		}
	}
	var conflicts int64
	for _, m := range answers {
		p, err := parsePeer(m.Data)
		if err != nil || (self != "" && p.instance == self) {
			continue
		}
		reason := peerConflict(w.nodeID, workerID, mine, w.cfg.Layout, p)
		if reason == "" {
			continue
		}
		conflicts++
		key := p.instance + "\x00" + reason
		if _, recent := w.warned[key]; recent {
			continue
		}
		w.warned[key] = now
		w.log.Warn("a peer dispenser's worker-ID range conflicts with this one's: "+reason,
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
		case wire.NoResponders(m.Header, m.Data):
			return out, nil // no responders
		}
		out = append(out, m)
	}
}

// layoutConflict says why a peer with another snowflake layout than this node's
// (layout) is a misconfiguration.
func layoutConflict(layout string, p peer) string {
	return fmt.Sprintf("it runs the %s snowflake layout, this node the %s one: every dispenser of a deployment must run one layout (--snowflake-layout), or their IDs' bits mean different things", p.layout, layout)
}

// ErrPeerLayout is returned by CheckPeerLayouts when a live dispenser of the service
// runs another snowflake layout than this node.
var ErrPeerLayout = errors.New("a peer dispenser runs another snowflake layout")

// CheckPeerLayouts asks every live dispenser of service ($SRV.INFO) which snowflake
// layout it runs and refuses (ErrPeerLayout, naming each) when one runs another than
// layout: a dispenser that publishes none runs Leaf's, the only one before
// --snowflake-layout, so a fleet of older dispensers is seen too, not only one that
// wrote the deployment record. self is this node's own service instance, skipped. With
// no answer, or no permission to ask, there is nothing to compare.
func CheckPeerLayouts(ctx context.Context, nc *nats.Conn, service, layout, self string) error {
	subject, err := micro.ControlSubject(micro.InfoVerb, service, "")
	if err != nil {
		return err
	}
	answers, err := fanIn(ctx, nc, subject, peerWindow)
	if err != nil && !errors.Is(err, errPeersRefused) && ctx.Err() != nil {
		return err
	}
	var found []string
	for _, m := range answers {
		p, err := parsePeer(m.Data)
		if err != nil || p.instance == self || p.layout == layout {
			continue
		}
		found = append(found, fmt.Sprintf("node %s (instance %s) runs %s", wire.Quote(p.nodeID), wire.Quote(p.instance), wire.Quote(p.layout)))
		if len(found) == 5 {
			found = append(found, "...")
			break
		}
	}
	if len(found) > 0 {
		return fmt.Errorf("%w: this node runs the %s layout, but %s: start it with the deployment's --snowflake-layout, or stop those first",
			ErrPeerLayout, layout, strings.Join(found, "; "))
	}
	return nil
}
