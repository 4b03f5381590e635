package monotonic

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/leafbus/leafbus/internal/backoff"
	"github.com/leafbus/leafbus/internal/kvbucket"
	"github.com/leafbus/leafbus/wire"
)

// watchPolicy is the back-off of a bucket watch that could not start or ended.
var watchPolicy = backoff.Policy{Min: 50 * time.Millisecond, Max: 2 * time.Second, Jitter: 0.5}

// Run watches the marks and the leases, runs one campaign per monotonic tag, keeps
// this dispenser's presence record, and owns every goroutine of the Manager. It returns
// nil when ctx ends, after every lease it held was released (best effort: a lease it
// cannot release expires), and an error when called twice or when Config.ServiceID
// gives no instance ID.
func (m *Manager) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	m.mu.Lock()
	if m.runCtx != nil {
		m.mu.Unlock()
		cancel()
		return errors.New("monotonic: Manager.Run called twice")
	}
	m.instance = m.cfg.ServiceID()
	if !validInstance(m.instance) {
		m.mu.Unlock()
		cancel()
		return fmt.Errorf("monotonic: ServiceID gave %s, not a $SRV instance ID", wire.Quote(m.instance))
	}
	m.runCtx = ctx
	m.mu.Unlock()
	defer m.stop(cancel)

	// The presence record comes before the marks are listed (presence.go says why).
	if !m.firstPresence(ctx) {
		return nil
	}
	m.spawn(m.presence)
	// Campaigns start once both watches delivered what the buckets hold, so that no
	// candidate acts on a view that misses a live lease or a mark.
	var synced sync.WaitGroup
	synced.Add(2)
	m.spawn(func(ctx context.Context) {
		m.watch(ctx, bucketWatch{kv: m.leaders, cfg: m.leadersCfg, apply: m.applyLease, resynced: m.leasesResynced}, synced.Done)
	})
	m.spawn(func(ctx context.Context) {
		m.watch(ctx, bucketWatch{kv: m.opts, cfg: m.optsCfg, apply: m.applyMark, resynced: m.marksResynced, delivered: m.noteApplied}, synced.Done)
	})
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
	m.reconcile()
	m.recomputeRanges()
	m.mu.Unlock()
	m.isReady.Store(true)
	close(m.ready)
	m.log.Info("monotonic: marks and leases loaded", "monotonic_tags", len(m.marks.Load().exact), "remembered", len(m.memory.all()), "lease_ttl", m.cfg.LeaseTTL)
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

// bucketWatch is what watch follows: a bucket, how to create it again, and what to do
// with what it delivers.
type bucketWatch struct {
	kv    jetstream.KeyValue
	cfg   jetstream.KeyValueConfig
	apply func(jetstream.KeyValueEntry)
	// resynced is called after each initial listing (at the start, and after a watch
	// that started again, on a bucket maybe created anew) with the keys it applied; the
	// view's keys not among them are gone from the bucket.
	resynced func(applied map[string]uint64)
	// delivered, when set, is told floor after each initial listing (the bucket's
	// last revision before the listing began: the view now holds every write up to it)
	// and then the revision of each entry the watch delivers: the watch delivers in
	// the stream's order, so the view holds every write up to that one too.
	delivered func(rev uint64)
}

