package workerid

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/leafbus/leafbus/internal/durable"
)

// CacheFile is the node's local copy of its record (Leaf's workerID.properties), read at
// start-up when the forever bucket cannot be. Save replaces the file atomically, so a
// crash leaves either the old or the new record, never a torn one.
//
// A CacheFile is used by one heartbeat at a time; Load may run concurrently with Save.
type CacheFile struct {
	Path string
}

// cacheEntry is the content of the cache file. Ceiling is as in Record. Owner is the
// token this node puts in its ZooKeeper alive node (Leaf's layout): a restart that finds
// the alive node of an earlier session holding the token of its own cache file knows
// that session was this node's, and takes the node over instead of waiting for the
// session to expire (zk_leaf.go). Registry is the Identity of the registry that issued
// WorkerID: a registry starts from the entry only when it is the same one (ZooKeeper
// unreachable at start); "" in files of versions that did not record it. Instance is the
// token of the run that wrote the entry, the one in its worker ID's record (fence.go): a
// restart of this data dir takes that record over at once, since the run that wrote it
// has ended.
type cacheEntry struct {
	NodeID    string `json:"node_id"`
	WorkerID  int64  `json:"worker_id"`
	Timestamp int64  `json:"timestamp"`
	Ceiling   int64  `json:"ceiling,omitempty"`
	Owner     string `json:"owner,omitempty"`
	Registry  string `json:"registry,omitempty"`
	Instance  string `json:"instance,omitempty"`
}

// ErrCorruptCacheFile is returned by CacheFile.Load when the file exists but does not
// hold a record: not JSON, or JSON that no Save writes (no node ID, a negative worker
// ID, no timestamp). It is never taken as "no record", since the lost record may have
// been higher than every other, and no wait mends it.
var ErrCorruptCacheFile = errors.New("corrupt worker-ID cache file")

// corruptShown bounds how much of a corrupt cache file an error quotes.
const corruptShown = 64

// ErrCacheOtherRegistry is returned when a registry would start from a cache file entry
// (its backend unreachable) that another registry issued, or that does not say which
// registry issued it: that worker ID may be someone else's in this registry.
var ErrCacheOtherRegistry = errors.New("the cache file's worker ID may not be this registry's")

// Load reads the file. A missing file is an error wrapping ErrNoRecord; a file that
// does not hold a record is an error wrapping ErrCorruptCacheFile that names the file;
// one that cannot be read is any other error. Neither may be treated as missing: the
// file may have hidden a higher record.
func (c CacheFile) Load() (cacheEntry, error) {
	b, err := os.ReadFile(c.Path)
	if errors.Is(err, fs.ErrNotExist) {
		return cacheEntry{}, fmt.Errorf("cache file %s: %w", c.Path, ErrNoRecord)
	}
	if err != nil {
		return cacheEntry{}, fmt.Errorf("read cache file: %w", err)
	}
	var e cacheEntry
	if err := json.Unmarshal(b, &e); err != nil {
		return cacheEntry{}, c.corrupt(b, err.Error())
	}
	switch {
	case e.NodeID == "":
		return cacheEntry{}, c.corrupt(b, "no node_id")
	case e.WorkerID < 0:
		return cacheEntry{}, c.corrupt(b, fmt.Sprintf("worker_id %d", e.WorkerID))
	case e.Timestamp <= 0 || e.Ceiling < 0:
		return cacheEntry{}, c.corrupt(b, fmt.Sprintf("timestamp %d, ceiling %d", e.Timestamp, e.Ceiling))
	}
	return e, nil
}

// corrupt is Load's error for a file holding b, which is not a record because of why.
func (c CacheFile) corrupt(b []byte, why string) error {
	shown := fmt.Sprintf("%q", b)
	if len(b) > corruptShown {
		shown = fmt.Sprintf("%q... (%d bytes)", b[:corruptShown], len(b))
	}
	return fmt.Errorf("%w: %s holds %s: %s", ErrCorruptCacheFile, c.Path, shown, why)
}

// Save replaces the file with e durably (package durable: a temp file fsynced, renamed
// over the path, the directory fsynced), so a crash leaves the old record or the new one.
// The directory is created when missing.
func (c CacheFile) Save(e cacheEntry) error {
	b, err := json.Marshal(e)
	if err != nil {
		return fmt.Errorf("encode cache record: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(c.Path), 0o755); err != nil {
		return fmt.Errorf("create cache directory: %w", err)
	}
	if err := durable.WriteFile(c.Path, b); err != nil {
		return fmt.Errorf("write cache file %s: %w", c.Path, err)
	}
	return nil
}
