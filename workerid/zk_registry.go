package workerid

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
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
// sequence number (its worker ID) is outside MinWorkerID..MaxWorkerID: above it (the
// range is used up: the error also wraps ErrNoWorkerID) or below it (it also wraps
// ErrWorkerIDOutOfRange).
var ErrZKSequenceOutOfRange = errors.New("ZooKeeper sequence number outside the worker ID range")

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

// ZKRegistryConfig configures a ZKRegistry. Start from DefaultZKRegistryConfig.
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
	// TTL is the lease time with Recycle: the session timeout asked of ZooKeeper (30 s).
	// The heartbeat suspends the generator at TTL/2 without a renewal.
	TTL time.Duration
	// MinWorkerID and MaxWorkerID bound the worker IDs this registry uses
	// (--worker-id-min, --worker-id-max): 0 and the snowflake layout's highest (1023) by
	// default. In Leaf's layout ZooKeeper's sequence counter picks the ID, and one outside
	// the range is refused (zk_range.go says how to set up a datacenter's path).
	MinWorkerID int64
	MaxWorkerID int64
	// Cache is the node's cache file: the fallback when ZooKeeper is unreachable at start
	// in Leaf's layout (never with Recycle). Nil means no fallback.
	Cache *CacheFile
	// SessionTimeout of the ZooKeeper session in Leaf's layout (10 s); with Recycle the
	// session timeout is TTL and this is not used. It also bounds the wait for a first
	// session (at most 5 s) before falling back to the cache file.
	SessionTimeout time.Duration
	// ReplaceAfter is how long the client may go without a session before it is
	// replaced by a new one (2 s; zk_session.go says why go-zk needs it).
	ReplaceAfter time.Duration
	// Logger; nil discards. go-zk's own chatter goes to it at debug level.
	Logger *slog.Logger
}

// DefaultZKRegistryConfig returns the defaults: Leaf's layout, worker IDs 0..1023,
// sessions of 10 s, leases of 30 s in recycle mode. Servers, Name and Advertise are left
// for the caller.
func DefaultZKRegistryConfig() ZKRegistryConfig {
	return ZKRegistryConfig{
		TTL:            DefaultLeaseTTL,
		MaxWorkerID:    DefaultMaxWorkerID,
		SessionTimeout: DefaultZKSessionTimeout,
		ReplaceAfter:   defaultZKReplaceAfter,
	}
}

// Validate reports the first setting that is missing or out of range, naming the field,
// its value and the bound; errors wrap ErrInvalidConfig.
func (c ZKRegistryConfig) Validate() error {
	const component = "ZooKeeper registry"
	if len(c.Servers) == 0 {
		return invalid(component, "Servers is empty, want at least one host:port")
	}
	if c.Name == "" || strings.HasPrefix(c.Name, "/") || strings.HasSuffix(c.Name, "/") || strings.Contains(c.Name, "//") {
		return invalid(component, "Name %q must be a non-empty relative path (Leaf's leaf.name)", c.Name)
	}
	host, port, err := net.SplitHostPort(c.Advertise)
	if err != nil || host == "" || port == "" || strings.ContainsAny(c.Advertise, "/-") {
		return invalid(component, "Advertise %q must be ip:port (without '/' or '-', which Leaf's node names cannot hold)", c.Advertise)
	}
	if err := c.workerRange().check(component); err != nil {
		return err
	}
	return checkPositive(component, duration{"TTL", c.TTL}, duration{"SessionTimeout", c.SessionTimeout}, duration{"ReplaceAfter", c.ReplaceAfter})
}

// workerRange is MinWorkerID..MaxWorkerID.
func (c ZKRegistryConfig) workerRange() Range { return Range{Min: c.MinWorkerID, Max: c.MaxWorkerID} }

// ZKRegistry hands out worker IDs from ZooKeeper, in one of two modes.
//
// Leaf's layout (Recycle false, zk_leaf.go): each ip:port keeps its sequential node under
// /snowflake/<name>/forever/ for good, and the node's sequence is its worker ID. Recycle
// mode (zk_recycle.go): worker IDs are ephemeral lease nodes of this node's session
// under /snowflake/<name>/leafbus/leases/, free again once the session expired. Both
// share one ZooKeeper client and the plumbing in this file. Run, beside the heartbeat,
// replaces that client when it stays without a session (zk_session.go); a node's own
// earlier session is taken over by token (zk_takeover.go), never waited out.
type ZKRegistry struct {
	cfg      ZKRegistryConfig
	log      *slog.Logger
	conn     *zkSession    // the client of the moment: Run replaces one stuck without a session
	owner    string        // this node's token in its alive node and cache file (Leaf's layout)
	granted  *atomic.Int64 // session timeout the server granted, ms; 0 until known
	ip, port string

	mu     sync.Mutex
	closed bool
	calls  sync.WaitGroup // ZooKeeper calls running for a context that may end first

	stateMu sync.Mutex
	stateCh chan struct{} // closed and replaced whenever the session state changes
}

