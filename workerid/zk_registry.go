package workerid

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zookeeper/zk"
)

// ErrZKUnavailable is returned by Acquire when no ZooKeeper session could be had in time
// and there is nothing safe to fall back on: recycle mode (the ID may have been given
// away meanwhile), or Leaf's layout without a readable cache file.
var ErrZKUnavailable = errors.New("ZooKeeper unreachable")

// ErrZKAddressInUse is returned when another live process is registered under this
// node's ip:port: two processes would issue IDs with one worker ID.
var ErrZKAddressInUse = errors.New("ip:port already registered by a live process")

// ErrZKSequenceOutOfRange is returned by Acquire in Leaf's layout when this node's
// sequence number (its worker ID) is above MaxWorkerID.
var ErrZKSequenceOutOfRange = errors.New("ZooKeeper sequence number above the worker ID range")

// ZooKeeper registry defaults.
const (
	// DefaultZKSessionTimeout is the session timeout in Leaf's layout: how long a crashed
	// process's "alive" node blocks a restart under the same ip:port.
	DefaultZKSessionTimeout = 10 * time.Second
	// zkStartWait bounds the wait for a first session before falling back to the cache
	// file (Leaf's Curator waits its connection timeout likewise).
	zkStartWait = 5 * time.Second
	// zkAuthenticatedFormat is go-zk v1.0.4's log line once a session is established; its
	// second argument is the timeout the server granted, which go-zk does not export.
	zkAuthenticatedFormat = "authenticated: id=%d, timeout=%d"
)

// ZKRegistryConfig configures a ZKRegistry.
type ZKRegistryConfig struct {
	// Servers are the ZooKeeper servers, host:port. Required.
	Servers []string
	// Name is Leaf's leaf.name: everything lives under /snowflake/<Name>/. Required.
	Name string
	// Advertise is this node's ip:port, its identity in Leaf's layout (Leaf's listen
	// address). Required.
	Advertise string
	// Recycle selects zk_recycle mode: worker IDs are leases held by this node's
	// ZooKeeper session, free again once the session expired.
	Recycle bool
	// TTL is the lease time with Recycle: the session timeout asked of ZooKeeper. The
	// heartbeat suspends the generator at TTL/2 without a renewal. Default 30 s.
	TTL time.Duration
	// MaxWorkerID is the highest worker ID (the snowflake layout's). Default 1023.
	MaxWorkerID int64
	// Cache is the node's cache file: the fallback when ZooKeeper is unreachable at start
	// in Leaf's layout (never with Recycle). Nil means no fallback.
	Cache *CacheFile
	// SessionTimeout of the ZooKeeper session in Leaf's layout (default 10 s); with
	// Recycle the session timeout is TTL and this is ignored. It also bounds the wait
	// for a first session (at most 5 s) before falling back to the cache file.
	SessionTimeout time.Duration
	// Logger; nil discards. go-zk's own chatter goes to it at debug level.
	Logger *slog.Logger
}

