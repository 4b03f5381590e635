package main

import (
	"bufio"
	"container/heap"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sync"
)

// maxDuplicateSamples is how many duplicated IDs the report names.
const maxDuplicateSamples = 10

// checker keeps every ID a run receives and finds the ones handed out twice. Each client
// feeds its own collector, so a reply costs an append and no lock. At the end every
// collector's IDs are sorted and merged, and equal neighbours are duplicates.
//
// Without a spill directory every ID stays in memory, 8 bytes each. With one, a collector
// that fills its share of the memory budget sorts its IDs and writes them out as a run
// file, and the end is a k-way merge of the runs: still exact, with memory bounded by the
// budget plus one read buffer per run being merged. This is the external sort a
// billion-ID soak test needs.
type checker struct {
	dir    string // spill directory, owned and removed by close; "" keeps IDs in memory
	perCol int    // IDs a collector holds before it spills
	fanIn  int    // runs merged at once; more are first merged into longer runs

	mu   sync.Mutex // guards runs: collectors spill from their clients' goroutines
	runs []string
	seq  int
}

// checkResult is what the checker found.
type checkResult struct {
	IDs        int64   // IDs received, counting every repeat
	Duplicates int64   // IDs received more often than once, counting each extra receipt
	Samples    []int64 // up to maxDuplicateSamples of the repeated IDs, ascending
	Runs       int     // run files written (0: everything fitted in memory)
}

// add sums o into r, as when several ID spaces were checked apart.
func (r *checkResult) add(o checkResult) {
	r.IDs += o.IDs
	r.Duplicates += o.Duplicates
	r.Runs += o.Runs
	for _, v := range o.Samples {
		if len(r.Samples) < maxDuplicateSamples {
			r.Samples = append(r.Samples, v)
		}
	}
}

// newChecker makes a checker for collectors clients. spillRoot "" keeps every ID in
// memory; otherwise a private directory is made under spillRoot and each collector keeps
// at most memIDs/collectors IDs before spilling.
func newChecker(spillRoot string, memIDs, collectors int) (*checker, error) {
	c := &checker{fanIn: 64}
	if spillRoot == "" {
		return c, nil
	}
	dir, err := os.MkdirTemp(spillRoot, "leafbus-bench-check-")
	if err != nil {
		return nil, fmt.Errorf("check spill directory: %w", err)
	}
	c.dir = dir
	c.perCol = max(memIDs/max(collectors, 1), 1024)
	return c, nil
}

// close removes the spill files.
func (c *checker) close() error {
	if c.dir == "" {
		return nil
	}
	return os.RemoveAll(c.dir)
}

// collector is one client's share of the checker; only that client's goroutine uses it.
type collector struct {
	c   *checker
	ids []int64
	err error // the first spill failure: the check is incomplete and must say so
}

func (c *checker) collector() *collector { return &collector{c: c} }

// add keeps ids.
func (k *collector) add(ids []int64) {
	if k.err != nil {
		return
	}
	if k.ids == nil && k.c.dir != "" {
		k.ids = make([]int64, 0, k.c.perCol) // the budget, once, instead of append's doublings
	}
	k.ids = append(k.ids, ids...)
	if k.c.dir != "" && len(k.ids) >= k.c.perCol {
		slices.Sort(k.ids)
		if _, err := k.c.writeRun(&sliceSource{k.ids}); err != nil {
			k.err = err
		}
		k.ids = k.ids[:0]
	}
}

