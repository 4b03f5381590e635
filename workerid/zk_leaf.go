package workerid

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/leafbus/leafbus/wire"
)

// Leaf's layout (Recycle false): /snowflake/<name>/forever/<ip>:<port>-<10-digit seq>,
// persistent sequential nodes holding JSON {"ip","port","timestamp"}; the sequence is the
// worker ID, kept for good by that ip:port, so a Leaf node's ID carries over. Leaf's own
// first start has a race: a node that finds no forever node creates its node and keeps
// the worker ID's default, 0, without reading the sequence it got, so two nodes starting
// together on an empty tree both run as worker 0. Here the ID is always parsed from the
// name ZooKeeper gave the node. Two processes with the same ip:port (a misconfiguration)
// would both find the same node, so each first takes an ephemeral node
// /snowflake/<name>/leafbus/alive/<ip>:<port> with a create that fails when it exists:
// only one of them runs. (It sits outside forever/, whose children Leaf parses.) The
// sequence counter of forever/ only grows, so a sequence outside MinWorkerID..MaxWorkerID
// is refused (ErrZKSequenceOutOfRange), never folded into range (zk_range.go).

// forever is Leaf's own directory of worker IDs, one persistent sequential node per
// ip:port.
func (r *ZKRegistry) forever() string { return r.base() + "/forever" }

// alivePath is this ip:port's ephemeral node: whoever holds it runs as this ip:port.
func (r *ZKRegistry) alivePath() string { return r.base() + "/leafbus/alive/" + r.cfg.Advertise }

// leafEndpoint is the JSON of a node under forever/, as Leaf writes it (wire.ZKLeafNode).
type leafEndpoint = wire.ZKLeafNode

// leafNode is a child of forever/.
type leafNode struct {
	name string
	addr string // ip:port
	seq  int64
}

// parseLeafNode splits "<ip>:<port>-<seq>"; ok is false for names Leaf would not write.
func parseLeafNode(name string) (leafNode, bool) {
	i := strings.LastIndexByte(name, '-')
	if i <= 0 {
		return leafNode{}, false
	}
	seq, err := strconv.ParseInt(name[i+1:], 10, 64)
	if err != nil || seq < 0 {
		return leafNode{}, false
	}
	return leafNode{name: name, addr: name[:i], seq: seq}, true
}

// listForever returns the parsed children of forever/ (none when it does not exist).
func (r *ZKRegistry) listForever(ctx context.Context) ([]leafNode, error) {
	var children []string
	err := r.call(ctx, func() (err error) {
		children, _, err = r.conn.Children(r.forever())
		return err
	})
	if errors.Is(err, zk.ErrNoNode) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", r.forever(), err)
	}
	nodes := make([]leafNode, 0, len(children))
	for _, c := range children {
		if n, ok := parseLeafNode(c); ok {
			nodes = append(nodes, n)
		}
	}
	sort.Slice(nodes, func(i, j int) bool { return nodes[i].seq < nodes[j].seq })
	return nodes, nil
}

// acquireForever is Leaf's start-up: take the alive node, find this ip:port's node under
// forever/ or create it, and read its recorded timestamp.
func (r *ZKRegistry) acquireForever(ctx context.Context) (Lease, error) {
	if err := r.ensurePath(ctx, r.forever()); err != nil {
		return nil, err
	}
	if err := r.takeAlive(ctx); err != nil {
		return nil, err
	}
	l, err := r.registerForever(ctx)
	if err != nil {
		// Let a corrected restart (or the other process) go on at once.
		_ = r.call(context.WithoutCancel(ctx), func() error { return r.conn.Delete(r.alivePath(), -1) })
		return nil, err
	}
	return l, nil
}