func (c ZKRegistryConfig) withDefaults() ZKRegistryConfig {
	if c.TTL == 0 {
		c.TTL = DefaultLeaseTTL
	}
	if c.MaxWorkerID == 0 {
		c.MaxWorkerID = DefaultMaxWorkerID
	}
	if c.SessionTimeout == 0 {
		c.SessionTimeout = DefaultZKSessionTimeout
	}
	if c.Recycle {
		c.SessionTimeout = c.TTL
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c
}

// Validate checks the configuration (after defaults); errors wrap ErrInvalidConfig.
func (c ZKRegistryConfig) Validate() error {
	c = c.withDefaults()
	if len(c.Servers) == 0 {
		return fmt.Errorf("%w: ZooKeeper registry: no servers", ErrInvalidConfig)
	}
	if c.Name == "" || strings.HasPrefix(c.Name, "/") || strings.HasSuffix(c.Name, "/") || strings.Contains(c.Name, "//") {
		return fmt.Errorf("%w: ZooKeeper registry: name %q must be a non-empty relative path (Leaf's leaf.name)", ErrInvalidConfig, c.Name)
	}
	host, port, err := net.SplitHostPort(c.Advertise)
	if err != nil || host == "" || port == "" || strings.ContainsAny(c.Advertise, "/-") {
		return fmt.Errorf("%w: ZooKeeper registry: advertise %q must be ip:port (without '/' or '-', which Leaf's node names cannot hold)", ErrInvalidConfig, c.Advertise)
	}
	if c.MaxWorkerID < 0 {
		return fmt.Errorf("%w: ZooKeeper registry: MaxWorkerID %d is negative", ErrInvalidConfig, c.MaxWorkerID)
	}
	if c.TTL < 0 || c.SessionTimeout < 0 {
		return fmt.Errorf("%w: ZooKeeper registry: TTL %s and SessionTimeout %s must be positive", ErrInvalidConfig, c.TTL, c.SessionTimeout)
	}
	return nil
}

// ZKRegistry hands out worker IDs from ZooKeeper, in one of two modes.
//
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
// sequence counter of forever/ only grows, so a sequence above MaxWorkerID is refused
// (ErrZKSequenceOutOfRange), never folded into range.
//
// Recycle (zk_recycle): the lease on worker ID n is the ephemeral node
// /snowflake/<name>/leafbus/leases/<n>, created only if absent, so no two sessions hold
// one ID even when they start at the same instant. The lease time is the session
// timeout: ZooKeeper itself deletes the node once it heard nothing from the holder's
// session for that long, judged on the servers' own (monotonic) timers, so no clocks
// of two machines are compared. The session timeout the server grants must be at least
// TTL (checked: the heartbeat suspends the generator at TTL/2 since the start of its last
// renewal, and every renewal is a request on the session, which restarts the server's
// timer no earlier). The persistent node /snowflake/<name>/leafbus/workers/<n> holds the
// highest timestamp any holder recorded and the last holder's token, as kv_registry's
// workers bucket does: a new holder starts past it (Recorded) and a holder whose token
// was replaced has lost the ID (ErrLeaseLost). IDs that Leaf-layout nodes of the same
// name hold are skipped.
type ZKRegistry struct {
	cfg      ZKRegistryConfig
	log      *slog.Logger
	conn     *zk.Conn
	granted  *atomic.Int64 // session timeout the server granted, ms; 0 until known
	ip, port string

	mu     sync.Mutex
	closed bool
	calls  sync.WaitGroup // ZooKeeper calls running for a context that may end first
}

var _ Registry = (*ZKRegistry)(nil)

// zkLogger sends go-zk's logs to slog at debug level and notes the session timeout the
// server granted.
type zkLogger struct {
	log     *slog.Logger
	granted *atomic.Int64
}

func (l zkLogger) Printf(format string, args ...any) {
	if format == zkAuthenticatedFormat && len(args) == 2 {
		if ms, ok := args[1].(int32); ok {
			l.granted.Store(int64(ms))
		}
	}
	l.log.Debug(fmt.Sprintf(format, args...))
}

// OpenZKRegistry validates cfg and starts a ZooKeeper client. It does not wait for a
// session: Acquire does, and falls back to the cache file when none comes.
func OpenZKRegistry(ctx context.Context, cfg ZKRegistryConfig) (*ZKRegistry, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	ip, port, _ := net.SplitHostPort(cfg.Advertise)
	r := &ZKRegistry{
		cfg:     cfg,
		log:     cfg.Logger.With("zk_name", cfg.Name, "advertise", cfg.Advertise),
		granted: new(atomic.Int64),
		ip:      ip,
		port:    port,
	}
	conn, _, err := zk.Connect(cfg.Servers, cfg.SessionTimeout,
		zk.WithLogger(zkLogger{log: cfg.Logger.With("component", "go-zk"), granted: r.granted}))
	if err != nil {
		return nil, fmt.Errorf("connect to ZooKeeper %v: %w", cfg.Servers, err)
	}
	r.conn = conn
	return r, nil
}

// Close ends the ZooKeeper session (deleting its ephemeral nodes: a recycled ID is free
// at once) and waits for calls still running.
func (r *ZKRegistry) Close() {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return
	}
	r.closed = true
	r.mu.Unlock()
	r.conn.Close() // fails every request still waiting
	r.calls.Wait()
}

func (r *ZKRegistry) base() string      { return "/snowflake/" + r.cfg.Name }
func (r *ZKRegistry) forever() string   { return r.base() + "/forever" }
func (r *ZKRegistry) alivePath() string { return r.base() + "/leafbus/alive/" + r.cfg.Advertise }
func (r *ZKRegistry) leasePath(id int64) string {
	return r.base() + "/leafbus/leases/" + strconv.FormatInt(id, 10)
}
func (r *ZKRegistry) workerPath(id int64) string {
	return r.base() + "/leafbus/workers/" + strconv.FormatInt(id, 10)
}