// watch follows every key of b.kv, calling b.apply for each entry and synced once, when
// the entries the bucket held at the start were delivered (or when the watch ends
// first). A watch that ends (its connection closed, a server gone) starts again.
func (m *Manager) watch(ctx context.Context, b bucketWatch, synced func()) {
	var once sync.Once
	defer once.Do(synced)
	bo := backoff.New(watchPolicy)
	for ctx.Err() == nil {
		// The bucket's last revision, then the keys it holds by the server's count: what
		// the watch must have delivered before it counts as synced (kvbucket's doc says
		// why).
		floor, created, err := m.streamState(ctx, b.kv)
		var want map[string]struct{}
		if err == nil {
			want, err = kvbucket.Keys(ctx, m.cfg.JetStream, b.kv)
		}
		var w jetstream.KeyWatcher
		if err == nil {
			w, err = b.kv.WatchAll(ctx)
		}
		if bucketGone(err) {
			// The bucket is gone (deleted, or a JetStream that lost its store): every
			// write and watch would fail until a restart. Create it again, empty; the
			// handles work again once it exists, and the leases are taken anew.
			lost := "the leases are taken anew"
			if b.cfg.Bucket == m.optsCfg.Bucket {
				lost = "the monotonic marks every dispenser remembers are written back"
			}
			m.log.Warn("monotonic: KV bucket gone; creating it again: "+lost, "bucket", b.cfg.Bucket, "err", err)
			if _, err := kvbucket.Open(ctx, m.cfg.JetStream, b.cfg); err != nil {
				m.log.Warn("monotonic: KV bucket not created again, retrying", "bucket", b.cfg.Bucket, "err", err)
			}
			bo.Wait(ctx)
			continue
		}
		if err != nil {
			if bo.Failures() == 0 {
				m.log.Warn("monotonic: cannot watch a bucket, retrying", "bucket", b.kv.Bucket(), "err", err)
			}
			bo.Wait(ctx)
			continue
		}
		bo.Reset()
		// A watch does not end when its bucket is deleted: it just goes quiet. A check
		// beside it ends it then (or when another dispenser created the bucket again
		// meanwhile), and WatchAll above finds the bucket gone, or watches the new one.
		wctx, endWatch := context.WithCancel(ctx)
		checked := make(chan struct{})
		go func() {
			defer close(checked)
			m.untilBucketGone(wctx, b.kv, created)
			endWatch()
		}()
		m.follow(wctx, b, w, want, floor, func() { once.Do(synced) })
		endWatch()
		<-checked
		kvbucket.StopWatcher(w)
		if ctx.Err() == nil {
			m.log.Warn("monotonic: bucket watch ended, watching again", "bucket", b.kv.Bucket())
			bo.Wait(ctx)
		}
	}
}

// streamState is the last revision (stream sequence) written to kv's bucket, and when
// its stream was created.
func (m *Manager) streamState(ctx context.Context, kv jetstream.KeyValue) (uint64, time.Time, error) {
	stream, err := m.cfg.JetStream.Stream(ctx, wire.KVStream(kv.Bucket()))
	if err != nil {
		return 0, time.Time{}, err
	}
	info, err := stream.Info(ctx)
	if err != nil {
		return 0, time.Time{}, err
	}
	return info.State.LastSeq, info.Created, nil
}

