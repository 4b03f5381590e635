package workerid

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/leafbus/leafbus/client"
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
	defaultPeerCheckEvery = 30 * time.Second
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
	// Every is how often the peers are asked (0: defaultPeerCheckEvery), WarnEvery how
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

// parsePeer reads an $SRV.INFO answer. Its texts are bounded for logs and messages
// (peerField): an answer is anyone's to write.
func parsePeer(data []byte) (peer, error) {
	var info micro.Info
	if err := json.Unmarshal(data, &info); err != nil {
		return peer{}, err
	}
	m := info.Metadata
	p := peer{instance: peerField(info.ID), nodeID: peerField(m[wire.MetaNodeID]), workerID: -1, layout: peerField(m[wire.MetaSnowflakeLayout])}
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

// maxPeerField is the longest text of a peer's answer used as it is: a node ID, an
// instance ID (a NUID, 22) and a layout name are all shorter.
const maxPeerField = 64

// peerField is s as it is when it is a short token (at most maxPeerField of A-Z a-z
// 0-9 . _ -, as node IDs, instance IDs and layout names are), else quoted and cut
// (wire.Quote): a rogue's 20 KB node ID or control characters never reach a log line
// whole.
func peerField(s string) string {
	if len(s) > maxPeerField {
		return wire.Quote(s)
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-') {
			return wire.Quote(s)
		}
	}
	return s
}