// call runs fn, returning early with ctx's error when ctx ends first (go-zk's calls take
// no context; Close fails them, and waits for them).
func (r *ZKRegistry) call(ctx context.Context, fn func() error) error {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return fmt.Errorf("ZooKeeper registry closed: %w", zk.ErrClosing)
	}
	r.calls.Add(1)
	r.mu.Unlock()
	done := make(chan error, 1)
	go func() {
		defer r.calls.Done()
		done <- fn()
	}()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// hasSession reports whether the client has a session now: calls made without one wait
// for a reconnect, so the heartbeat's renewals fail fast instead.
func (r *ZKRegistry) hasSession() bool { return r.conn.State() == zk.StateHasSession }

// waitSession waits up to d (and ctx) for a session.
func (r *ZKRegistry) waitSession(ctx context.Context, d time.Duration) bool {
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !r.hasSession() {
		select {
		case <-ctx.Done():
			return false
		case <-deadline.C:
			return false
		case <-tick.C:
		}
	}
	return true
}

// errNoSession is what a renewal returns while the client has no session.
func (r *ZKRegistry) errNoSession() error {
	return fmt.Errorf("%w: no session with %v (state %s)", ErrZKUnavailable, r.cfg.Servers, r.conn.State())
}

// ensurePath creates p and its parents as persistent nodes, ignoring those that exist.
func (r *ZKRegistry) ensurePath(ctx context.Context, p string) error {
	cur := ""
	for _, part := range strings.Split(strings.TrimPrefix(p, "/"), "/") {
		cur += "/" + part
		err := r.call(ctx, func() error {
			_, err := r.conn.Create(cur, nil, 0, zk.WorldACL(zk.PermAll))
			return err
		})
		if err != nil && !errors.Is(err, zk.ErrNodeExists) {
			return fmt.Errorf("create %s in ZooKeeper: %w", cur, err)
		}
	}
	return nil
}

// Acquire claims a worker ID. It waits up to min(SessionTimeout, 5 s) for a ZooKeeper
// session; without one it falls back to the cache file in Leaf's layout and refuses
// (ErrZKUnavailable) in recycle mode or without a cache record.
func (r *ZKRegistry) Acquire(ctx context.Context) (Lease, error) {
	if !r.waitSession(ctx, min(r.cfg.SessionTimeout, zkStartWait)) {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("wait for a ZooKeeper session: %w", err)
		}
		if r.cfg.Recycle {
			return nil, fmt.Errorf("%w: no session with %v within %s; in recycle mode a worker ID is only safe to use while ZooKeeper vouches for the lease, so this node cannot start from its cache file",
				ErrZKUnavailable, r.cfg.Servers, min(r.cfg.SessionTimeout, zkStartWait))
		}
		return r.fromCache()
	}
	if r.cfg.Recycle {
		return r.acquireLease(ctx)
	}
	return r.acquireForever(ctx)
}

// ---- Leaf's layout ----

// leafEndpoint is the JSON of a node under forever/, as Leaf writes it.
type leafEndpoint struct {
	IP        string `json:"ip"`
	Port      string `json:"port"`
	Timestamp int64  `json:"timestamp"`
}

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
	data, _ := json.Marshal(map[string]any{"advertise": r.cfg.Advertise, "pid": os.Getpid(), "started": time.Now().UnixMilli()})
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
		if n.seq > r.cfg.MaxWorkerID {
			// Nothing could use it; leaving it would only confuse operators.
			_ = r.call(context.WithoutCancel(ctx), func() error { return r.conn.Delete(created, -1) })
		}
	}
	if node.seq > r.cfg.MaxWorkerID {
		return nil, fmt.Errorf("%w: worker ID %d from %s/%s is above %d; the sequence counter of %s only grows (removing nodes does not lower it), so use --zk-recycle or a new --zk-name once no node of this one runs",
			ErrZKSequenceOutOfRange, node.seq, r.forever(), node.name, r.cfg.MaxWorkerID, r.forever())
	}
	for _, n := range nodes {
		if n.seq == node.seq && n.addr != node.addr {
			return nil, fmt.Errorf("%w: worker ID %d is claimed by both %s and %s under %s (was %s deleted and re-created?); refusing to share it",
				ErrNoWorkerID, node.seq, n.name, node.name, r.forever(), r.forever())
		}
	}
	l := &zkForeverLease{reg: r, id: node.seq, path: r.forever() + "/" + node.name}
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
	if e.WorkerID < 0 || e.WorkerID > r.cfg.MaxWorkerID {
		return nil, fmt.Errorf("%w: ZooKeeper unreachable and cache file %s holds worker ID %d, outside 0..%d",
			ErrZKUnavailable, r.cfg.Cache.Path, e.WorkerID, r.cfg.MaxWorkerID)
	}
	r.log.Warn("ZooKeeper unreachable: starting from the cache file; the clock guard checks its timestamp",
		"cache", r.cfg.Cache.Path, "worker_id", e.WorkerID, "recorded_time", fmtMs(e.Timestamp))
	return &zkForeverLease{reg: r, id: e.WorkerID, recorded: e.Timestamp, fromCache: true}, nil
}

