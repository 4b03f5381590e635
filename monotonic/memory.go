package monotonic

import (
	"bytes"
	"errors"
	"fmt"
	"hash/crc32"
	"io/fs"
	"maps"
	"os"
	"slices"
	"strings"
	"sync"

	"github.com/leafbus/leafbus/internal/durable"
	"github.com/leafbus/leafbus/segment"
	"github.com/leafbus/leafbus/wire"
)

// memory is the set of tags this dispenser has treated as monotonic, kept in one file
// of its data dir (Config.MemoryFile), so that a lost <prefix>_tagopts bucket never
// turns them into ordinary tags: a tag is added, durably, before this dispenser leads
// it or forwards a request of it, and removed only when an operator marks it ordinary
// (the value {"monotonic":false} in <prefix>_tagopts, which `dispenser tag update
// --monotonic=false` writes). A deleted key, a purged one or a bucket that is gone say
// nothing about the tag: they are a loss, and the tags remembered are written back.
//
// It is written like the segment high-water marks (segment.FileMarks): the whole file
// for each change, through a temp file that is fsynced and renamed, the directory
// fsynced; changes that arrive while a write is under way go together in the next one.
// One process per file: the dispenser's data-dir lock ensures it.
type memory struct {
	path string

	writeMu sync.Mutex // one file write at a time; taken before mu

	mu      sync.Mutex // guards the fields below; never held during I/O
	tags    map[string]bool
	version uint64 // counts changes
	durable uint64 // the version the file holds
	writes  uint64 // files written, for tests of the group commit
}

// ErrCorruptMemory is returned by New when the file of remembered monotonic tags exists
// but does not read back whole: it is never taken as empty, since a dispenser that
// forgot its monotonic tags could serve one as an ordinary tag, out of order.
var ErrCorruptMemory = errors.New("corrupt file of remembered monotonic tags")

// The file: a header line, one tag per line sorted by name, and a last line with the
// CRC-32 (IEEE) of every byte before it, in hex:
//
//	leafbus monotonic tags v1
//	orders
//	payments
//	crc32 1b2c3d4e
const (
	memoryHeader    = "leafbus monotonic tags v1"
	memorySumPrefix = "crc32 "
)

// openMemory loads the file at path, or creates it (durably, so that a data dir that
// cannot be written fails the start rather than the first monotonic tag).
func openMemory(path string) (*memory, error) {
	if path == "" {
		return nil, errors.New("monotonic: config: MemoryFile is required: the file of the data dir that remembers the monotonic tags")
	}
	m := &memory{path: path, tags: map[string]bool{}}
	data, err := os.ReadFile(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if err := durable.WriteFile(path, encodeMemory(m.tags)); err != nil {
			return nil, fmt.Errorf("monotonic: create %q: %w", path, err)
		}
	case err != nil:
		return nil, fmt.Errorf("monotonic: read %q: %w", path, err)
	default:
		tags, err := decodeMemory(data)
		if err != nil {
			return nil, fmt.Errorf("monotonic: %q: %w: %v (restore the file; or, once every dispenser runs and <prefix>_tagopts holds every monotonic tag, delete it)", path, ErrCorruptMemory, err)
		}
		m.tags = tags
	}
	durable.RemoveTemps(path)
	return m, nil
}

// all returns a copy of the tags remembered.
func (m *memory) all() map[string]bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return maps.Clone(m.tags)
}

// has reports whether tag is remembered (in memory: it may not be durable yet).
func (m *memory) has(tag string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.tags[tag]
}

// set adds (on) or removes tag and returns once the file holds the change, or a write
// that came after it.
func (m *memory) set(tag string, on bool) error {
	m.mu.Lock()
	if m.tags[tag] != on {
		m.version++
		if on {
			m.tags[tag] = true
		} else {
			delete(m.tags, tag)
		}
	}
	need := m.version
	done := m.durable >= need
	m.mu.Unlock()
	if done {
		return nil
	}
	return m.flush(need)
}

// flush writes the set unless the file already holds version need.
func (m *memory) flush(need uint64) error {
	m.writeMu.Lock()
	defer m.writeMu.Unlock()
	m.mu.Lock()
	if m.durable >= need {
		m.mu.Unlock()
		return nil
	}
	version, data := m.version, encodeMemory(m.tags)
	m.mu.Unlock()
	if err := durable.WriteFile(m.path, data); err != nil {
		return fmt.Errorf("monotonic: write %q: %w", m.path, err)
	}
	m.mu.Lock()
	m.durable = max(m.durable, version)
	m.writes++
	m.mu.Unlock()
	return nil
}

func encodeMemory(tags map[string]bool) []byte {
	b := make([]byte, 0, len(memoryHeader)+len(tags)*16+32)
	b = append(b, memoryHeader...)
	b = append(b, '\n')
	for _, tag := range slices.Sorted(maps.Keys(tags)) {
		b = append(b, tag...)
		b = append(b, '\n')
	}
	return fmt.Appendf(b, "%s%08x\n", memorySumPrefix, crc32.ChecksumIEEE(b))
}

// decodeMemory parses the file, refusing anything encodeMemory could not have written.
func decodeMemory(data []byte) (map[string]bool, error) {
	if len(data) == 0 || data[len(data)-1] != '\n' {
		return nil, errors.New("the file is empty or its last line is cut short")
	}
	cut := bytes.LastIndexByte(data[:len(data)-1], '\n') + 1
	body, last := data[:cut], string(data[cut:len(data)-1])
	hex, ok := strings.CutPrefix(last, memorySumPrefix)
	if !ok || len(hex) != 8 {
		return nil, fmt.Errorf("the last line %s is not the checksum line", wire.Quote(last))
	}
	if got := fmt.Sprintf("%08x", crc32.ChecksumIEEE(body)); got != hex {
		return nil, fmt.Errorf("the checksum of the content is %s, the file says %s", got, wire.Quote(hex))
	}
	lines := strings.Split(strings.TrimSuffix(string(body), "\n"), "\n")
	if len(body) == 0 || lines[0] != memoryHeader {
		return nil, fmt.Errorf("the first line is not %q", memoryHeader)
	}
	tags := make(map[string]bool, len(lines)-1)
	for i, tag := range lines[1:] {
		if err := segment.CheckTagName(tag); err != nil {
			return nil, fmt.Errorf("line %d: %w", i+2, err)
		}
		if tags[tag] {
			return nil, fmt.Errorf("line %d: tag %q appears twice", i+2, tag)
		}
		tags[tag] = true
	}
	return tags, nil
}