// takeAlive creates this ip:port's ephemeral alive node. One left by a crashed run of
// this node disappears when that session expires, so it waits up to a session timeout
// (plus a second) before refusing with ErrZKAddressInUse.
func (r *ZKRegistry) takeAlive(ctx context.Context) error {
	if err := r.ensurePath(ctx, path.Dir(r.alivePath())); err != nil {
		return err
	}
	data := r.aliveData()
	wait := time.NewTimer(r.cfg.SessionTimeout + time.Second)
	defer wait.Stop()
	logged := false
	for {
		err := r.call(ctx, func() error {
			_, err := r.conn.Create(r.alivePath(), data, zk.FlagEphemeral, zk.WorldACL(zk.PermAll))
			return err
		})
		if err == nil {
			return nil
		}
		if !errors.Is(err, zk.ErrNodeExists) {
			return fmt.Errorf("create %s: %w", r.alivePath(), err)
		}
		if mine, err := r.adoptAlive(ctx); err != nil || mine {
			return err // an earlier session of this node's, taken over (zk_takeover.go)
		}
		var gone <-chan zk.Event
		var exists bool
		err = r.call(ctx, func() (err error) {
			exists, _, gone, err = r.conn.ExistsW(r.alivePath())
			return err
		})
		if err != nil {
			return fmt.Errorf("watch %s: %w", r.alivePath(), err)
		}
		if !exists {
			continue
		}
		if !logged {
			r.log.Warn("another session is registered under this ip:port; waiting up to a session timeout in case it is this node's own crashed run",
				"path", r.alivePath(), "session_timeout", r.cfg.SessionTimeout)
			logged = true
		}
		select {
		case <-gone:
		case <-ctx.Done():
			return fmt.Errorf("wait for %s to go: %w", r.alivePath(), ctx.Err())
		case <-wait.C:
			return fmt.Errorf("%w: %s is held by another live ZooKeeper session for longer than a session timeout (%s): another process runs as %s under /snowflake/%s; give each node its own --advertise ip:port",
				ErrZKAddressInUse, r.alivePath(), r.cfg.SessionTimeout, r.cfg.Advertise, r.cfg.Name)
		}
	}
}

// registerForever finds or creates this ip:port's node; the caller holds the alive node.
func (r *ZKRegistry) registerForever(ctx context.Context) (Lease, error) {
	nodes, err := r.listForever(ctx)
	if err != nil {
		return nil, err
	}
	var own []leafNode
	for _, n := range nodes {
		if n.addr == r.cfg.Advertise {
			own = append(own, n)
		}
	}
	var node leafNode
	switch {
	case len(own) > 0:
		// Leaf's race can leave one ip:port two nodes: take the lowest, every time.
		node = own[0]
		if len(own) > 1 {
			r.log.Warn("this ip:port has several nodes under forever/ (Leaf's start-up race); using the lowest", "nodes", len(own), "node", node.name)
		}
	default:
		if err := r.checkCounter(ctx); err != nil {
			return nil, err
		}
		data, _ := json.Marshal(leafEndpoint{IP: r.ip, Port: r.port, Timestamp: time.Now().UnixMilli()})
		var created string
		err := r.call(ctx, func() (err error) {
			created, err = r.conn.Create(r.forever()+"/"+r.cfg.Advertise+"-", data, zk.FlagSequence, zk.WorldACL(zk.PermAll))
			return err
		})
		if err != nil {
			return nil, fmt.Errorf("create this node's sequential node under %s: %w", r.forever(), err)
		}
		n, ok := parseLeafNode(path.Base(created))
		if !ok {
			return nil, fmt.Errorf("ZooKeeper named the new node %q, which is not <ip>:<port>-<sequence>", created)
		}
		node = n
		r.log.Info("registered under forever/", "node", created, "worker_id", n.seq)
		r.removeOutOfRange(ctx, created, n.seq)
	}
	if err := r.checkSequence(node, len(own) == 0); err != nil {
		return nil, err
	}
	for _, n := range nodes {
		if n.seq == node.seq && n.addr != node.addr {
			return nil, fmt.Errorf("%w: worker ID %d is claimed by both %s and %s under %s (was %s deleted and re-created?); refusing to share it",
				ErrNoWorkerID, node.seq, n.name, node.name, r.forever(), r.forever())
		}
	}
	l := newZKForeverLease(r, node.seq, 0, r.forever()+"/"+node.name)
	if len(own) > 0 {
		// An existing node: its timestamp is the last one this ip:port (or Leaf) reported.
		// A node created just now holds only its creation time, and no ID was issued yet.
		ep, _, err := l.read(ctx)
		if err != nil {
			return nil, err
		}
		l.recorded = ep.Timestamp
	}
	r.log.Info("worker ID from ZooKeeper (Leaf layout)", "worker_id", l.id, "node", l.path,
		"recorded", l.recorded, "recorded_time", fmtMs(l.recorded))
	return l, nil
}

