package segment

import (
	"context"
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
	"github.com/leafbus/leafbus/wire"
)

// Marks remembers, per tag, the highest max_id (the exclusive end of a segment) this
// dispenser ever took from the store: its high-water marks. Every ID this node handed
// out for a tag lies below the tag's mark, and an honest store only grants ranges above
// everything it granted before, so a segment starting below the mark means the store
// went backwards (a rewound row, a leaf_alloc restored from a backup, a lost or rebuilt
// KV bucket) and may repeat IDs; the Generator refuses it (ErrStoreWentBack).
//
// Marks only rise. Implementations are safe for concurrent use.
type Marks interface {
	// Mark returns tag's mark, or 0 when this node never took a segment of tag.
	Mark(tag string) int64

	// Raise records that this node took a segment of tag ending at maxID (exclusive).
	// It returns nil only once a mark of at least maxID is durable, so a segment may
	// be served once Raise returned nil and never before. A maxID at or below the mark
	// changes nothing. Returns an error wrapping ErrInvalidTag for an invalid tag name
	// or a maxID below 1, and the I/O error when the mark could not be made durable.
	Raise(tag string, maxID int64) error

	// All returns a copy of every mark.
	All() map[string]int64
}

// ErrCorruptMarks is returned by OpenFileMarks when the marks file exists but cannot be
// read as a whole, valid marks file: it is never taken as empty, since starting without
// its marks could serve IDs this node already handed out.
var ErrCorruptMarks = errors.New("corrupt high-water marks file")

// The marks file: a header line, one "tag max_id" line per tag sorted by name, and a
// last line with the CRC-32 (IEEE) of every byte before it, in hex:
//
//	leafbus segment high-water marks v1
//	orders 3001
//	com%2Eacme%2Eorder 20
//	crc32 1b2c3d4e
//
// The tag is written as its subject token (wire.TagToken), which holds no white space,
// so a line splits at its one space; a tag of A-Z a-z 0-9 _ - is written as it is, as
// every file before tags could hold other characters. The checksum is what turns a
// flipped digit, which would still parse, into an error.
//
// A data dir that was fenced (`dispenser fence`, after a backup was restored) has a
// version 2 file, whose second line records the last fence: when it ran (Unix ms) and
// by how much it raised every tag (Fence):
//
//	leafbus segment high-water marks v2
//	fenced 1763790000123 margin 10000000000
//	orders 10000003001
//	crc32 5e6f7a8b
//
// A file without a fence is still written as version 1, which earlier dispensers read.
const (
	marksHeader       = "leafbus segment high-water marks v1"
	marksHeaderFenced = "leafbus segment high-water marks v2"
	marksFencePrefix  = "fenced "
)

// Fence is what `dispenser fence` records in the marks file of a data dir restored from
// a copy: when it raised every tag's max_id past what the copy's marks say, and by how
// much. The zero Fence means the dir was never fenced.
type Fence struct {
	At     int64 // Unix ms
	Margin int64 // how far above max(max_id, mark) every tag was raised
}

// FileMarks is Marks kept in memory and in one file, rewritten whole for every rise:
// written to a temp file in the same directory, fsynced, renamed over the file, and the
// directory fsynced, so that after a crash the file holds the old marks or the new
// ones, never a mix or nothing. Raises that arrive while a write is under way are
// written together by the next one (a group commit), so that thousands of tags loading
// at once cost a few writes, not thousands.
//
// One process per file: the dispenser's data-dir lock ensures it. Two processes would
// overwrite each other's marks.
type FileMarks struct {
	path string
	file durable.GroupWriter // writes the whole file, grouping the rises meanwhile

	mu      sync.Mutex // guards the fields below; never held during I/O
	marks   map[string]markEntry
	fence   Fence
	version uint64 // counts rises
}

var _ Marks = (*FileMarks)(nil)

// markEntry is one tag's mark and the version that set it: a Raise waits until the file
// holds that version, even when another Raise set the mark and is still writing it.
type markEntry struct {
	maxID   int64
	version uint64
}

// OpenFileMarks loads the marks file at path, or creates it (durably, so that a
// directory that cannot be written fails here rather than at the first segment) when
// there is none. A file that exists but does not read back as a valid marks file is an
// error wrapping ErrCorruptMarks that names the file. Leftover temp files of a write a
// crash interrupted are removed.
func OpenFileMarks(path string) (*FileMarks, error) {
	if path == "" {
		return nil, errors.New("segment: marks file: the path is empty")
	}
	m := &FileMarks{path: path, marks: make(map[string]markEntry)}
	m.file = durable.GroupWriter{Path: path, Snapshot: m.snapshot}
	data, err := os.ReadFile(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		if err := durable.WriteFile(path, encodeMarks(m.marks, Fence{})); err != nil {
			return nil, fmt.Errorf("segment: create marks file %q: %w", path, err)
		}
	case err != nil:
		return nil, fmt.Errorf("segment: read marks file %q: %w", path, err)
	default:
		marks, fence, err := decodeMarks(data)
		if err != nil {
			return nil, fmt.Errorf("segment: marks file %q: %w: %v (restore the file; delete it only once every tag's max_id in the store is above anything this dispenser could have served)", path, ErrCorruptMarks, err)
		}
		for tag, maxID := range marks {
			m.marks[tag] = markEntry{maxID: maxID}
		}
		m.fence = fence
	}
	durable.RemoveTemps(path)
	return m, nil
}

