package monotonic

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/leafbus/leafbus/internal/backoff"
	"github.com/leafbus/leafbus/wire"
)

// Every Manager keeps a presence record in <prefix>_leaders, key dispensers.<instance>
// (a tag name has no dot, so no lease shares it): its node and the revision of
// <prefix>_tagopts up to which its view holds every write. It writes the record before
// it first lists the marks, again as soon as its view takes in a newer write, and every
// LeaseTTL/3 (the bucket keeps a record 2 lease TTLs after its last write), and deletes
// it when it stops.
//
// SetMonotonic marks a tag and then waits until every dispenser with a record has taken
// the mark in, LeaseTTL/2 at most: once it returned, no dispenser serves the tag as an
// ordinary tag, so the promise holds for every request sent after the mark's admin
// request was answered, and a leader may serve from its first lease on. A dispenser
// that started while the mark was written is covered as well: its record was written
// before it listed the marks, so either the wait saw the record or the listing came
// after the mark.

// presencePrefix starts the key of a presence record.
const presencePrefix = wire.PresencePrefix

// presenceRecord is the value of a presence record.
type presenceRecord = wire.Presence

// maxBusy bounds a presence record's list of busy tags; a tag left out counts as busy.
const maxBusy = 256

// ackPoll is how often SetMonotonic reads the presence records while it waits.
const ackPoll = 10 * time.Millisecond

func (m *Manager) presenceKey() string { return presencePrefix + m.instance }

// writePresence writes this dispenser's presence record with the marks applied now.
func (m *Manager) writePresence(ctx context.Context) error {
	rec := presenceRecord{Node: m.cfg.NodeID, Marks: m.applied.Load(), Features: []string{featureRanges}, IDKey: m.cfg.IDKey}
	m.mu.Lock()
	now := m.now()
	for tag, at := range m.busy {
		if now-at >= m.cfg.LeaseTTL {
			delete(m.busy, tag)
		} else if len(rec.Busy) < maxBusy {
			rec.Busy = append(rec.Busy, tag)
		} else {
			rec.Busy = append(rec.Busy[:0], "*") // too many to list: every tag counts as busy
			break
		}
	}
	m.mu.Unlock()
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, m.cfg.RenewInterval)
	defer cancel()
	_, err = m.leaders.Put(ctx, m.presenceKey(), b)
	return err
}

// firstPresence writes the presence record before the marks are listed (see above),
// retrying until it is written or ctx ends (false).
func (m *Manager) firstPresence(ctx context.Context) bool {
	bo := backoff.New(watchPolicy)
	for {
		err := m.writePresence(ctx)
		if err == nil {
			return true
		}
		if bo.Failures() == 0 {
			m.log.Warn("monotonic: cannot write this dispenser's presence record, retrying; the marks load once it is written", "bucket", m.leaders.Bucket(), "err", err)
		}
		if !bo.Wait(ctx) {
			return false
		}
	}
}

// presence keeps the presence record up to date until ctx ends, then deletes it (best
// effort: a record left behind expires, and a wait for its marks ends at its bound).
func (m *Manager) presence(ctx context.Context) {
	tick := time.NewTicker(m.cfg.LeaseTTL / 3)
	defer tick.Stop()
	written := m.applied.Load()
	failures := 0
	for {
		select {
		case <-ctx.Done():
			dctx, cancel := context.WithTimeout(context.Background(), releaseTimeout)
			_ = m.leaders.Delete(dctx, m.presenceKey())
			cancel()
			return
		case <-m.presenceKick:
			if m.applied.Load() == written {
				continue
			}
		case <-tick.C:
		}
		applied := m.applied.Load()
		if err := m.writePresence(ctx); err != nil {
			if failures++; failures == 1 && ctx.Err() == nil {
				m.log.Warn("monotonic: presence record not written, retrying", "err", err)
			}
			continue
		}
		written, failures = applied, 0
	}
}

// noteApplied records that the view holds every write of <prefix>_tagopts up to rev.
func (m *Manager) noteApplied(rev uint64) {
	for {
		cur := m.applied.Load()
		if rev <= cur {
			return
		}
		if m.applied.CompareAndSwap(cur, rev) {
			poke(m.presenceKick)
			return
		}
	}
}

