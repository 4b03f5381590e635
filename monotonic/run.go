package monotonic

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/leafbus/leafbus/internal/backoff"
	"github.com/leafbus/leafbus/internal/kvbucket"
)

// watchPolicy is the back-off of a bucket watch that could not start or ended.
var watchPolicy = backoff.Policy{Min: 50 * time.Millisecond, Max: 2 * time.Second, Jitter: 0.5}

// Run watches the marks and the leases, runs one campaign per marked tag, and owns
// every goroutine of the Manager. It returns nil when ctx ends, after every lease it
// held was released (best effort: a lease it cannot release expires), and an error
// only when called twice.
func (m *Manager) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	m.mu.Lock()
	if m.runCtx != nil {
		m.mu.Unlock()
		cancel()
		return errors.New("monotonic: Manager.Run called twice")
	}
	m.runCtx = ctx
	m.mu.Unlock()
	defer m.stop(cancel)

	// Campaigns start once both watches delivered what the buckets hold, so that no
	// candidate acts on a view that misses a live lease.
	var synced sync.WaitGroup
	synced.Add(2)
	m.spawn(func(ctx context.Context) { m.watch(ctx, m.leaders, m.leadersCfg, m.applyLease, synced.Done) })
	m.spawn(func(ctx context.Context) { m.watch(ctx, m.opts, m.optsCfg, m.applyMark, synced.Done) })
	syncedCh := make(chan struct{})
	m.spawn(func(ctx context.Context) {
		synced.Wait() // both watches call Done once, or at their end
		close(syncedCh)
	})
	select {
	case <-syncedCh:
	case <-ctx.Done():
		return nil
	}
	m.mu.Lock()
	m.reconcile(false)
	m.mu.Unlock()
	m.isReady.Store(true)
	close(m.ready)
	m.log.Info("monotonic: marks and leases loaded", "monotonic_tags", len(m.marks.Load().exact), "lease_ttl", m.cfg.LeaseTTL)
	<-ctx.Done()
	return nil
}

// stop ends every campaign (each releases its lease) and waits for every goroutine.
func (m *Manager) stop(cancel context.CancelFunc) {
	m.isReady.Store(false)
	m.mu.Lock()
	m.stopping = true
	m.mu.Unlock()
	cancel()
	m.wg.Wait()
	empty := map[string]*tagState{}
	m.states.Store(&empty)
}

// watch follows every key of kv, calling apply for each entry and synced once, when the
// entries the bucket held at the start were delivered (or when the watch ends first). A
// watch that ends (its connection closed, a server gone) starts again.
func (m *Manager) watch(ctx context.Context, kv jetstream.KeyValue, cfg jetstream.KeyValueConfig, apply func(jetstream.KeyValueEntry), synced func()) {
	var once sync.Once
	defer once.Do(synced)
	bo := backoff.New(watchPolicy)
	for ctx.Err() == nil {
		// The keys the bucket holds, by the server's count: what the watch must have
		// delivered before it counts as synced (kvbucket's doc says why).
		want, err := kvbucket.Keys(ctx, m.cfg.JetStream, kv)
		var w jetstream.KeyWatcher
		if err == nil {
			w, err = kv.WatchAll(ctx)
		}
		if bucketGone(err) {
			// The bucket is gone (deleted, or a JetStream that lost its store): every
			// write and watch would fail until a restart. Create it again, empty; the
			// handles work again once it exists, and the leases are taken anew.
			lost := "the leases are taken anew"
			if cfg.Bucket == m.optsCfg.Bucket {
				lost = "the monotonic marks it held are lost for the next start: set them again (dispenser tag update --tag T --monotonic)"
			}
			m.log.Warn("monotonic: KV bucket gone; creating it again, empty: "+lost, "bucket", cfg.Bucket, "err", err)
			if _, err := kvbucket.Open(ctx, m.cfg.JetStream, cfg); err != nil {
				m.log.Warn("monotonic: KV bucket not created again, retrying", "bucket", cfg.Bucket, "err", err)
			}
			bo.Wait(ctx)
			continue
		}
		if err != nil {
			if bo.Failures() == 0 {
				m.log.Warn("monotonic: cannot watch a bucket, retrying", "bucket", kv.Bucket(), "err", err)
			}
			bo.Wait(ctx)
			continue
		}
		bo.Reset()
		// A watch does not end when its bucket is deleted: it just goes quiet. A check
		// beside it ends it then, and WatchAll above finds the bucket gone.
		wctx, endWatch := context.WithCancel(ctx)
		checked := make(chan struct{})
		go func() {
			defer close(checked)
			m.untilBucketGone(wctx, kv)
			endWatch()
		}()
		m.follow(wctx, kv, w, want, apply, func() { once.Do(synced) })
		endWatch()
		<-checked
		_ = w.Stop()
		if ctx.Err() == nil {
			m.log.Warn("monotonic: bucket watch ended, watching again", "bucket", kv.Bucket())
			bo.Wait(ctx)
		}
	}
}

// untilBucketGone returns once kv's bucket is gone (it reads the bucket's status every
// renew interval), or ctx ends.
func (m *Manager) untilBucketGone(ctx context.Context, kv jetstream.KeyValue) {
	tick := time.NewTicker(m.cfg.RenewInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		if _, err := kv.Status(ctx); bucketGone(err) {
			return
		}
	}
}

