package workerid

import (
	"context"
	"path/filepath"
	"testing"
	"time"
)

// BenchmarkHeartbeatBeat is one beat on a real embedded JetStream: forever put, cache file
// save (with fsync) and a KV lease renewal (worker record compare-and-set + lease update).
func BenchmarkHeartbeatBeat(b *testing.B) {
	env := startJS(b)
	forever := openForever(b, env.js)
	lease := acquire(b, openKVRegistry(b, env.js, kvConfig("bench")))
	gen := &fakeGen{}
	h := testHeartbeat(b, heartbeatConfig(func(c *HeartbeatConfig) {
		c.NodeID = "bench"
		c.Lease = lease
		c.Generator = gen
		c.Forever = forever
		c.Cache = &CacheFile{Path: filepath.Join(b.TempDir(), "workerid.json")}
	}))
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		gen.setIssued(time.Now().UnixMilli() + 1) // a new record every beat, as in service
		if err := h.Beat(ctx); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkKVLeaseRenew is the registry's part of a beat.
func BenchmarkKVLeaseRenew(b *testing.B) {
	env := startJS(b)
	lease := acquire(b, openKVRegistry(b, env.js, kvConfig("bench")))
	ctx := context.Background()
	ts := time.Now().UnixMilli()
	b.ReportAllocs()
	for b.Loop() {
		ts++
		if err := lease.Renew(ctx, ts); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkKVRegistryAcquire is a node start's lease acquisition with 100 IDs already
// leased (it lists the keys, then creates the lowest free one).
func BenchmarkKVRegistryAcquire(b *testing.B) {
	env := startJS(b)
	reg := openKVRegistry(b, env.js, kvConfig("bench"))
	for range 100 {
		acquire(b, reg)
	}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		l, err := reg.Acquire(ctx)
		if err != nil {
			b.Fatal(err)
		}
		b.StopTimer()
		if err := l.Release(ctx, 1); err != nil {
			b.Fatal(err)
		}
		b.StartTimer()
	}
}

// BenchmarkCacheFileSave is the atomic replace: temp file, fsync, rename, directory fsync.
func BenchmarkCacheFileSave(b *testing.B) {
	c := CacheFile{Path: filepath.Join(b.TempDir(), "workerid.json")}
	e := cacheEntry{NodeID: "bench", WorkerID: 1, Timestamp: time.Now().UnixMilli()}
	b.ReportAllocs()
	for b.Loop() {
		e.Timestamp++
		if err := c.Save(e); err != nil {
			b.Fatal(err)
		}
	}
}
