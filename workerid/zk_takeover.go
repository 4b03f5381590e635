package workerid

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"time"

	"github.com/go-zookeeper/zk"

	"github.com/leafbus/leafbus/wire"
)

// Leaf's layout keeps one ephemeral alive node per ip:port (zk_leaf.go) so that two
// processes never run as one ip:port. Its data carries this node's owner token, a random
// value kept in the node's cache file (cacheEntry.Owner) from one run to the next. An
// alive node left by an earlier session (this process's own before its client was
// replaced, or the run before a crash or kill -9) that carries the token of this node's
// cache file is this node's: it is taken over at once instead of waited out for a session
// timeout. Another process registered under the same ip:port has its own cache file and
// so another token (or none), and is still refused. Only one process uses a data dir at a
// time (its lock), so the earlier session's process is gone, or is this one.

// aliveValue is the content of the alive node (wire.ZKAlive).
type aliveValue = wire.ZKAlive

// loadOwner returns the owner token of the cache file, or a new one when it has none.
func (r *ZKRegistry) loadOwner() string {
	if r.cfg.Cache != nil {
		if e, err := r.cfg.Cache.Load(); err == nil && e.Owner != "" {
			return e.Owner
		}
	}
	return rand.Text()
}

// aliveData is what this process writes into its alive node.
func (r *ZKRegistry) aliveData() []byte {
	b, _ := json.Marshal(aliveValue{Advertise: r.cfg.Advertise, PID: os.Getpid(), Started: time.Now().UnixMilli(), Owner: r.owner})
	return b
}

// adoptAlive takes the alive node over when it holds this node's owner token but belongs
// to another session. It reports whether this session holds the node afterwards; false
// with a nil error when it is another owner's (or missing).
func (r *ZKRegistry) adoptAlive(ctx context.Context) (bool, error) {
	p := r.alivePath()
	var data []byte
	var st *zk.Stat
	err := r.call(ctx, func() (err error) {
		data, st, err = r.conn.Get(p)
		return err
	})
	if errors.Is(err, zk.ErrNoNode) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("read %s: %w", p, err)
	}
	if st.EphemeralOwner == r.conn.SessionID() {
		return true, nil
	}
	var v aliveValue
	if json.Unmarshal(data, &v) != nil || r.owner == "" || v.Owner != r.owner {
		return false, nil
	}
	if err := r.takeOver(ctx, p, st.Version, r.aliveData()); err != nil {
		if errors.Is(err, zk.ErrNoNode) || errors.Is(err, zk.ErrBadVersion) || errors.Is(err, zk.ErrNodeExists) {
			return false, nil // changed meanwhile: the caller looks again
		}
		return false, fmt.Errorf("take over %s: %w", p, err)
	}
	r.log.Info("took over this node's alive node from an earlier session of its own (the owner token of its cache file)",
		"path", p, "earlier_session", fmt.Sprintf("0x%x", st.EphemeralOwner), "earlier_pid", v.PID)
	return true, nil
}

// cacheOwner is the token the heartbeat keeps in the cache file.
func (l *zkForeverLease) cacheOwner() string { return l.reg.owner }