// fromCache is the start with ZooKeeper unreachable: the cache file's worker ID, its
// timestamp as the record (the Guard refuses a clock behind it).
func (r *ZKRegistry) fromCache() (Lease, error) {
	if r.cfg.Cache == nil {
		return nil, fmt.Errorf("%w: no session with %v within %s and no cache file configured to start from",
			ErrZKUnavailable, r.cfg.Servers, min(r.cfg.SessionTimeout, zkStartWait))
	}
	e, err := r.cfg.Cache.Load()
	if err != nil {
		return nil, fmt.Errorf("%w: no session with %v within %s, and the cache file gives no worker ID: %w",
			ErrZKUnavailable, r.cfg.Servers, min(r.cfg.SessionTimeout, zkStartWait), err)
	}
	if err := r.checkCached(e); err != nil {
		return nil, err
	}
	r.log.Warn("ZooKeeper unreachable: starting from the cache file; the clock guard checks its timestamp",
		"cache", r.cfg.Cache.Path, "worker_id", e.WorkerID, "recorded_time", fmtMs(e.Timestamp))
	return newZKForeverLease(r, e.WorkerID, e.Timestamp, ""), nil
}

// zkForeverLease is a worker ID in Leaf's layout, held for good.
type zkForeverLease struct {
	reg       *ZKRegistry
	id        int64
	recorded  int64
	fromCache bool // started from the cache file: path is found once ZooKeeper answers

	mu    sync.Mutex
	path  string        // this ip:port's node under forever/
	found chan struct{} // closed once path is known: path does not change after
}

// newZKForeverLease returns the lease on worker ID id of the node at path ("" when it
// is not known yet: started from the cache file).
func newZKForeverLease(r *ZKRegistry, id, recorded int64, path string) *zkForeverLease {
	l := &zkForeverLease{reg: r, id: id, recorded: recorded, fromCache: path == "", path: path, found: make(chan struct{})}
	if path != "" {
		close(l.found)
	}
	return l
}

var _ Lease = (*zkForeverLease)(nil)

func (l *zkForeverLease) WorkerID() int64    { return l.id }
func (l *zkForeverLease) Recorded() int64    { return l.recorded }
func (l *zkForeverLease) TTL() time.Duration { return 0 }

// read returns the node's JSON and version.
func (l *zkForeverLease) read(ctx context.Context) (leafEndpoint, int32, error) {
	var data []byte
	var st *zk.Stat
	err := l.reg.call(ctx, func() (err error) {
		data, st, err = l.reg.conn.Get(l.path)
		return err
	})
	if err != nil {
		return leafEndpoint{}, 0, fmt.Errorf("read %s: %w", l.path, err)
	}
	var ep leafEndpoint
	if len(data) > 0 {
		if err := json.Unmarshal(data, &ep); err != nil {
			// Refuse rather than guess: it may have held a timestamp already used.
			return leafEndpoint{}, 0, fmt.Errorf("%s does not hold Leaf's JSON (%q): %w", l.path, data, err)
		}
	}
	return ep, st.Version, nil
}

// Renew writes ts into the node's JSON with a compare-and-set on its version, only ever
// raising it (Leaf nodes write theirs unconditionally). It also checks the alive node:
// when this session lost it (expired) and another process took it, that process runs
// as the same ip:port, so this one returns ErrLeaseLost and stops. Started from the cache
// file, it first looks for the ip:port's node and fails until it finds it.
func (l *zkForeverLease) Renew(ctx context.Context, ts int64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	r := l.reg
	if !r.hasSession() {
		return r.errNoSession()
	}
	if err := l.checkAlive(ctx); err != nil {
		return err
	}
	if l.path == "" {
		if err := l.adopt(ctx); err != nil {
			return err
		}
	}
	for attempt := 0; attempt < casAttempts; attempt++ {
		ep, version, err := l.read(ctx)
		if err != nil {
			return err
		}
		if ep.Timestamp >= ts {
			return nil
		}
		data, _ := json.Marshal(leafEndpoint{IP: r.ip, Port: r.port, Timestamp: ts})
		err = r.call(ctx, func() error {
			_, err := r.conn.Set(l.path, data, version)
			return err
		})
		if errors.Is(err, zk.ErrBadVersion) {
			continue
		}
		if err != nil {
			return fmt.Errorf("write %s: %w", l.path, err)
		}
		return nil
	}
	return fmt.Errorf("write %s: it kept changing", l.path)
}