// Mark implements Marks.
func (m *FileMarks) Mark(tag string) int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.marks[tag].maxID
}

// All implements Marks.
func (m *FileMarks) All() map[string]int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	all := make(map[string]int64, len(m.marks))
	for tag, e := range m.marks {
		all[tag] = e.maxID
	}
	return all
}

// Fence returns the last fence recorded (RecordFence), the zero Fence when none was.
func (m *FileMarks) Fence() Fence {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.fence
}

// RecordFence records that the store was fenced as f says: every tag of raised has its
// mark raised to the max_id the fence gave it (marks only rise), and f replaces the
// last fence. It returns nil once the file holds both.
func (m *FileMarks) RecordFence(f Fence, raised map[string]int64) error {
	if f.At < 1 || f.Margin < 1 {
		return fmt.Errorf("segment: fence at %d by %d: want both at least 1", f.At, f.Margin)
	}
	for tag, maxID := range raised {
		if err := checkMark(tag, maxID); err != nil {
			return err
		}
	}
	m.mu.Lock()
	m.version++
	for tag, maxID := range raised {
		if maxID > m.marks[tag].maxID {
			m.marks[tag] = markEntry{maxID: maxID, version: m.version}
		}
	}
	m.fence = f
	need := m.version
	m.mu.Unlock()
	return m.commit(need)
}

// Raise implements Marks. The mark rises in memory at once, before the write: a failed
// write leaves the memory ahead of the file, which is safe, because the segment that
// raised it is not served, and the next Raise writes it again.
func (m *FileMarks) Raise(tag string, maxID int64) error {
	if err := checkMark(tag, maxID); err != nil {
		return err
	}
	m.mu.Lock()
	e := m.marks[tag]
	if maxID > e.maxID {
		m.version++
		e = markEntry{maxID: maxID, version: m.version}
		m.marks[tag] = e
	}
	m.mu.Unlock()
	return m.commit(e.version)
}

// commit returns once the file holds version need.
func (m *FileMarks) commit(need uint64) error {
	if err := m.file.Commit(need); err != nil {
		return fmt.Errorf("segment: write marks file %q: %w", m.path, err)
	}
	return nil
}

// snapshot is the file's content now and the version it holds.
func (m *FileMarks) snapshot() ([]byte, uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return encodeMarks(m.marks, m.fence), m.version
}

// InmemMarks is Marks in memory, for tests only: nothing is durable, so a restart
// forgets every mark. Safe for concurrent use.
type InmemMarks struct {
	mu    sync.Mutex
	marks map[string]int64
}

var _ Marks = (*InmemMarks)(nil)

// NewInmemMarks returns marks with none recorded.
func NewInmemMarks() *InmemMarks {
	return &InmemMarks{marks: make(map[string]int64)}
}

// Mark implements Marks.
func (m *InmemMarks) Mark(tag string) int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.marks[tag]
}

// Raise implements Marks.
func (m *InmemMarks) Raise(tag string, maxID int64) error {
	if err := checkMark(tag, maxID); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.marks[tag] = max(m.marks[tag], maxID)
	return nil
}

// All implements Marks.
func (m *InmemMarks) All() map[string]int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	all := make(map[string]int64, len(m.marks))
	for tag, maxID := range m.marks {
		all[tag] = maxID
	}
	return all
}

// checkMark validates a Raise, so that every mark can be written and read back.
func checkMark(tag string, maxID int64) error {
	if err := CheckTagName(tag); err != nil {
		return err
	}
	if maxID < 1 {
		return fmt.Errorf("%w: tag %q: mark %d must be at least 1", ErrInvalidTag, tag, maxID)
	}
	return nil
}

// maxNamedTags bounds how many tags an error message lists of each kind, so that a
// store that lost 10,000 tags gives a readable message; the count says how many more.
const maxNamedTags = 20

