package workerid

import (
	"context"
	"errors"
	"net"
	"sync"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/leafbus/leafbus/internal/backoff"
)

// A go-zk client can stay without a session long after ZooKeeper is back
// (TESTENV-NOTES.md): a server that restarted with a lower zxid than the client saw
// refuses it until its own zxid catches up, and a client that connected while the
// server was still starting waits ten receive timeouts (a minute with a 10 s session)
// for an answer to its handshake. Neither ends by itself in good time, so the registry
// replaces such a client with a new one (a new session) instead of waiting: ZKRegistry.Run.
// What the old session held is taken over by token: the alive node in Leaf's layout
// (zk_leaf.go, owner token) and the lease node in recycle mode (zk_recycle.go, lease
// token), both with one atomic multi-op (delete the old session's node at its version,
// create this session's), so nobody else can slip in between.

// ZooKeeper client supervision defaults.
const (
	// defaultZKReplaceAfter is how long the client may go without a session before it is
	// replaced (ZKRegistryConfig.ReplaceAfter). go-zk itself retries the servers every
	// second, so a client that is fine reconnects well within it once ZooKeeper is back.
	defaultZKReplaceAfter = 2 * time.Second
	// zkHandshakeMax is how long a client may sit connected without a session (its
	// handshake unanswered, as by a server that accepts connections before it serves)
	// before it is replaced: a handshake takes milliseconds.
	zkHandshakeMax = 500 * time.Millisecond
	// zkSuperviseTick is how often Run looks at the client.
	zkSuperviseTick = 100 * time.Millisecond
	// Without a session for zkProbeAfter, Run tries every zkProbeEvery whether a server
	// accepts a connection (within zkProbeTimeout).
	zkProbeAfter   = 500 * time.Millisecond
	zkProbeEvery   = 200 * time.Millisecond
	zkProbeTimeout = 200 * time.Millisecond
)

// zkReplaceRetry spaces the replacements of a client that stays without a session (while
// ZooKeeper is down, every new client fails too); the floor is ReplaceAfter.
var zkReplaceRetry = backoff.Policy{Min: defaultZKReplaceAfter, Max: 4 * time.Second, Jitter: 0.25}

// errSessionClosed is what replace returns once the registry is closed.
var errSessionClosed = errors.New("ZooKeeper registry closed")

// zkSession is the registry's ZooKeeper client, replaceable while in use: its methods
// are go-zk's, called on the client of the moment. A call that was running on a client
// when it was replaced fails (zk.ErrClosing) and is retried by its caller like any
// other failed call; a watch set on it ends with an EventNotWatching and is set again.
type zkSession struct {
	// dial makes a client that connects with dialer and tells observe its events
	// (before anything else hears of them): zkResync's.
	dial zkDial

	mu       sync.RWMutex
	conn     *zk.Conn
	resync   *zkResync // conn's
	closed   bool
	replaced int
	closing  sync.WaitGroup // replaced clients being closed (Close takes up to 1 s)
}

type zkDial func(dialer zk.Dialer, observe func(zk.Event)) (*zk.Conn, error)

// dialResynced makes a client with its zkResync.
func dialResynced(dial zkDial) (*zk.Conn, *zkResync, error) {
	z := newZKResync()
	conn, err := dial(z.dial, z.event)
	return conn, z, err
}

func newZKSession(dial zkDial) (*zkSession, error) {
	conn, z, err := dialResynced(dial)
	if err != nil {
		return nil, err
	}
	return &zkSession{dial: dial, conn: conn, resync: z}, nil
}

// settled is closed once calls may use the client's current connection (zkResync).
func (s *zkSession) settled() <-chan struct{} {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.resync.current()
}

func (s *zkSession) cur() *zk.Conn {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.conn
}

func (s *zkSession) State() zk.State                               { return s.cur().State() }
func (s *zkSession) SessionID() int64                              { return s.cur().SessionID() }
func (s *zkSession) Delete(p string, version int32) error          { return s.cur().Delete(p, version) }
func (s *zkSession) Children(p string) ([]string, *zk.Stat, error) { return s.cur().Children(p) }
func (s *zkSession) Get(p string) ([]byte, *zk.Stat, error)        { return s.cur().Get(p) }
func (s *zkSession) Exists(p string) (bool, *zk.Stat, error)       { return s.cur().Exists(p) }

func (s *zkSession) GetW(p string) ([]byte, *zk.Stat, <-chan zk.Event, error) {
	return s.cur().GetW(p)
}

func (s *zkSession) ExistsW(p string) (bool, *zk.Stat, <-chan zk.Event, error) {
	return s.cur().ExistsW(p)
}

func (s *zkSession) Set(p string, data []byte, version int32) (*zk.Stat, error) {
	return s.cur().Set(p, data, version)
}

func (s *zkSession) Create(p string, data []byte, flags int32, acl []zk.ACL) (string, error) {
	return s.cur().Create(p, data, flags, acl)
}

func (s *zkSession) Multi(ops ...any) ([]zk.MultiResponse, error) { return s.cur().Multi(ops...) }

// Replaced is how many times the client was replaced.
func (s *zkSession) Replaced() int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.replaced
}

// replace dials a new client and closes the old one in the background.
func (s *zkSession) replace() error {
	conn, z, err := dialResynced(s.dial)
	if err != nil {
		return err
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		conn.Close()
		return errSessionClosed
	}
	old := s.conn
	s.conn, s.resync = conn, z
	s.replaced++
	s.closing.Add(1)
	s.mu.Unlock()
	go func() {
		defer s.closing.Done()
		old.Close()
	}()
	return nil
}