// zkForeverLease is a worker ID in Leaf's layout, held for good.
type zkForeverLease struct {
	reg       *ZKRegistry
	id        int64
	recorded  int64
	fromCache bool // started from the cache file: path is found once ZooKeeper answers

	mu   sync.Mutex
	path string // this ip:port's node under forever/
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
		return fmt.Errorf("%w: %s is now held by another ZooKeeper session: another process runs as %s, worker ID %d",
			ErrLeaseLost, r.alivePath(), r.cfg.Advertise, l.id)
	}
	if err := r.ensurePath(ctx, path.Dir(r.alivePath())); err != nil {
		return err
	}
	err = r.call(ctx, func() error {
		_, err := r.conn.Create(r.alivePath(), nil, zk.FlagEphemeral, zk.WorldACL(zk.PermAll))
		return err
	})
	if errors.Is(err, zk.ErrNodeExists) {
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

// ---- recycle mode ----

// zkLeaseValue is the content of a lease node: who holds it.
type zkLeaseValue struct {
	Advertise string `json:"advertise"`
	Token     string `json:"token"`
}

// zkWorkerValue is the content of a workers node.
type zkWorkerValue struct {
	WorkerID  int64  `json:"worker_id"`
	Timestamp int64  `json:"timestamp"`
	Advertise string `json:"advertise"`
	Token     string `json:"token"`
}

// acquireLease takes the lowest free worker ID as an ephemeral node of this session.
func (r *ZKRegistry) acquireLease(ctx context.Context) (Lease, error) {
	granted := r.granted.Load()
	if granted == 0 {
		return nil, fmt.Errorf("recycle mode: the session timeout ZooKeeper granted is unknown (go-zk did not log it), so the lease time cannot be vouched for")
	}
	if g := time.Duration(granted) * time.Millisecond; g < r.cfg.TTL {
		return nil, fmt.Errorf("%w: recycle mode: ZooKeeper granted a session timeout of %s, shorter than the lease TTL %s asked for (the servers' maxSessionTimeout bounds it): lower --lease-ttl to at most %s or raise maxSessionTimeout",
			ErrInvalidConfig, g, r.cfg.TTL, g)
	}
	leases := path.Dir(r.leasePath(0))
	if err := r.ensurePath(ctx, leases); err != nil {
		return nil, err
	}
	if err := r.ensurePath(ctx, path.Dir(r.workerPath(0))); err != nil {
		return nil, err
	}
	taken := map[int64]bool{}
	var children []string
	err := r.call(ctx, func() (err error) {
		children, _, err = r.conn.Children(leases)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", leases, err)
	}
	for _, c := range children {
		if id, err := strconv.ParseInt(c, 10, 64); err == nil {
			taken[id] = true
		}
	}
	// Leaf-layout nodes of the same name hold theirs for good.
	nodes, err := r.listForever(ctx)
	if err != nil {
		return nil, err
	}
	for _, n := range nodes {
		taken[n.seq] = true
	}

	token := rand.Text() // tells this holding apart from every other, this node's earlier ones included
	val, _ := json.Marshal(zkLeaseValue{Advertise: r.cfg.Advertise, Token: token})
	for id := int64(0); id <= r.cfg.MaxWorkerID; id++ {
		if taken[id] {
			continue
		}
		p := r.leasePath(id)
		err := r.call(ctx, func() error {
			_, err := r.conn.Create(p, val, zk.FlagEphemeral, zk.WorldACL(zk.PermAll))
			return err
		})
		if errors.Is(err, zk.ErrNodeExists) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("lease worker ID %d at %s: %w", id, p, err)
		}
		l := &zkRecycleLease{reg: r, id: id, token: token, leaseVal: val}
		recorded, err := l.claimWorker(ctx)
		if err != nil {
			_ = r.call(context.WithoutCancel(ctx), func() error { return r.conn.Delete(p, -1) })
			return nil, err
		}
		l.recorded = recorded
		r.log.Info("leased worker ID (ZooKeeper recycle)", "worker_id", id, "path", p, "ttl", r.cfg.TTL,
			"recorded", recorded, "recorded_time", fmtMs(recorded))
		return l, nil
	}
	return nil, fmt.Errorf("%w: all %d worker IDs (0..%d) under %s are leased or held by Leaf-layout nodes",
		ErrNoWorkerID, r.cfg.MaxWorkerID+1, r.cfg.MaxWorkerID, leases)
}

// zkRecycleLease is one session's lease on one worker ID.
type zkRecycleLease struct {
	reg      *ZKRegistry
	id       int64
	token    string
	leaseVal []byte
	recorded int64

	mu       sync.Mutex
	released bool
}

var _ Lease = (*zkRecycleLease)(nil)

func (l *zkRecycleLease) WorkerID() int64    { return l.id }
func (l *zkRecycleLease) Recorded() int64    { return l.recorded }
func (l *zkRecycleLease) TTL() time.Duration { return l.reg.cfg.TTL }

// Renew checks that this session still holds the lease node (re-creating it after a
// session expiry when nobody claimed the ID since: the worker record still carries this
// holder's token), then raises the worker record to ts with a compare-and-set that
// fails with ErrLeaseLost when another holder's token is on it.
func (l *zkRecycleLease) Renew(ctx context.Context, ts int64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.released {
		return fmt.Errorf("renew worker ID %d: lease already released", l.id)
	}
	if !l.reg.hasSession() {
		return l.reg.errNoSession()
	}
	if err := l.checkLease(ctx); err != nil {
		return err
	}
	return l.recordWorker(ctx, ts)
}

// checkLease makes sure this session holds the lease node.
func (l *zkRecycleLease) checkLease(ctx context.Context) error {
	r := l.reg
	p := r.leasePath(l.id)
	var data []byte
	var st *zk.Stat
	err := r.call(ctx, func() (err error) {
		data, st, err = r.conn.Get(p)
		return err
	})
	switch {
	case err == nil:
		if st.EphemeralOwner == r.conn.SessionID() {
			return nil
		}
		var v zkLeaseValue
		_ = json.Unmarshal(data, &v)
		if v.Token == l.token {
			return fmt.Errorf("lease node %s is this holder's but belongs to another session", p)
		}
		return fmt.Errorf("%w: worker ID %d is now held by %s", ErrLeaseLost, l.id, v.Advertise)
	case errors.Is(err, zk.ErrNoNode):
	default:
		return fmt.Errorf("check lease %s: %w", p, err)
	}
	// The session expired and took the node along. Safe to take it back only if nobody
	// held the ID since: then the worker record still carries our token.
	prev, _, err := l.readWorker(ctx)
	if err != nil {
		return err
	}
	if prev.Token != l.token {
		return fmt.Errorf("%w: worker ID %d expired and was claimed by %s", ErrLeaseLost, l.id, prev.Advertise)
	}
	err = r.call(ctx, func() error {
		_, err := r.conn.Create(p, l.leaseVal, zk.FlagEphemeral, zk.WorldACL(zk.PermAll))
		return err
	})
	if errors.Is(err, zk.ErrNodeExists) {
		return fmt.Errorf("%w: worker ID %d expired and another node is taking it", ErrLeaseLost, l.id)
	}
	if err != nil {
		return fmt.Errorf("re-create expired lease %s: %w", p, err)
	}
	r.log.Warn("worker ID lease had expired with the session; re-created it (nobody held the ID in between)",
		"worker_id", l.id, "ttl", r.cfg.TTL)
	return nil
}

// Release records ts and deletes the lease node, so the ID is free at once.
func (l *zkRecycleLease) Release(ctx context.Context, ts int64) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.released {
		return nil
	}
	r := l.reg
	if err := l.recordWorker(ctx, ts); err != nil {
		return err
	}
	p := r.leasePath(l.id)
	err := r.call(ctx, func() error {
		_, st, err := r.conn.Get(p)
		if err != nil {
			return err
		}
		if st.EphemeralOwner != r.conn.SessionID() {
			return nil // someone else's now (or a lost session): not ours to delete
		}
		return r.conn.Delete(p, st.Version)
	})
	if err != nil && !errors.Is(err, zk.ErrNoNode) {
		return fmt.Errorf("release worker ID %d: %w", l.id, err)
	}
	l.released = true
	r.log.Info("released worker ID", "worker_id", l.id, "recorded", ts, "recorded_time", fmtMs(ts))
	return nil
}

