package monotonic

import (
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"slices"
	"strconv"
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
// It keeps the tags' ranges the same way (ranges.go): every range other than the
// default this dispenser took in is written before it serves an ID of the tag, so that
// an opaque tag is never served as an ordinary one, or with another width, after its
// value was lost.
//
// It is written like the segment high-water marks (segment.FileMarks): the whole file
// for each change, through a temp file that is fsynced and renamed, the directory
// fsynced; changes that arrive while a write is under way go together in the next one.
// One process per file: the dispenser's data-dir lock ensures it.
type memory struct {
	path string
	file durable.GroupWriter // writes the whole file, grouping the changes meanwhile; tests slow its Write

	mu      sync.Mutex // guards the fields below; never held during I/O
	tags    map[string]bool
	ranges  map[string]wire.TagRange // normal, never the default
	version uint64                   // counts changes
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
//
// Once a tag has a range, the file is version 2, whose lines name after each tag and a
// tab (which no tag holds) what is remembered of it (a version-1 reader refuses it, as
// it must: it would forget the ranges):
//
//	leafbus tag options v2
//	invoices<TAB>bits=53 opaque key=f412d2d97e6120bb37a45c97
//	orders<TAB>monotonic
//	web<TAB>monotonic bits=53
//	crc32 5e6f7a8b
const (
	memoryHeader   = "leafbus monotonic tags v1"
	memoryHeaderV2 = "leafbus tag options v2"
)

// openMemory loads the file at path, or creates it (durably, so that a data dir that
// cannot be written fails the start rather than the first monotonic tag).
func openMemory(path string) (*memory, error) {
	if path == "" {
		return nil, errors.New("monotonic: config: MemoryFile is required: the file of the data dir that remembers the monotonic tags")
	}
	m := &memory{path: path, tags: map[string]bool{}, ranges: map[string]wire.TagRange{}}
	m.file = durable.GroupWriter{Path: path, Snapshot: m.snapshot}
	data, err := os.ReadFile(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if err := durable.WriteFile(path, encodeMemory(m.tags, m.ranges)); err != nil {
			return nil, fmt.Errorf("monotonic: create %q: %w", path, err)
		}
	case err != nil:
		return nil, fmt.Errorf("monotonic: read %q: %w", path, err)
	default:
		tags, ranges, err := decodeMemory(data)
		if err != nil {
			return nil, fmt.Errorf("monotonic: %q: %w: %v (restore the file; or, once every dispenser runs and <prefix>_tagopts holds every monotonic tag and tag range, delete it)", path, ErrCorruptMemory, err)
		}
		m.tags, m.ranges = tags, ranges
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

// rangeOf returns tag's remembered range: ok=false when none is (the default).
func (m *memory) rangeOf(tag string) (wire.TagRange, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	r, ok := m.ranges[tag]
	return r, ok
}

// allRanges returns a copy of the ranges remembered.
func (m *memory) allRanges() map[string]wire.TagRange {
	m.mu.Lock()
	defer m.mu.Unlock()
	return maps.Clone(m.ranges)
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
	return m.commit()
}

// setRange remembers r as tag's range (the default: forgets it) and returns once the
// file holds the change, or a write that came after it.
func (m *memory) setRange(tag string, r wire.TagRange) error {
	r = r.Normal()
	m.mu.Lock()
	if old, ok := m.ranges[tag]; r.IsDefault() && ok || !r.IsDefault() && old != r {
		m.version++
		if r.IsDefault() {
			delete(m.ranges, tag)
		} else {
			m.ranges[tag] = r
		}
	}
	return m.commit()
}

// commit returns once the file holds the version now; called with mu held, which it
// releases.
func (m *memory) commit() error {
	need := m.version
	m.mu.Unlock()
	if err := m.file.Commit(need); err != nil {
		return fmt.Errorf("monotonic: write %q: %w", m.path, err)
	}
	return nil
}

// snapshot is the file's content now and the version it holds.
func (m *memory) snapshot() ([]byte, uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return encodeMemory(m.tags, m.ranges), m.version
}

// encodeMemory writes version 1 while no tag has a range, so that a data dir of a
// deployment without ranges stays readable by a dispenser of an earlier version, and
// version 2 otherwise.
func encodeMemory(tags map[string]bool, ranges map[string]wire.TagRange) []byte {
	b := make([]byte, 0, len(memoryHeaderV2)+(len(tags)+len(ranges))*48+32)
	if len(ranges) == 0 {
		b = append(b, memoryHeader...)
		b = append(b, '\n')
		for _, tag := range slices.Sorted(maps.Keys(tags)) {
			b = append(b, tag...)
			b = append(b, '\n')
		}
		return durable.AppendSum(b)
	}
	b = append(b, memoryHeaderV2...)
	b = append(b, '\n')
	names := maps.Clone(tags)
	for tag := range ranges {
		names[tag] = true
	}
	for _, tag := range slices.Sorted(maps.Keys(names)) {
		b = append(b, tag...)
		b = append(b, '\t')
		if tags[tag] {
			b = append(b, "monotonic"...)
		}
		if r, ok := ranges[tag]; ok {
			if tags[tag] {
				b = append(b, ' ')
			}
			b = append(b, "bits="...)
			b = strconv.AppendInt(b, int64(r.Width()), 10)
			if r.Opaque {
				b = append(b, " opaque key="...)
				b = append(b, r.Key...)
			}
		}
		b = append(b, '\n')
	}
	return durable.AppendSum(b)
}

// decodeMemory parses the file, refusing anything encodeMemory could not have written.
func decodeMemory(data []byte) (map[string]bool, map[string]wire.TagRange, error) {
	lines, err := durable.Lines(data)
	if err != nil {
		return nil, nil, err
	}
	v2 := len(lines) > 0 && lines[0] == memoryHeaderV2
	if len(lines) == 0 || lines[0] != memoryHeader && !v2 {
		return nil, nil, fmt.Errorf("the first line is neither %q nor %q", memoryHeader, memoryHeaderV2)
	}
	tags := make(map[string]bool, len(lines)-1)
	ranges := map[string]wire.TagRange{}
	seen := make(map[string]bool, len(lines)-1)
	for i, line := range lines[1:] {
		tag, words := line, ""
		if v2 {
			var ok bool
			if tag, words, ok = strings.Cut(line, "\t"); !ok {
				return nil, nil, fmt.Errorf("line %d: no tab after the tag", i+2)
			}
		}
		if err := segment.CheckTagName(tag); err != nil {
			return nil, nil, fmt.Errorf("line %d: %w", i+2, err)
		}
		if seen[tag] {
			return nil, nil, fmt.Errorf("line %d: tag %q appears twice", i+2, tag)
		}
		seen[tag] = true
		if !v2 {
			tags[tag] = true
			continue
		}
		mono, r, err := decodeMemoryWords(words)
		if err != nil {
			return nil, nil, fmt.Errorf("line %d: tag %q: %w", i+2, tag, err)
		}
		if mono {
			tags[tag] = true
		}
		if !r.IsDefault() {
			ranges[tag] = r
		}
	}
	return tags, ranges, nil
}

// decodeMemoryWords reads what a version-2 line says of its tag, in the order
// encodeMemory writes it: "monotonic", then "bits=N" and, for an opaque tag, "opaque
// key=FP". A line must say something, and its range must be one encodeMemory writes.
func decodeMemoryWords(words string) (mono bool, r wire.TagRange, err error) {
	f := strings.Split(words, " ")
	if len(f) > 0 && f[0] == "monotonic" {
		mono, f = true, f[1:]
	}
	switch {
	case len(f) == 0 && mono:
		return mono, r, nil
	case len(f) == 0 || f[0] == "":
		return false, r, errors.New("the line names nothing to remember")
	}
	bitsText, ok := strings.CutPrefix(f[0], "bits=")
	n, nerr := strconv.Atoi(bitsText)
	if !ok || nerr != nil || strconv.Itoa(n) != bitsText {
		return false, r, fmt.Errorf("%s is not bits=N", wire.Quote(f[0]))
	}
	r.Bits, f = n, f[1:]
	if len(f) == 2 && f[0] == "opaque" && strings.HasPrefix(f[1], "key=") {
		r.Opaque, r.Key, f = true, strings.TrimPrefix(f[1], "key="), nil
	}
	if len(f) > 0 {
		return false, r, fmt.Errorf("unexpected %s", wire.Quote(strings.Join(f, " ")))
	}
	if err := r.Validate(); err != nil {
		return false, r, err
	}
	if r.IsDefault() {
		return false, r, errors.New("bits=63 is the default, never remembered")
	}
	return mono, r, nil
}