// waitApplied waits until every dispenser with a presence record has taken in the
// write of <prefix>_tagopts at revision rev, LeaseTTL/2 at most (or until ctx ends). A
// dispenser that does not confirm in time (paused, or gone without deleting its
// record) is named in the log; the mark is written all the same.
func (m *Manager) waitApplied(ctx context.Context, tag string, rev uint64) {
	deadline := m.now() + m.cfg.LeaseTTL/2
	var behind []string
	var err error
	for {
		behind, _, err = m.presenceBehind(ctx, rev, "")
		if err == nil && len(behind) == 0 {
			return
		}
		if m.now() >= deadline || ctx.Err() != nil {
			break
		}
		if !backoff.Sleep(ctx, ackPoll) {
			break
		}
	}
	m.log.Warn("monotonic: not every dispenser confirmed the mark in time; one that did not may still serve the tag as an ordinary tag until its view takes it in",
		"tag", tag, "waited", m.cfg.LeaseTTL/2, "behind", behind, "err", err)
}

// settledEarly reports whether the tag of ts, marked while this dispenser ran, has
// settled before ts.settleUntil: every dispenser with a presence record took in its
// mark (revision ts.settleRev), and none had served it as an ordinary tag, so none
// holds ordinary IDs of it or a request that may still get some. It polls the records
// until then, or until settleUntil or ctx end (false).
//
// A tag that some dispenser served (an ordinary tag marked monotonic) settles at
// settleUntil, half a lease TTL after the mark was seen: by then that dispenser
// answered the ordinary requests it took before the mark (they wait 2 s at most).
func (m *Manager) settledEarly(ctx context.Context, ts *tagState) bool {
	for m.now() < ts.settleUntil {
		behind, busy, err := m.presenceBehind(ctx, ts.settleRev, ts.name)
		switch {
		case busy:
			return false
		case err == nil && len(behind) == 0:
			m.log.Info("monotonic: every dispenser took the mark in, and none served the tag before: served from the first lease", "tag", ts.name)
			return true
		}
		if !backoff.Sleep(ctx, ackPoll) {
			return false
		}
	}
	return false
}

// presenceBehind reads every presence record (the bucket's own list of keys, so none
// is missed) and returns the nodes whose marks are below rev, and whether any record
// lists tag as busy.
func (m *Manager) presenceBehind(ctx context.Context, rev uint64, tag string) (behind []string, busy bool, err error) {
	recs, err := m.presenceRecords(ctx)
	if err != nil {
		return nil, false, err
	}
	for _, rec := range recs {
		if rec.Marks < rev {
			behind = append(behind, rec.Node)
		}
		busy = busy || tag != "" && (slices.Contains(rec.Busy, tag) || slices.Contains(rec.Busy, "*"))
	}
	slices.Sort(behind)
	return behind, busy, nil
}

// presenceRecords reads every presence record (the bucket's own list of keys, so none
// is missed). A record that cannot be read is returned as the zero record: behind
// every revision, knowing no feature.
func (m *Manager) presenceRecords(ctx context.Context) ([]presenceRecord, error) {
	ctx, cancel := context.WithTimeout(ctx, m.cfg.RenewInterval)
	defer cancel()
	stream, err := m.cfg.JetStream.Stream(ctx, wire.KVStream(m.leaders.Bucket()))
	if err != nil {
		return nil, fmt.Errorf("presence records: %w", err)
	}
	prefix := wire.KVSubjects(m.leaders.Bucket())
	info, err := stream.Info(ctx, jetstream.WithSubjectFilter(prefix+presencePrefix+">"))
	if err != nil {
		return nil, fmt.Errorf("presence records: %w", err)
	}
	var recs []presenceRecord
	for subject := range info.State.Subjects {
		key := strings.TrimPrefix(subject, prefix)
		e, err := m.leaders.Get(ctx, key)
		switch {
		case errors.Is(err, jetstream.ErrKeyNotFound) || errors.Is(err, jetstream.ErrKeyDeleted):
			continue // stopped meanwhile
		case err != nil:
			return nil, fmt.Errorf("presence record %s: %w", key, err)
		}
		var rec presenceRecord
		if json.Unmarshal(e.Value(), &rec) != nil {
			rec = presenceRecord{}
		}
		recs = append(recs, rec)
	}
	return recs, nil
}