// claimWorker puts this holder's token on the worker record, keeping its timestamp, and
// returns that timestamp: the highest any previous holder recorded.
func (l *zkRecycleLease) claimWorker(ctx context.Context) (int64, error) {
	for attempt := 0; attempt < casAttempts; attempt++ {
		prev, version, err := l.readWorker(ctx)
		if err != nil {
			return 0, err
		}
		ok, err := l.writeWorker(ctx, zkWorkerValue{WorkerID: l.id, Timestamp: prev.Timestamp, Advertise: l.reg.cfg.Advertise, Token: l.token}, version)
		if err != nil {
			return 0, err
		}
		if ok {
			return prev.Timestamp, nil
		}
	}
	return 0, fmt.Errorf("claim %s: it kept changing", l.reg.workerPath(l.id))
}

// recordWorker raises the worker record to ts; ErrLeaseLost when another holder's token
// is on it.
func (l *zkRecycleLease) recordWorker(ctx context.Context, ts int64) error {
	for attempt := 0; attempt < casAttempts; attempt++ {
		prev, version, err := l.readWorker(ctx)
		if err != nil {
			return err
		}
		if version >= 0 && prev.Token != l.token {
			return fmt.Errorf("%w: worker ID %d was claimed by %s (record %s)", ErrLeaseLost, l.id, prev.Advertise, fmtMs(prev.Timestamp))
		}
		if version >= 0 && prev.Timestamp >= ts {
			return nil
		}
		ok, err := l.writeWorker(ctx, zkWorkerValue{WorkerID: l.id, Timestamp: ts, Advertise: l.reg.cfg.Advertise, Token: l.token}, version)
		if err != nil {
			return err
		}
		if ok {
			return nil
		}
	}
	return fmt.Errorf("record %d in %s: it kept changing", ts, l.reg.workerPath(l.id))
}