// CheckStoreAgainstMarks compares the store with this node's marks, for a dispenser to
// run before it serves: every tag with a mark must still be in the store, with a max_id
// at or above its mark. A tag missing, or with a lower max_id, means the store lost or
// rewound it (a lost or rebuilt KV bucket, a leaf_alloc restored from a backup), and
// serving it could repeat IDs this node handed out. The error then wraps
// ErrStoreWentBack and names each such tag, its mark, and how to repair it. An error
// reading the tag list is returned wrapped, as it is.
func CheckStoreAgainstMarks(ctx context.Context, store Store, marks Marks) error {
	all := marks.All()
	if len(all) == 0 {
		return nil
	}
	list, err := store.Tags(ctx)
	if err != nil {
		return fmt.Errorf("segment: check the store against the high-water marks: %w", err)
	}
	stored := make(map[string]int64, len(list))
	for _, t := range list {
		stored[t.Name] = t.MaxID
	}
	var missing, behind []string
	for _, tag := range slices.Sorted(maps.Keys(all)) {
		mark := all[tag]
		maxID, ok := stored[tag]
		switch {
		case !ok:
			missing = append(missing, fmt.Sprintf("%s (mark %d)", tag, mark))
		case maxID < mark:
			behind = append(behind, fmt.Sprintf("%s (max_id %d, mark %d)", tag, maxID, mark))
		}
	}
	if len(missing) == 0 && len(behind) == 0 {
		return nil
	}
	var msg strings.Builder
	if len(missing) > 0 {
		fmt.Fprintf(&msg, "; %d tags this dispenser served are missing from the store: %s (add each again with `dispenser tag add --tag T --step S --max-id N`)", len(missing), nameSome(missing))
	}
	if len(behind) > 0 {
		fmt.Fprintf(&msg, "; %d tags have a max_id below this dispenser's high-water mark: %s (repair each with `dispenser tag update --tag T --max-id N`)", len(behind), nameSome(behind))
	}
	return fmt.Errorf("segment: %w: the store lost or rewound tags, and serving them could repeat IDs%s; N must be at least the mark, and at least every other dispenser's mark for that tag", ErrStoreWentBack, msg.String())
}

// nameSome joins the first maxNamedTags items and says how many it left out.
func nameSome(items []string) string {
	if len(items) <= maxNamedTags {
		return strings.Join(items, ", ")
	}
	return fmt.Sprintf("%s and %d more", strings.Join(items[:maxNamedTags], ", "), len(items)-maxNamedTags)
}

// encodeMarks renders the marks file (see marksHeader): version 1, or version 2 with
// the fence when there is one.
func encodeMarks(marks map[string]markEntry, fence Fence) []byte {
	b := make([]byte, 0, len(marksHeaderFenced)+len(marks)*32+96)
	if fence == (Fence{}) {
		b = append(b, marksHeader...)
		b = append(b, '\n')
	} else {
		b = fmt.Appendf(b, "%s\n%s%d margin %d\n", marksHeaderFenced, marksFencePrefix, fence.At, fence.Margin)
	}
	for _, tag := range slices.Sorted(maps.Keys(marks)) {
		b = append(b, wire.TagToken(tag)...)
		b = append(b, ' ')
		b = strconv.AppendInt(b, marks[tag].maxID, 10)
		b = append(b, '\n')
	}
	return durable.AppendSum(b)
}

// decodeMarks parses a marks file, refusing anything encodeMarks could not have written.
func decodeMarks(data []byte) (map[string]int64, Fence, error) {
	var fence Fence
	lines, err := durable.Lines(data)
	if err != nil {
		return nil, fence, err
	}
	if len(lines) == 0 {
		return nil, fence, errors.New("the header line is missing")
	}
	first := 1 // the first tag line
	switch lines[0] {
	case marksHeader:
	case marksHeaderFenced:
		if len(lines) < 2 {
			return nil, fence, errors.New("line 2: the fence line is missing")
		}
		if fence, err = decodeFence(lines[1]); err != nil {
			return nil, fence, fmt.Errorf("line 2: %w", err)
		}
		first = 2
	default:
		return nil, fence, fmt.Errorf("line 1: %s is not %q or %q", wire.Quote(lines[0]), marksHeader, marksHeaderFenced)
	}
	marks := make(map[string]int64, len(lines)-first)
	for i, line := range lines[first:] {
		n := i + first + 1
		token, num, ok := strings.Cut(line, " ")
		if !ok {
			return nil, fence, fmt.Errorf("line %d: %s is not \"tag max_id\"", n, wire.Quote(line))
		}
		tag, err := wire.ParseTagToken(token)
		if err != nil {
			return nil, fence, fmt.Errorf("line %d: %w: %w", n, ErrInvalidTag, err)
		}
		maxID, err := strconv.ParseInt(num, 10, 64)
		if err != nil {
			return nil, fence, fmt.Errorf("line %d: max_id %s is not a whole number", n, wire.Quote(num))
		}
		if err := checkMark(tag, maxID); err != nil {
			return nil, fence, fmt.Errorf("line %d: %w", n, err)
		}
		if _, dup := marks[tag]; dup {
			return nil, fence, fmt.Errorf("line %d: tag %q appears twice", n, tag)
		}
		marks[tag] = maxID
	}
	return marks, fence, nil
}

// decodeFence parses "fenced <at> margin <margin>", both at least 1.
func decodeFence(line string) (Fence, error) {
	var f Fence
	fields := strings.Split(line, " ")
	if len(fields) != 4 || fields[0]+" " != marksFencePrefix || fields[2] != "margin" {
		return Fence{}, fmt.Errorf("%s is not \"fenced <unix ms> margin <n>\"", wire.Quote(line))
	}
	var err1, err2 error
	f.At, err1 = strconv.ParseInt(fields[1], 10, 64)
	f.Margin, err2 = strconv.ParseInt(fields[3], 10, 64)
	if err1 != nil || err2 != nil || f.At < 1 || f.Margin < 1 {
		return Fence{}, fmt.Errorf("%s: the time and the margin must be whole numbers of at least 1", wire.Quote(line))
	}
	return f, nil
}