// bucketGone reports whether err says a KV bucket's stream does not exist. nats.go
// says so three ways: its jetstream sentinels, the API's "stream not found" as a status
// call returns it, and (from a watch, through its older API) nats.ErrStreamNotFound.
func bucketGone(err error) bool {
	var api *jetstream.APIError
	return errors.Is(err, jetstream.ErrStreamNotFound) || errors.Is(err, jetstream.ErrBucketNotFound) ||
		errors.Is(err, nats.ErrStreamNotFound) ||
		(errors.As(err, &api) && api.ErrorCode == jetstream.JSErrCodeStreamNotFound)
}

// follow applies w's entries until it ends or ctx does. At the watcher's marker, each
// key of want it has not delivered yet is read and applied before synced is called: a
// marker can come early (kvbucket), and campaigns must not start on a view that misses
// a live lease or a mark. An entry older than one already applied for its key (the
// watcher delivering late what a read found) is skipped.
func (m *Manager) follow(ctx context.Context, kv jetstream.KeyValue, w jetstream.KeyWatcher, want map[string]struct{}, apply func(jetstream.KeyValueEntry), synced func()) {
	applied := make(map[string]uint64, len(want))
	applyOnce := func(e jetstream.KeyValueEntry) {
		if e.Revision() < applied[e.Key()] {
			return
		}
		applied[e.Key()] = e.Revision()
		apply(e)
	}
	initial := true
	for {
		select {
		case e, ok := <-w.Updates():
			switch {
			case !ok:
				return
			case e == nil && initial:
				initial = false
				missing, err := kvbucket.FillIn(ctx, kv, want, func(key string) bool { _, ok := applied[key]; return ok })
				if err != nil {
					m.log.Warn("monotonic: cannot read the keys a bucket watch left out, watching again", "bucket", kv.Bucket(), "err", err)
					return
				}
				for _, e := range missing {
					applyOnce(e)
				}
				synced()
			case e != nil:
				applyOnce(e)
			}
		case <-ctx.Done():
			return
		}
	}
}

// applyLease records a lease key's new revision and tells the tag's campaign.
func (m *Manager) applyLease(e jetstream.KeyValueEntry) {
	m.mu.Lock()
	defer m.mu.Unlock()
	prev := m.holders[e.Key()]
	if prev != nil && e.Revision() < prev.rev {
		return // a watch that started again, behind what a read of the key found
	}
	h := holderOf(e, prev, m.now())
	m.holders[e.Key()] = h
	if ts := m.tags[e.Key()]; ts != nil {
		ts.holder.Store(h)
		poke(ts.poke)
	}
}

// applyMark records a tag's new mark and starts or stops its campaign.
func (m *Manager) applyMark(e jetstream.KeyValueEntry) {
	on := e.Operation() == jetstream.KeyValuePut && decodeOptions(m.log, e.Key(), e.Value()).Monotonic
	m.mu.Lock()
	defer m.mu.Unlock()
	marks := m.marks.Load()
	if marks.exact[e.Key()] == on {
		return
	}
	m.marks.Store(marks.with(e.Key(), on))
	m.log.Info("monotonic: tag mark changed", "tag", e.Key(), "monotonic", on)
	if m.isReady.Load() {
		m.reconcile(true)
	}
}

// reconcile starts a campaign for every marked tag without one and stops those of tags
// no longer marked. Called with mu held; a stopped campaign ends on its own goroutine.
// live says the marks changed while this dispenser watched, rather than being loaded at
// its start: a tag marked now may still be served as an ordinary tag by a dispenser
// whose watch lags, so its first leader here waits half a TTL before serving.
func (m *Manager) reconcile(live bool) {
	marks := m.marks.Load()
	changed := false
	for name, ts := range m.tags {
		if !marks.exact[name] {
			ts.cancel()
			delete(m.tags, name)
			changed = true
		}
	}
	for name := range marks.exact {
		if m.tags[name] == nil && m.startCampaign(name, live) {
			changed = true
		}
	}
	if changed {
		next := make(map[string]*tagState, len(m.tags))
		for name, ts := range m.tags {
			next[name] = ts
		}
		m.states.Store(&next)
	}
}

// startCampaign makes the state of a newly marked tag and starts its campaign, once
// the campaign of any earlier state of the tag returned (so that its term is over).
// Called with mu held.
func (m *Manager) startCampaign(name string, settle bool) bool {
	if m.runCtx == nil || m.stopping {
		return false
	}
	prev := m.ended[name]
	ctx, cancel := context.WithCancel(m.runCtx)
	ts := &tagState{name: name, poke: make(chan struct{}, 1), cancel: cancel, done: make(chan struct{})}
	if settle {
		ts.settleUntil = m.now() + m.cfg.LeaseTTL/2
	}
	ts.holder.Store(m.holders[name])
	m.tags[name] = ts
	m.ended[name] = ts.done
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		defer close(ts.done)
		if prev != nil {
			select {
			case <-prev:
			case <-ctx.Done():
				return
			}
		}
		m.campaign(ctx, ts)
	}()
	return true
}

func poke(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}