var (
	_ Registry   = (*ZKRegistry)(nil)
	_ Identifier = (*ZKRegistry)(nil)
)

// Identity is "zk /snowflake/<name>" in Leaf's layout, and "zk /snowflake/<name>
// (recycle)" in recycle mode, whose worker IDs are other nodes under the same path.
func (r *ZKRegistry) Identity() string {
	if r.cfg.Recycle {
		return "zk " + r.base() + " (recycle)"
	}
	return "zk " + r.base()
}

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
	if cfg.Recycle {
		cfg.SessionTimeout = cfg.TTL // the lease time is the session timeout
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	ip, port, _ := net.SplitHostPort(cfg.Advertise)
	r := &ZKRegistry{
		cfg:     cfg,
		log:     cfg.Logger.With("zk_name", cfg.Name, "advertise", cfg.Advertise),
		granted: new(atomic.Int64),
		ip:      ip,
		port:    port,
		stateCh: make(chan struct{}),
	}
	r.owner = r.loadOwner()
	conn, err := newZKSession(func(dialer zk.Dialer, observe func(zk.Event)) (*zk.Conn, error) {
		conn, _, err := zk.Connect(cfg.Servers, cfg.SessionTimeout,
			zk.WithLogger(zkLogger{log: cfg.Logger.With("component", "go-zk"), granted: r.granted}),
			zk.WithDialer(dialer),
			zk.WithEventCallback(func(ev zk.Event) { observe(ev); r.onEvent(ev) }))
		if err != nil {
			return nil, fmt.Errorf("connect to ZooKeeper %v: %w", cfg.Servers, err)
		}
		return conn, nil
	})
	if err != nil {
		return nil, err
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

// base is the root of everything this registry keeps: Leaf's leaf.name.
func (r *ZKRegistry) base() string { return "/snowflake/" + r.cfg.Name }

// call runs fn once the client has a session, returning early with ctx's error when ctx
// ends first (go-zk's calls take no context; Close fails them, and waits for them).
//
// Waiting for the session here rather than in go-zk keeps calls out of go-zk's send
// queue while it is disconnected: go-zk sends what queued up the moment it reconnects,
// and reads the answers while it is still setting the session's watches again, reading
// and writing its last-seen zxid unsynchronized (go-zookeeper/zk v1.0.4 conn.go,
// sendSetWatches against recvLoop; harmless in itself, but a data race the race
// detector reports). A call made just as a session comes back waits for go-zk to queue
// its request that sets the watches again (zkResync).
func (r *ZKRegistry) call(ctx context.Context, fn func() error) error {
	if err := r.awaitSession(ctx); err != nil {
		return err
	}
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

// awaitSession returns once the client has a session, or with ctx's error, or an error
// wrapping zk.ErrClosing once the registry is closed. A change of the session state
// wakes it; it also looks every zkSuperviseTick, for a client replaced meanwhile.
func (r *ZKRegistry) awaitSession(ctx context.Context) error {
	var tick *time.Ticker
	for {
		changed := r.stateChanged()
		r.mu.Lock()
		closed := r.closed
		r.mu.Unlock()
		switch {
		case closed:
			return fmt.Errorf("ZooKeeper registry closed: %w", zk.ErrClosing)
		case r.hasSession():
			if r.resynced(ctx, changed) {
				return nil
			}
			if err := ctx.Err(); err != nil {
				return err
			}
			continue // the state changed meanwhile
		case tick == nil:
			tick = time.NewTicker(zkSuperviseTick)
			defer tick.Stop()
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-changed:
		case <-tick.C:
		}
	}
}

// resynced waits until calls may use the session's connection (zkResync), at most
// zkResyncMax; false when the session state changed meanwhile or ctx ended (awaitSession
// looks again).
func (r *ZKRegistry) resynced(ctx context.Context, changed <-chan struct{}) bool {
	settled := r.conn.settled()
	select {
	case <-settled:
		return true
	default:
	}
	bound := time.NewTimer(zkResyncMax)
	defer bound.Stop()
	select {
	case <-settled:
		return true
	case <-bound.C:
		return true
	case <-changed:
		return false
	case <-ctx.Done():
		return false
	}
}

// onEvent is go-zk's event callback: it runs on go-zk's receive loop, so it only wakes
// the lease watches up when the session state changed.
func (r *ZKRegistry) onEvent(ev zk.Event) {
	if ev.Type != zk.EventSession {
		return
	}
	r.stateMu.Lock()
	defer r.stateMu.Unlock()
	close(r.stateCh)
	r.stateCh = make(chan struct{})
}

// stateChanged returns a channel closed at the next change of the session state. Take
// it before looking at the state, so that no change goes unnoticed.
func (r *ZKRegistry) stateChanged() <-chan struct{} {
	r.stateMu.Lock()
	defer r.stateMu.Unlock()
	return r.stateCh
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
		// The next Acquire (a start-up retry) begins with a client that is not stuck.
		r.replaceClient(min(r.cfg.SessionTimeout, zkStartWait), "no session at start")
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