// Close closes the client of the moment and waits for the replaced ones to close.
func (s *zkSession) Close() {
	s.mu.Lock()
	s.closed = true
	conn := s.conn
	s.mu.Unlock()
	conn.Close()
	s.closing.Wait()
}

// takeOver makes this session the owner of the ephemeral node p, which an earlier
// session of this holder left (the caller checked the token in its data): in one
// multi-op, delete it at version and create it again with data. It fails with
// zk.ErrBadVersion or zk.ErrNoNode when the node changed meanwhile, and zk.ErrNodeExists
// when someone created it between a deletion and this call.
func (r *ZKRegistry) takeOver(ctx context.Context, p string, version int32, data []byte) error {
	return r.call(ctx, func() error {
		// A failed multi-op reports the first operation that failed (go-zk).
		_, err := r.conn.Multi(
			&zk.DeleteRequest{Path: p, Version: version},
			&zk.CreateRequest{Path: p, Data: data, Flags: zk.FlagEphemeral, Acl: zk.WorldACL(zk.PermAll)},
		)
		return err
	})
}

// Run keeps the ZooKeeper client usable until ctx ends: a client that has had no session
// for ReplaceAfter, or has sat connected for half a second without its handshake answered, is
// replaced by a new one (a new session), and again, backing off, while ZooKeeper stays
// unreachable. Once a server accepts connections again while the client still has none,
// the client is replaced at once (once per outage) rather than left to its own retry,
// which sleeps a second between rounds. It always returns nil.
func (r *ZKRegistry) Run(ctx context.Context) error {
	tick := time.NewTicker(zkSuperviseTick)
	defer tick.Stop()
	policy := zkReplaceRetry
	policy.Min = r.cfg.ReplaceAfter
	d := zkWatchdog{retry: backoff.New(policy), lastOK: time.Now(), replaceAfter: r.cfg.ReplaceAfter, wait: r.cfg.ReplaceAfter}
	for {
		select {
		case <-ctx.Done():
			return nil
		case now := <-tick.C:
			if why := d.check(r.conn.State(), r.reachable, now); why != "" {
				r.replaceClient(now.Sub(d.lastOK), why)
				d.replaced(now)
			}
		}
	}
}

// zkWatchdog is Run's view of the client: since when it has no session, whether its
// handshake hangs, whether the servers accept connections meanwhile.
type zkWatchdog struct {
	retry          *backoff.Backoff
	replaceAfter   time.Duration // ZKRegistryConfig.ReplaceAfter
	lastOK         time.Time     // last seen with a session, or last replaced
	wait           time.Duration
	connectedSince time.Time // connected without a session since; zero when not
	reachable      bool      // a server accepted a connection while there was no session
	lastProbe      time.Time
	probed         bool // the outage's one replacement on reachability is spent
}

// check returns why a client in state must be replaced now, "" when it need not;
// reachable says whether a server accepts connections (asked only while it may matter).
func (d *zkWatchdog) check(state zk.State, reachable func() bool, now time.Time) string {
	switch state {
	case zk.StateHasSession:
		*d = zkWatchdog{retry: d.retry, replaceAfter: d.replaceAfter, lastOK: now, wait: d.replaceAfter}
		d.retry.Reset()
		return ""
	case zk.StateConnected:
		if d.connectedSince.IsZero() {
			d.connectedSince = now
		}
	default:
		d.connectedSince = time.Time{}
	}
	without := now.Sub(d.lastOK)
	if !d.probed && without > zkProbeAfter && now.Sub(d.lastProbe) >= zkProbeEvery {
		d.lastProbe = now
		d.reachable = reachable()
	}
	switch {
	case !d.connectedSince.IsZero() && now.Sub(d.connectedSince) > zkHandshakeMax:
		return "its handshake is not answered"
	case d.reachable && !d.probed:
		d.probed = true
		return "ZooKeeper accepts connections again"
	case without >= d.wait:
		return "no session for " + without.Round(time.Millisecond).String()
	}
	return ""
}

// replaced notes a replacement at now.
func (d *zkWatchdog) replaced(now time.Time) {
	d.lastOK, d.connectedSince, d.reachable, d.wait = now, time.Time{}, false, d.retry.Next()
}

// reachable reports whether a ZooKeeper server accepts a TCP connection now.
func (r *ZKRegistry) reachable() bool {
	for _, s := range r.cfg.Servers {
		c, err := net.DialTimeout("tcp", s, zkProbeTimeout)
		if err == nil {
			c.Close()
			return true
		}
	}
	return false
}

// replaceClient replaces the client and wakes the lease watches up.
func (r *ZKRegistry) replaceClient(without time.Duration, why string) {
	state := r.conn.State()
	if err := r.conn.replace(); err != nil {
		if !errors.Is(err, errSessionClosed) {
			r.log.Warn("ZooKeeper client has no session; a new one could not be made", "err", err)
		}
		return
	}
	r.log.Warn("ZooKeeper client replaced: it had no session", "without_session", without.Round(time.Millisecond),
		"state", state, "why", why, "replacements", r.conn.Replaced())
	r.onEvent(zk.Event{Type: zk.EventSession})
}

// Connected reports whether the registry has a ZooKeeper session now.
func (r *ZKRegistry) Connected() bool { return r.hasSession() }

// ZKDenied reports whether err is ZooKeeper refusing this client its path: no
// authentication, failed authentication or an ACL that does not let it in. No wait
// mends that, so a start ends at once (the dispenser's classify asks this, so that only
// this package knows the ZooKeeper driver).
func ZKDenied(err error) bool {
	return errors.Is(err, zk.ErrNoAuth) || errors.Is(err, zk.ErrAuthFailed) || errors.Is(err, zk.ErrInvalidACL)
}