// untilBucketGone returns once kv's bucket is gone, or is another one than the bucket
// created at created (deleted and created again), or ctx ends. It reads the bucket's
// status every renew interval.
func (m *Manager) untilBucketGone(ctx context.Context, kv jetstream.KeyValue, created time.Time) {
	tick := time.NewTicker(m.cfg.RenewInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
		st, err := kv.Status(ctx)
		if bucketGone(err) {
			return
		}
		if bs, ok := st.(*jetstream.KeyValueBucketStatus); ok && err == nil && !bs.StreamInfo().Created.Equal(created) {
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
func (m *Manager) follow(ctx context.Context, b bucketWatch, w jetstream.KeyWatcher, want map[string]struct{}, floor uint64, synced func()) {
	applied := make(map[string]uint64, len(want))
	applyOnce := func(e jetstream.KeyValueEntry) {
		if e.Revision() < applied[e.Key()] {
			return
		}
		applied[e.Key()] = e.Revision()
		b.apply(e)
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
				missing, err := kvbucket.FillIn(ctx, b.kv, want, func(key string) bool { _, ok := applied[key]; return ok })
				if err != nil {
					m.log.Warn("monotonic: cannot read the keys a bucket watch left out, watching again", "bucket", b.kv.Bucket(), "err", err)
					return
				}
				for _, e := range missing {
					applyOnce(e)
				}
				if b.resynced != nil {
					b.resynced(tagKeys(applied))
				}
				if b.delivered != nil {
					b.delivered(floor)
				}
				synced()
			case e != nil:
				applyOnce(e)
				if !initial && b.delivered != nil {
					b.delivered(e.Revision())
				}
			}
		case <-ctx.Done():
			return
		}
	}
}

// applyLease records a lease key's new revision and tells the tag's campaign and its
// waiting requests. A record that starts or stops saying someone leads changes which
// tags are monotonic (a live record makes its tag monotonic, mark or not).
func (m *Manager) applyLease(e jetstream.KeyValueEntry) {
	tag, ok := tagOfKey(e.Key())
	if !ok {
		return // a presence record
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	prev := m.holders[tag]
	if prev != nil && e.Revision() < prev.rev {
		return // a watch that started again, behind what a read of the key found
	}
	m.setHolder(tag, prev, holderOf(e, prev, m.now()))
}

// setHolder makes h the view of key's lease. Called with mu held.
func (m *Manager) setHolder(key string, prev, h *holder) {
	m.holders[key] = h
	if ts := m.tags[key]; ts != nil {
		ts.holder.Store(h)
		ts.changed.fire()
		poke(ts.poke)
	}
	if (prev != nil && prev.live()) != h.live() && m.isReady.Load() {
		m.reconcile()
	}
}

// leasesResynced marks gone every lease of the view that a new listing of
// <prefix>_leaders did not find (a bucket created again).
func (m *Manager) leasesResynced(applied map[string]uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for key, prev := range m.holders {
		if _, ok := applied[key]; !ok && !prev.gone {
			m.setHolder(key, prev, &holder{rev: prev.rev, gone: true, seen: m.now()})
		}
	}
}

// applyMark records a tag's new mark. A value {"monotonic":false} is an operator's
// word that the tag is ordinary: this dispenser forgets it. A delete or a purge is not:
// it is a loss, and a remembered tag's mark is written back.
func (m *Manager) applyMark(e jetstream.KeyValueEntry) {
	key, ok := tagOfKey(e.Key())
	if !ok {
		return // no dispenser writes such a key: no tag is named by it
	}
	if e.Operation() == jetstream.KeyValuePut {
		m.rememberValueRange(key, e.Value())
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if e.Operation() != jetstream.KeyValuePut {
		delete(m.optState, key)
		delete(m.markRev, key)
		delete(m.optRange, key)
		if m.memory.has(key) && m.isReady.Load() {
			m.spawnLocked(func(ctx context.Context) { m.writeBack(ctx, []string{key}) })
		}
	} else {
		o, readable := decodeOptions(m.log, key, e.Value())
		on := o.Monotonic
		m.optRange[key] = optValue{r: o.TagRange, readable: readable}
		old, had := m.optState[key]
		if !had || old != on {
			m.log.Info("monotonic: tag mark", "tag", key, "monotonic", on)
		}
		if on && !(had && old) && m.isReady.Load() && m.served(key) {
			m.busy[key] = m.now() // listed in the presence record (presence.go)
		}
		m.optState[key] = on
		m.markRev[key] = e.Revision()
		if ts := m.tags[key]; ts != nil {
			poke(ts.poke) // a leader of a tag marked ordinary gives its lease back
		}
		if !on && m.memory.has(key) {
			m.spawnLocked(func(context.Context) {
				if err := m.syncMemory(key); err != nil {
					m.log.Warn("monotonic: cannot forget a tag marked ordinary; it stays monotonic here after a restart until the mark is read again", "tag", key, "err", err)
				}
			})
		}
	}
	if m.isReady.Load() {
		m.reconcile()
		m.recomputeRanges()
	}
}

// marksResynced drops from the view the marks a new listing of <prefix>_tagopts did not
// find (a bucket created again, empty), and writes back the mark of every remembered
// tag that has no value there.
func (m *Manager) marksResynced(applied map[string]uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for key := range m.optState {
		if _, ok := applied[key]; !ok {
			delete(m.optState, key)
			delete(m.markRev, key)
			delete(m.optRange, key)
		}
	}
	var lost []string
	for tag := range m.memory.all() {
		if _, ok := m.optState[tag]; !ok {
			lost = append(lost, tag)
		}
	}
	if len(lost) > 0 {
		slices.Sort(lost)
		m.spawnLocked(func(ctx context.Context) { m.writeBack(ctx, lost) })
	}
	if m.isReady.Load() {
		m.reconcile()
		m.recomputeRanges()
	}
}

// served reports whether this dispenser took a segment of tag (it has a high-water mark
// of it: Config.SegmentMarks); without marks, every tag counts as served.
func (m *Manager) served(tag string) bool {
	marks := m.cfg.SegmentMarks
	return marks == nil || marks.Mark(tag) > 0
}

// marked reports whether name is marked monotonic: by its value in <prefix>_tagopts,
// or, when it has none there, by this dispenser's memory. Called with mu held.
func (m *Manager) marked(name string) bool {
	on, ok := m.optState[name]
	if ok {
		return on
	}
	return m.memory.has(name)
}

// mayLead reports whether this dispenser may take name's lease: the tag is marked and
// its memory holds it (the campaign remembers a mark before each attempt; a mark that
// arrived since is remembered on the next one). A tag monotonic only by a live lease
// record is followed, never led.
func (m *Manager) mayLead(name string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.marked(name) && m.memory.has(name)
}

// syncMemory brings the memory's entry of name in line with its value in
// <prefix>_tagopts (none: left as it is), durably, and returns once the file holds it.
func (m *Manager) syncMemory(name string) error {
	for {
		m.mu.Lock()
		want, ok := m.optState[name]
		m.mu.Unlock()
		if !ok {
			return nil
		}
		if err := m.memory.set(name, want); err != nil {
			return err
		}
		m.mu.Lock()
		again := m.optState[name] != want
		m.mu.Unlock()
		if !again {
			return nil
		}
	}
}

// reconcile publishes the tags monotonic now (marked, or with a live lease record),
// starts a campaign for each one without, and stops those of tags no longer monotonic.
// Called with mu held; a stopped campaign ends on its own goroutine.
func (m *Manager) reconcile() {
	want := make(map[string]bool, len(m.tags)+1)
	for name, on := range m.optState {
		if on {
			want[name] = true
		}
	}
	for name := range m.memory.all() {
		if _, ok := m.optState[name]; !ok {
			want[name] = true
		}
	}
	for name, h := range m.holders {
		if h.live() {
			want[name] = true
		}
	}
	changed := false
	for name, ts := range m.tags {
		if !want[name] {
			ts.cancel()
			delete(m.tags, name)
			changed = true
		}
	}
	for name := range want {
		if m.tags[name] == nil && m.startCampaign(name, m.isReady.Load()) {
			changed = true
		}
	}
	if !maps.Equal(m.marks.Load().exact, want) {
		m.marks.Store(newMarkSet(want))
	}
	if changed {
		next := make(map[string]*tagState, len(m.tags))
		for name, ts := range m.tags {
			next[name] = ts
		}
		m.states.Store(&next)
	}
}

// startCampaign makes the state of a newly monotonic tag and starts its campaign, once
// the campaign of any earlier state of the tag returned (so that its term is over).
// live says it became monotonic while this dispenser watched, rather than at its
// start: then its terms settle first (tagState.settleUntil). Called with mu held.
func (m *Manager) startCampaign(name string, live bool) bool {
	if m.runCtx == nil || m.stopping {
		return false
	}
	prev := m.ended[name]
	ctx, cancel := context.WithCancel(m.runCtx)
	ts := &tagState{name: name, poke: make(chan struct{}, 1), ctx: ctx, cancel: cancel, done: make(chan struct{})}
	ts.answerWarned.Store(math.MinInt64 / 2)
	if live {
		ts.settleUntil, ts.settleRev = m.now()+m.cfg.LeaseTTL/2, m.markRev[name]
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