// checkAlive makes sure this session holds the alive node, re-creating it after a
// session expiry.
func (l *zkForeverLease) checkAlive(ctx context.Context) error {
	r := l.reg
	var st *zk.Stat
	var exists bool
	err := r.call(ctx, func() (err error) {
		exists, st, err = r.conn.Exists(r.alivePath())
		return err
	})
	if err != nil {
		return fmt.Errorf("check %s: %w", r.alivePath(), err)
	}
	if exists && st.EphemeralOwner == r.conn.SessionID() {
		return nil
	}
	if exists {
		if mine, err := r.adoptAlive(ctx); err != nil || mine {
			return err // this node's earlier session (its client was replaced), taken over
		}
		return fmt.Errorf("%w: %s is now held by another ZooKeeper session: another process runs as %s, worker ID %d",
			ErrLeaseLost, r.alivePath(), r.cfg.Advertise, l.id)
	}
	if err := r.ensurePath(ctx, path.Dir(r.alivePath())); err != nil {
		return err
	}
	err = r.call(ctx, func() error {
		_, err := r.conn.Create(r.alivePath(), r.aliveData(), zk.FlagEphemeral, zk.WorldACL(zk.PermAll))
		return err
	})
	if errors.Is(err, zk.ErrNodeExists) {
		if mine, err := r.adoptAlive(ctx); err != nil || mine {
			return err
		}
		return fmt.Errorf("%w: %s was just taken by another ZooKeeper session: another process runs as %s, worker ID %d",
			ErrLeaseLost, r.alivePath(), r.cfg.Advertise, l.id)
	}
	if err != nil {
		return fmt.Errorf("re-create %s: %w", r.alivePath(), err)
	}
	r.log.Warn("re-created this node's alive node (the session had expired)", "path", r.alivePath())
	return nil
}

// adopt finds the node of a lease started from the cache file, once ZooKeeper answers.
func (l *zkForeverLease) adopt(ctx context.Context) error {
	r := l.reg
	nodes, err := r.listForever(ctx)
	if err != nil {
		return err
	}
	for _, n := range nodes {
		if n.addr != r.cfg.Advertise {
			continue
		}
		if n.seq != l.id {
			return fmt.Errorf("ZooKeeper is back, but %s/%s gives this ip:port worker ID %d while the cache file gave %d: restart this node to take ZooKeeper's",
				r.forever(), n.name, n.seq, l.id)
		}
		l.path = r.forever() + "/" + n.name
		close(l.found)
		r.log.Info("ZooKeeper is back: found this node's worker ID node", "path", l.path)
		return nil
	}
	return fmt.Errorf("ZooKeeper is back, but %s has no node for %s (worker ID %d from the cache file)", r.forever(), r.cfg.Advertise, l.id)
}

// Release records ts and gives the alive node back so a restart need not wait for this
// session to expire; the worker ID stays this ip:port's.
func (l *zkForeverLease) Release(ctx context.Context, ts int64) error {
	if err := l.Renew(ctx, ts); err != nil {
		return err
	}
	r := l.reg
	err := r.call(ctx, func() error {
		exists, st, err := r.conn.Exists(r.alivePath())
		if err != nil || !exists || st.EphemeralOwner != r.conn.SessionID() {
			return err
		}
		return r.conn.Delete(r.alivePath(), st.Version)
	})
	if err != nil && !errors.Is(err, zk.ErrNoNode) {
		return fmt.Errorf("delete %s: %w", r.alivePath(), err)
	}
	return nil
}