// writeRun writes the sorted IDs of src to a new run file.
func (c *checker) writeRun(src idSource) (string, error) {
	c.mu.Lock()
	path := filepath.Join(c.dir, fmt.Sprintf("run-%06d", c.seq))
	c.seq++
	c.mu.Unlock()
	f, err := os.Create(path)
	if err != nil {
		return "", fmt.Errorf("spill IDs: %w", err)
	}
	w := bufio.NewWriterSize(f, 256<<10)
	var buf [8]byte
	for {
		v, ok, err := src.next()
		if err != nil {
			f.Close()
			return "", err
		}
		if !ok {
			break
		}
		binary.BigEndian.PutUint64(buf[:], uint64(v))
		if _, err := w.Write(buf[:]); err != nil {
			f.Close()
			return "", fmt.Errorf("spill IDs to %s: %w", path, err)
		}
	}
	if err := w.Flush(); err != nil {
		f.Close()
		return "", fmt.Errorf("spill IDs to %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return "", fmt.Errorf("spill IDs to %s: %w", path, err)
	}
	c.mu.Lock()
	c.runs = append(c.runs, path)
	c.mu.Unlock()
	return path, nil
}

// finish merges everything cols collected and counts duplicates. The clients must have
// stopped.
func (c *checker) finish(cols []*collector) (checkResult, error) {
	var res checkResult
	var srcs []idSource
	for _, k := range cols {
		if k.err != nil {
			return res, k.err
		}
		slices.Sort(k.ids)
		srcs = append(srcs, &sliceSource{k.ids})
	}
	c.mu.Lock()
	runs := slices.Clone(c.runs)
	c.mu.Unlock()
	res.Runs = len(runs)
	// Too many runs to read at once: merge them fanIn at a time into longer runs first.
	for len(runs) > c.fanIn {
		group := runs[:c.fanIn]
		files, err := openRuns(group)
		if err != nil {
			return res, err
		}
		merged, err := c.writeRun(newMerger(files))
		closeAll(files)
		if err != nil {
			return res, err
		}
		for _, p := range group {
			os.Remove(p)
		}
		runs = append(runs[c.fanIn:], merged)
	}
	files, err := openRuns(runs)
	if err != nil {
		return res, err
	}
	defer closeAll(files)
	for _, f := range files {
		srcs = append(srcs, f)
	}
	m := newMerger(srcs)
	var prev int64
	for first := true; ; first = false {
		v, ok, err := m.next()
		if err != nil {
			return res, err
		}
		if !ok {
			return res, nil
		}
		res.IDs++
		if !first && v == prev {
			res.Duplicates++
			if len(res.Samples) < maxDuplicateSamples && (len(res.Samples) == 0 || res.Samples[len(res.Samples)-1] != v) {
				res.Samples = append(res.Samples, v)
			}
		}
		prev = v
	}
}

// idSource yields IDs in ascending order.
type idSource interface {
	next() (v int64, ok bool, err error)
}

// sliceSource walks a sorted slice.
type sliceSource struct{ ids []int64 }

func (s *sliceSource) next() (int64, bool, error) {
	if len(s.ids) == 0 {
		return 0, false, nil
	}
	v := s.ids[0]
	s.ids = s.ids[1:]
	return v, true, nil
}

// fileSource reads a run file.
type fileSource struct {
	f   *os.File
	r   *bufio.Reader
	buf [8]byte
}

func (s *fileSource) next() (int64, bool, error) {
	if _, err := io.ReadFull(s.r, s.buf[:]); err != nil {
		if errors.Is(err, io.EOF) {
			return 0, false, nil
		}
		return 0, false, fmt.Errorf("read ID run %s: %w", s.f.Name(), err)
	}
	return int64(binary.BigEndian.Uint64(s.buf[:])), true, nil
}

func openRuns(paths []string) ([]*fileSource, error) {
	var out []*fileSource
	for _, p := range paths {
		f, err := os.Open(p)
		if err != nil {
			closeAll(out)
			return nil, fmt.Errorf("open ID run: %w", err)
		}
		out = append(out, &fileSource{f: f, r: bufio.NewReaderSize(f, 64<<10)})
	}
	return out, nil
}

func closeAll(files []*fileSource) {
	for _, f := range files {
		f.f.Close()
	}
}

// merger is a k-way merge of sorted sources through a min-heap of their heads.
type merger struct {
	h    mergeHeap
	srcs []idSource
	err  error
}

type mergeItem struct {
	v   int64
	src int
}

type mergeHeap []mergeItem

func (h mergeHeap) Len() int           { return len(h) }
func (h mergeHeap) Less(i, j int) bool { return h[i].v < h[j].v }
func (h mergeHeap) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *mergeHeap) Push(x any)        { *h = append(*h, x.(mergeItem)) }
func (h *mergeHeap) Pop() any {
	old := *h
	x := old[len(old)-1]
	*h = old[:len(old)-1]
	return x
}

func newMerger[S idSource](srcs []S) *merger {
	m := &merger{}
	for i, s := range srcs {
		m.srcs = append(m.srcs, s)
		v, ok, err := s.next()
		if err != nil {
			m.err = err
			return m
		}
		if ok {
			m.h = append(m.h, mergeItem{v, i})
		}
	}
	heap.Init(&m.h)
	return m
}

func (m *merger) next() (int64, bool, error) {
	if m.err != nil {
		return 0, false, m.err
	}
	if len(m.h) == 0 {
		return 0, false, nil
	}
	top := m.h[0]
	v, ok, err := m.srcs[top.src].next()
	switch {
	case err != nil:
		m.err = err
		return 0, false, err
	case ok:
		m.h[0].v = v
		heap.Fix(&m.h, 0)
	default:
		heap.Pop(&m.h)
	}
	return top.v, true, nil
}