// quoted is a peer's field (peerField) in quotes: a token quoted, one peerField quoted
// and cut already as it is.
func quoted(field string) string {
	if strings.HasPrefix(field, `"`) {
		return field
	}
	return wire.Quote(field)
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

// Bounds of the peer range check's warnings. A warning is logged once per WarnEvery for
// what it says (the reason, not the peer: a rogue rotating 10,000 fake instances with
// one conflict writes one line), naming up to maxWarnPeers of the peers that say it; at
// most maxWarnReasons reasons are remembered per WarnEvery, and what is beyond them is
// summed up in one line per WarnEvery. So a check writes at most maxWarnReasons + 1
// lines per WarnEvery, whatever answers $SRV.INFO.
const (
	maxWarnReasons = 16
	maxWarnPeers   = 5
)

// peerRanges is the state of the peer range check: how many peers conflicted at the
// last check, and when each conflict was last logged.
type peerRanges struct {
	cfg      PeersConfig
	nodeID   string
	workerID func() int64 // the one this node's IDs carry
	log      *slog.Logger

	conflicts atomic.Int64
	checks    atomic.Int64 // checks done, for tests that wait for more

	mu         sync.Mutex
	warned     map[string]time.Time // reason: last logged
	summarized time.Time            // when the line about unlogged conflicts was last written
}

func newPeerRanges(cfg PeersConfig, nodeID string, workerID func() int64, log *slog.Logger) *peerRanges {
	if cfg.Every <= 0 {
		cfg.Every = defaultPeerCheckEvery
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

// askPeers is how the peer checks ask $SRV.INFO.<service>: client.AskAll's bounds (at
// most 1,024 answers of 16 KB), collected for up to peerWindow, peerQuiet after the last.
// The answer of instance self (this node's own, "": none) and those that are no
// $SRV.INFO are not kept: this node's own answer comes first, and it must not start the
// quiet time that ends the wait for the peers' (on a busy machine they came too late,
// and a start's range check saw no peer).
func askPeers(ctx context.Context, nc *nats.Conn, service, subject, self string) (client.Answers, error) {
	keep := func(m *nats.Msg) bool {
		p, err := parsePeer(m.Data)
		return err == nil && (self == "" || p.instance != self)
	}
	return client.AskAll{Prefix: service, Window: peerWindow, Quiet: peerQuiet, Keep: keep}.Do(ctx, nc, nats.NewMsg(subject))
}

// run asks $SRV.INFO.<service> at once and then every Every, and warns about the peers
// whose worker ID or range conflicts with this node's (check), until ctx ends. A check
// that gets no answers (no peers) finds nothing; one the server refuses turns the check
// off.
func (w *peerRanges) run(ctx context.Context) {
	subject, err := micro.ControlSubject(micro.InfoVerb, w.cfg.Service, "")
	if err != nil {
		w.log.Warn("peer range check off", "err", err)
		return
	}
	tick := time.NewTicker(w.cfg.Every)
	defer tick.Stop()
	for {
		self := ""
		if w.cfg.Self != nil {
			self = w.cfg.Self()
		}
		answers, err := askPeers(ctx, w.cfg.Conn, w.cfg.Service, subject, self)
		if errors.Is(err, nats.ErrPermissionViolation) {
			// Asking again would only repeat the server's refusal every check.
			w.log.Warn("peer range check off: this node's NATS user may not ask its peers, so a peer with an overlapping worker-ID range goes unnoticed; allow it to publish to "+subject,
				"err", err)
			return
		}
		if err != nil && ctx.Err() == nil {
			w.log.Debug("peer range check: cannot ask the peers", "subject", subject, "err", err)
		}
		w.check(answers.Msgs, time.Now())
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// conflictGroup is the peers of one check that conflict for one reason.
type conflictGroup struct {
	reason string
	first  peer     // the first peer found saying it, for the log line's details
	nodes  []string // up to maxWarnPeers node IDs of those peers
	count  int
}

// check compares every answer of a check with this node, counts the conflicting peers,
// and logs the conflicts that are due: one line per reason, at most maxWarnReasons
// reasons per WarnEvery, and one line per WarnEvery summing up the rest.
func (w *peerRanges) check(answers []*nats.Msg, now time.Time) {
	defer w.checks.Add(1)
	self := ""
	if w.cfg.Self != nil {
		self = w.cfg.Self()
	}
	mine := w.cfg.Range
	workerID := w.workerID()
	var groups []*conflictGroup
	byReason := map[string]*conflictGroup{}
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
		g := byReason[reason]
		if g == nil {
			g = &conflictGroup{reason: reason, first: p}
			byReason[reason] = g
			groups = append(groups, g)
		}
		g.count++
		if len(g.nodes) < maxWarnPeers && !slices.Contains(g.nodes, p.nodeID) {
			g.nodes = append(g.nodes, p.nodeID)
		}
	}
	w.conflicts.Store(conflicts)

	w.mu.Lock()
	defer w.mu.Unlock()
	for k, at := range w.warned {
		if now.Sub(at) >= w.cfg.WarnEvery {
			delete(w.warned, k)
		}
	}
	unlogged, unloggedPeers := 0, 0
	for _, g := range groups {
		if _, recent := w.warned[g.reason]; recent {
			continue
		}
		if len(w.warned) >= maxWarnReasons {
			unlogged++
			unloggedPeers += g.count
			continue
		}
		w.warned[g.reason] = now
		p := g.first
		nodes := strings.Join(g.nodes, ",")
		if more := g.count - len(g.nodes); more > 0 {
			nodes += fmt.Sprintf(",+%d more", more)
		}
		w.log.Warn("a peer dispenser's worker-ID range conflicts with this one's: "+g.reason,
			"peers", g.count, "peer_nodes", nodes, "peer_instance", p.instance, "peer_worker_id", p.workerID, "peer_range", rangeText(p),
			"worker_id", workerID, "range", mine.String())
	}
	if unlogged > 0 && now.Sub(w.summarized) >= w.cfg.WarnEvery {
		w.summarized = now
		w.log.Warn(fmt.Sprintf("%d more peer dispensers conflict with this one's worker IDs for %d other reasons, not logged: at most %d reasons are logged every %s ($SRV.STATS worker_id_conflicts counts every conflicting peer)",
			unloggedPeers, unlogged, maxWarnReasons, w.cfg.WarnEvery), "worker_id", workerID, "range", mine.String())
	}
}

// rangeText is a peer's range for logs, "none" when it publishes none.
func rangeText(p peer) string {
	if !p.hasRange {
		return "none"
	}
	return p.rng.String()
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
	answers, err := askPeers(ctx, nc, service, subject, self)
	if err != nil && ctx.Err() != nil {
		return err
	}
	var found []string
	for _, m := range answers.Msgs {
		p, err := parsePeer(m.Data)
		if err != nil || p.instance == self || p.layout == layout {
			continue
		}
		found = append(found, fmt.Sprintf("node %s (instance %s) runs %s", quoted(p.nodeID), quoted(p.instance), quoted(p.layout)))
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
