package durable

import "sync"

// GroupWriter keeps one small file of the data dir in step with a value that changes
// often (the segment high-water marks, the tags a dispenser remembers), writing it whole
// with WriteFile and grouping the changes that arrive while a write is under way into
// the next one: a thousand concurrent changes cost a handful of writes, and each caller
// still returns only once the file holds its change.
//
// The owner numbers its changes (a version, raised under its own lock with each change)
// and hands Commit the version to wait for; Snapshot, which takes the owner's lock
// itself, returns the file's content and the version it holds. One write at a time:
// Snapshot runs under the writer's own lock, so the owner's lock is always taken after
// it, never before.
type GroupWriter struct {
	Path     string
	Snapshot func() (data []byte, version uint64)
	// Write is WriteFile unless a test slows or fails it.
	Write func(path string, data []byte) error

	writeMu sync.Mutex // one file write at a time; taken before mu and the owner's lock

	mu      sync.Mutex // guards the fields below; never held during I/O
	durable uint64     // the version the file holds
	writes  uint64     // files written, for tests of the grouping
}

// Commit returns once the file holds version need or a later one, writing it when no
// write under way or done already covers it. The error is the write's, unwrapped: the
// owner names the file.
func (g *GroupWriter) Commit(need uint64) error {
	if g.Durable() >= need {
		return nil
	}
	g.writeMu.Lock()
	defer g.writeMu.Unlock()
	if g.Durable() >= need {
		return nil // a write that started after the change covered it
	}
	data, version := g.Snapshot()
	write := g.Write
	if write == nil {
		write = WriteFile
	}
	if err := write(g.Path, data); err != nil {
		return err
	}
	g.mu.Lock()
	g.durable = max(g.durable, version)
	g.writes++
	g.mu.Unlock()
	return nil
}

// Durable is the version the file holds.
func (g *GroupWriter) Durable() uint64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.durable
}

// Writes is how many times the file was written.
func (g *GroupWriter) Writes() uint64 {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.writes
}