// readWorker returns the worker record and its version; version -1 when there is none.
func (l *zkRecycleLease) readWorker(ctx context.Context) (zkWorkerValue, int32, error) {
	r := l.reg
	p := r.workerPath(l.id)
	var data []byte
	var st *zk.Stat
	err := r.call(ctx, func() (err error) {
		data, st, err = r.conn.Get(p)
		return err
	})
	if errors.Is(err, zk.ErrNoNode) {
		return zkWorkerValue{}, -1, nil
	}
	if err != nil {
		return zkWorkerValue{}, 0, fmt.Errorf("read %s: %w", p, err)
	}
	var v zkWorkerValue
	if err := json.Unmarshal(data, &v); err != nil {
		return zkWorkerValue{}, 0, fmt.Errorf("%s is not a worker record (%q): %w", p, data, err)
	}
	return v, st.Version, nil
}

// writeWorker writes v if the record is still at version (-1: absent); false when
// someone wrote in between.
func (l *zkRecycleLease) writeWorker(ctx context.Context, v zkWorkerValue, version int32) (bool, error) {
	r := l.reg
	p := r.workerPath(l.id)
	data, err := json.Marshal(v)
	if err != nil {
		return false, fmt.Errorf("encode worker record: %w", err)
	}
	err = r.call(ctx, func() error {
		if version < 0 {
			_, err := r.conn.Create(p, data, 0, zk.WorldACL(zk.PermAll))
			return err
		}
		_, err := r.conn.Set(p, data, version)
		return err
	})
	if errors.Is(err, zk.ErrNodeExists) || errors.Is(err, zk.ErrBadVersion) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("write %s: %w", p, err)
	}
	return true, nil
}
