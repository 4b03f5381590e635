package segment

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// hookMarks wraps InmemMarks; RaiseFn, when set, runs instead of the inner Raise.
type hookMarks struct {
	*InmemMarks
	RaiseFn func(tag string, maxID int64) error
}

func (m *hookMarks) Raise(tag string, maxID int64) error {
	if m.RaiseFn != nil {
		return m.RaiseFn(tag, maxID)
	}
	return m.InmemMarks.Raise(tag, maxID)
}

// logCapture is a test logger that also keeps every line, to count what was logged.
type logCapture struct {
	tb  testing.TB
	mu  sync.Mutex
	buf bytes.Buffer
}

func (c *logCapture) Write(p []byte) (int, error) {
	c.mu.Lock()
	c.buf.Write(p)
	c.mu.Unlock()
	c.tb.Log(strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

// count returns how many logged lines hold every one of parts.
func (c *logCapture) count(parts ...string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for line := range strings.Lines(c.buf.String()) {
		all := true
		for _, p := range parts {
			all = all && strings.Contains(line, p)
		}
		if all {
			n++
		}
	}
	return n
}

func captureLogs(tb testing.TB) (*slog.Logger, *logCapture) {
	c := &logCapture{tb: tb}
	return slog.New(slog.NewTextHandler(c, &slog.HandlerOptions{Level: slog.LevelDebug})), c
}

// idSet records IDs per tag and fails the test on the first one seen twice.
type idSet struct {
	mu   sync.Mutex
	seen map[string]map[int64]bool
}

func (s *idSet) add(tb testing.TB, tag string, ids []int64) {
	tb.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.seen == nil {
		s.seen = make(map[string]map[int64]bool)
	}
	if s.seen[tag] == nil {
		s.seen[tag] = make(map[int64]bool)
	}
	for i, id := range ids {
		if id < 1 || (i > 0 && id <= ids[i-1]) {
			tb.Errorf("%s batch %v is not positive and strictly increasing", tag, ids)
			return
		}
		if s.seen[tag][id] {
			tb.Errorf("%s ID %d handed out twice", tag, id)
			return
		}
		s.seen[tag][id] = true
	}
}

func (s *idSet) max(tag string) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	top := int64(0)
	for id := range s.seen[tag] {
		top = max(top, id)
	}
	return top
}

// fillUntilRefused takes IDs of tag one at a time, recording them, until the generator
// refuses; it fails the test unless that happens within limit IDs and the refusal is
// ErrStoreWentBack. It returns the refusal.
func fillUntilRefused(tb testing.TB, g *Generator, seen *idSet, tag string, limit int) error {
	tb.Helper()
	for range limit {
		dst := make([]int64, 1)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := g.Fill(ctx, tag, dst)
		cancel()
		if err != nil {
			if !errors.Is(err, ErrStoreWentBack) || !errors.Is(err, ErrUnavailable) {
				tb.Fatalf("Fill(%s) = %v, want ErrStoreWentBack (and ErrUnavailable)", tag, err)
			}
			return err
		}
		seen.add(tb, tag, dst)
	}
	tb.Fatalf("Fill(%s) still served %d IDs after the store went back", tag, limit)
	return nil
}

// marksConfig is testConfig with marks, a fixed step and quick rechecks.
func marksConfig(tb testing.TB, store Store, marks Marks) Config {
	cfg := testConfig(tb, store)
	cfg.Marks = marks
	cfg.MaxStep = 10
	cfg.WaitMax = 2 * time.Second
	return cfg
}

// startMarked is startGenerator for a generator whose rechecks run every few ms.
func startMarked(tb testing.TB, cfg Config) (*Generator, func()) {
	tb.Helper()
	g, err := New(cfg)
	if err != nil {
		tb.Fatalf("New: %v", err)
	}
	g.recheck = 5 * time.Millisecond
	stop := runGenerator(tb, g)
	select {
	case <-g.Ready():
	case <-time.After(10 * time.Second):
		tb.Fatalf("generator not ready within 10s: %+v", g.Stats())
	}
	return g, stop
}

// TestStoreWentBack: a store rewound under a running generator (a row put back as a
// restored backup would) never makes it repeat an ID. The IDs already in memory are
// served; then the tag answers ErrStoreWentBack at once, with a reason that names the
// tag, the segment, the mark and the repair, logged at error level and counted each
// time; no further segment is taken from the store while it is behind; other tags are
// served; and once an operator raises max_id to the mark the tag serves again.
func TestStoreWentBack(t *testing.T) {
	store := newHookStore()
	mustAdd(t, store, Tag{Name: "a", Step: 10}, Tag{Name: "b", Step: 10})
	marks := NewInmemMarks()
	cfg := marksConfig(t, store, marks)
	logger, logs := captureLogs(t)
	cfg.Logger = logger
	g, _ := startMarked(t, cfg)
	var seen idSet

	for range 25 {
		seen.add(t, "a", fill(t, g, "a", 1))
	}
	waitFor(t, "the preload of [31, 41)", func() bool { return marks.Mark("a") == 41 })

	store.inner.put(Tag{Name: "a", MaxID: 1, Step: 10}) // the backup said 1
	err := fillUntilRefused(t, g, &seen, "a", 100)
	if got := seen.max("a"); got != 40 {
		t.Fatalf("last ID served before the refusal = %d, want 40: the segments in memory are good", got)
	}
	for _, part := range []string{`tag "a"`, "went backwards", "[1, 11)", "41", "dispenser tag update --tag a --max-id N", "at least 41"} {
		if !strings.Contains(err.Error(), part) {
			t.Errorf("refusal %q does not mention %q", err, part)
		}
	}
	if ok, err := g.TryFill("a", make([]int64, 1)); ok || !errors.Is(err, ErrStoreWentBack) {
		t.Fatalf("TryFill(a) = %v, %v; want ErrStoreWentBack at once", ok, err)
	}
	began := time.Now()
	if err := g.Fill(context.Background(), "a", make([]int64, 3)); !errors.Is(err, ErrStoreWentBack) {
		t.Fatalf("Fill(a) = %v, want ErrStoreWentBack", err)
	}
	if d := time.Since(began); d > cfg.WaitMax/2 {
		t.Errorf("Fill(a) took %v to refuse, want at once (not after WaitMax %v)", d, cfg.WaitMax)
	}
	for range 30 {
		seen.add(t, "b", fill(t, g, "b", 2))
	}

	// The loader rechecks by reading: the store's max_id stays where the one refused
	// Take left it, instead of being carried up a step at a time.
	errorLines := func() int { return logs.count("level=ERROR", "went backwards", "tag=a", "mark=41") }
	waitFor(t, "three more rechecks, each logged", func() bool { return errorLines() >= 4 })
	if got, _ := store.inner.Tag(context.Background(), "a"); got.MaxID != 11 {
		t.Fatalf("store max_id of a = %d after rechecks, want 11 (one refused Take, then reads)", got.MaxID)
	}
	st := g.Stats()
	if st.TagsBehind != 1 || !strings.Contains(st.LastError, "went backwards") {
		t.Fatalf("stats %+v: want 1 tag behind and the reason as the last error", st)
	}
	// Each finding is counted before it is logged, so read the log first.
	n := errorLines()
	if found := g.Stats().StoreWentBack; uint64(n) > found || found-uint64(n) > 2 {
		t.Fatalf("%d error lines about a, want one per finding (%d)", n, found)
	}
	if marks.Mark("a") != 41 {
		t.Fatalf("mark of a = %d, want 41 unchanged by the refused segment", marks.Mark("a"))
	}

	// The repair: max_id to the mark.
	mark := marks.Mark("a")
	if _, err := store.UpdateTag(context.Background(), TagUpdate{Name: "a", MaxID: &mark}); err != nil {
		t.Fatalf("UpdateTag: %v", err)
	}
	dst := make([]int64, 1)
	waitFor(t, "a to serve again", func() bool { return g.Fill(context.Background(), "a", dst) == nil })
	if dst[0] != 41 {
		t.Fatalf("first ID after the repair = %d, want 41", dst[0])
	}
	seen.add(t, "a", dst)
	for range 50 {
		seen.add(t, "a", fill(t, g, "a", 1))
	}
	if st := g.Stats(); st.TagsBehind != 0 {
		t.Fatalf("stats %+v: want no tag behind after the repair", st)
	}
	if n := logs.count("level=INFO", "tag=a", "served"); n != 1 {
		t.Errorf("%d info lines saying a is served again, want 1", n)
	}
}

// TestTakesOfOneRowCheckedInOrder: two takes of one row, through TakeSegment beside a
// buffer, are checked against the marks in the order the store granted them. The first
// take is held, after the store granted its segment, until the second has raised the
// mark past it, or 300 ms: checked out of order, the first segment would be refused as
// a store gone backwards (a false alarm, and a repair advice for a store that is fine).
// With the takes serialized, the second only starts once the first is checked.
func TestTakesOfOneRowCheckedInOrder(t *testing.T) {
	for _, second := range []string{"TakeSegment"} {
		t.Run("OK/"+second, func(t *testing.T) {
			store := newHookStore()
			mustAdd(t, store, Tag{Name: "orders", Step: 10})
			marks := NewInmemMarks()
			var held atomic.Bool
			store.TakeFn = func(ctx context.Context, tag string, step int64) (Tag, error) {
				got, err := store.inner.Take(ctx, strings.ToLower(tag), step) // one row, any spelling
				if err != nil || !held.CompareAndSwap(false, true) {
					return got, err
				}
				for deadline := time.Now().Add(300 * time.Millisecond); time.Now().Before(deadline) && marks.Mark("orders") <= got.MaxID; {
					time.Sleep(time.Millisecond)
				}
				return got, nil
			}
			store.TagFn = func(ctx context.Context, tag string) (Tag, error) {
				return store.inner.Tag(ctx, strings.ToLower(tag))
			}
			g, _ := startMarked(t, marksConfig(t, store, marks))
			ctx := testCtx(t)
			first := make(chan error, 1)
			go func() { first <- g.Fill(ctx, "orders", make([]int64, 1)) }()
			waitFor(t, "the first take", func() bool { return store.takes.Load() == 1 })
			var err error
			if second == "TakeSegment" {
				_, err = g.TakeSegment(ctx, "orders", 0)
			} else {
				err = g.Fill(ctx, second, make([]int64, 1))
			}
			if err != nil {
				t.Fatalf("second take (%s): %v", second, err)
			}
			if err := <-first; err != nil {
				t.Fatalf("first take (orders), granted before the second: %v", err)
			}
			if st := g.Stats(); st.StoreWentBack != 0 || st.TagsBehind != 0 {
				t.Fatalf("stats %+v: the store never went back", st)
			}
			waitFor(t, "the row locks released", func() bool { return g.rows.size() == 0 })
		})
	}
}

// TestRowLocks: one holder per key at a time, other keys free, a waiter gives up with
// its context, and a lock is forgotten once nobody holds or waits for it.
func TestRowLocks(t *testing.T) {
	var r rowLocks
	ctx := context.Background()
	unlockA, err := r.lock(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	unlockB, err := r.lock(ctx, "b") // another row: not held up
	if err != nil {
		t.Fatal(err)
	}
	unlockB()
	short, cancel := context.WithTimeout(ctx, 20*time.Millisecond)
	defer cancel()
	if _, err := r.lock(short, "a"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("lock(a) while held = %v, want the context's deadline", err)
	}
	got := make(chan func(), 1)
	go func() {
		unlock, err := r.lock(ctx, "a")
		if err != nil {
			t.Error(err)
		}
		got <- unlock
	}()
	select {
	case <-got:
		t.Fatal("a second holder of a while the first holds it")
	case <-time.After(20 * time.Millisecond):
	}
	unlockA()
	(<-got)()
	if n := r.size(); n != 0 {
		t.Fatalf("%d locks kept with nobody holding or waiting, want 0", n)
	}
}

// TestStoreWentBackRestart: a generator restarted (new marks from the same file) over a
// store rewound while it was down: CheckStoreAgainstMarks names the tag, and a
// generator started anyway refuses it, also when the tag is looked up on request
// rather than listed, without taking a segment for every request.
func TestStoreWentBackRestart(t *testing.T) {
	path := filepath.Join(t.TempDir(), "segment.marks")
	store := newHookStore()
	mustAdd(t, store, Tag{Name: "a", Step: 10})
	var seen idSet
	firstMarks := mustOpenMarks(t, path)
	first, stop := startMarked(t, marksConfig(t, store, firstMarks))
	for range 5 {
		seen.add(t, "a", fill(t, first, "a", 1))
	}
	waitFor(t, "the preload of [11, 21)", func() bool { return firstMarks.Mark("a") == 21 })
	stop()

	store.inner.put(Tag{Name: "a", MaxID: 1, Step: 10})
	marks := mustOpenMarks(t, path)
	if marks.Mark("a") < seen.max("a")+1 {
		t.Fatalf("mark of a in the file = %d, below the IDs served (up to %d)", marks.Mark("a"), seen.max("a"))
	}
	err := CheckStoreAgainstMarks(context.Background(), store, marks)
	if !errors.Is(err, ErrStoreWentBack) || !strings.Contains(err.Error(), "a (max_id 1, mark 21)") {
		t.Fatalf("CheckStoreAgainstMarks = %v, want ErrStoreWentBack naming a (max_id 1, mark 21)", err)
	}

	// The tag list hides a, so each request looks it up.
	store.TagsFn = func(ctx context.Context) ([]Tag, error) { return []Tag{}, nil }
	cfg := marksConfig(t, store, marks)
	cfg.RefreshInterval = time.Hour
	second, _ := startMarked(t, cfg)
	for i := range 20 {
		err := second.Fill(context.Background(), "a", make([]int64, 1))
		if !errors.Is(err, ErrStoreWentBack) {
			t.Fatalf("request %d: Fill(a) = %v, want ErrStoreWentBack", i, err)
		}
	}
	if got, _ := store.inner.Tag(context.Background(), "a"); got.MaxID != 11 {
		t.Fatalf("store max_id of a = %d after 20 refused requests, want 11: one Take, then reads", got.MaxID)
	}
	mark := marks.Mark("a")
	if _, err := store.UpdateTag(context.Background(), TagUpdate{Name: "a", MaxID: &mark}); err != nil {
		t.Fatal(err)
	}
	if err := CheckStoreAgainstMarks(context.Background(), store.inner, marks); err != nil {
		t.Fatalf("CheckStoreAgainstMarks after the repair = %v, want nil", err)
	}
	// Served from the loader's next recheck on (the requests in between are refused).
	dst := make([]int64, 5)
	waitFor(t, "a to serve again", func() bool { return second.Fill(context.Background(), "a", dst) == nil })
	seen.add(t, "a", dst)
	if dst[0] != 21 {
		t.Fatalf("first IDs after the repair = %v, want 21..25", dst)
	}
}

// TestMarkDurableBeforeServed: no ID is served before the mark covering it is durable:
// while Raise blocks, requests wait; a failed Raise fails the load (retried), never
// serves its segment; and a file on disk, read after every request, always covers
// every ID served so far, so a crash at any moment leaves a mark above them.
func TestMarkDurableBeforeServed(t *testing.T) {
	t.Run("Blocked", func(t *testing.T) {
		store := NewInmemStore()
		mustAdd(t, store, Tag{Name: "a", Step: 10})
		release := make(chan struct{})
		marks := &hookMarks{InmemMarks: NewInmemMarks()}
		marks.RaiseFn = func(tag string, maxID int64) error {
			<-release
			return marks.InmemMarks.Raise(tag, maxID)
		}
		g, _ := startMarked(t, marksConfig(t, store, marks))
		got := make(chan error, 1)
		dst := make([]int64, 1)
		go func() { got <- g.Fill(context.Background(), "a", dst) }()
		select {
		case err := <-got:
			t.Fatalf("Fill returned %v, %v while the mark was not yet recorded", err, dst)
		case <-time.After(100 * time.Millisecond):
		}
		if ok, _ := g.TryFill("a", make([]int64, 1)); ok {
			t.Fatal("TryFill served while the mark was not yet recorded")
		}
		close(release)
		select {
		case err := <-got:
			if err != nil || dst[0] != 1 || marks.Mark("a") < 11 {
				t.Fatalf("Fill = %v, %v, mark %d; want ID 1 under a mark of 11 or more", err, dst, marks.Mark("a"))
			}
		case <-time.After(10 * time.Second):
			t.Fatal("Fill did not return after the mark was recorded")
		}
	})
	t.Run("Fails", func(t *testing.T) {
		store := NewInmemStore()
		mustAdd(t, store, Tag{Name: "a", Step: 10})
		var failing atomic.Bool
		failing.Store(true)
		marks := &hookMarks{InmemMarks: NewInmemMarks()}
		marks.RaiseFn = func(tag string, maxID int64) error {
			if failing.Load() {
				return errBoom
			}
			return marks.InmemMarks.Raise(tag, maxID)
		}
		cfg := marksConfig(t, store, marks)
		cfg.WaitMax = 200 * time.Millisecond
		g, _ := startMarked(t, cfg)
		err := g.Fill(context.Background(), "a", make([]int64, 1))
		if !errors.Is(err, ErrUnavailable) || !errors.Is(err, errBoom) || errors.Is(err, ErrStoreWentBack) {
			t.Fatalf("Fill with marks failing = %v, want ErrUnavailable wrapping the write error", err)
		}
		failing.Store(false)
		dst := make([]int64, 1)
		waitFor(t, "a to be served", func() bool { return g.Fill(context.Background(), "a", dst) == nil })
		if dst[0] < 11 || dst[0] >= marks.Mark("a") {
			t.Fatalf("first ID = %d with mark %d: want a later segment than the refused ones, below its mark", dst[0], marks.Mark("a"))
		}
	})
	t.Run("OnDisk", func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "segment.marks")
		store := NewInmemStore()
		mustAdd(t, store, Tag{Name: "a", Step: 7}, Tag{Name: "b", Step: 3})
		cfg := marksConfig(t, store, mustOpenMarks(t, path))
		cfg.MaxStep = 20
		g, _ := startMarked(t, cfg)
		var seen idSet
		for i := range 200 {
			tag := []string{"a", "b"}[i%2]
			seen.add(t, tag, fill(t, g, tag, 1+rand.IntN(9)))
			if onDisk := readMarks(t, path)[tag]; onDisk <= seen.max(tag) {
				t.Fatalf("after request %d the file's mark of %s is %d, but ID %d was served", i, tag, onDisk, seen.max(tag))
			}
		}
	})
}

// TestNoDuplicatesStoreRewound: many workers take IDs of several tags while the store
// is rewound again and again, to random lower values, and repaired: every ID is handed
// out once, and every error is ErrStoreWentBack.
func TestNoDuplicatesStoreRewound(t *testing.T) {
	store := newHookStore()
	const tags = 4
	for i := range tags {
		mustAdd(t, store, Tag{Name: fmt.Sprintf("t%d", i), Step: int64(3 + i)})
	}
	marks := NewInmemMarks()
	cfg := marksConfig(t, store, marks)
	cfg.RefreshInterval = 5 * time.Millisecond
	g, _ := startMarked(t, cfg)
	var seen idSet
	var refusals atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	stopWorkers := sync.OnceFunc(func() { close(stop); wg.Wait() })
	defer stopWorkers()
	for w := range 6 {
		wg.Go(func() {
			for r := 0; ; r++ {
				select {
				case <-stop:
					return
				default:
				}
				tag := fmt.Sprintf("t%d", (w+r)%tags)
				dst := make([]int64, 1+rand.IntN(8))
				var err error
				if r%2 == 0 {
					var ok bool
					if ok, err = g.TryFill(tag, dst); err == nil && ok {
						seen.add(t, tag, dst)
						continue
					}
					dst = make([]int64, len(dst))
				}
				if err == nil {
					err = g.Fill(context.Background(), tag, dst)
				}
				switch {
				case err == nil:
					seen.add(t, tag, dst)
				case errors.Is(err, ErrStoreWentBack):
					refusals.Add(1)
				default:
					t.Errorf("Fill(%s) = %v, want IDs or ErrStoreWentBack", tag, err)
					return
				}
			}
		})
	}
	for i := range 40 {
		tag := fmt.Sprintf("t%d", i%tags)
		cur, _ := store.inner.Tag(context.Background(), tag)
		store.inner.put(Tag{Name: tag, MaxID: 1 + rand.Int64N(cur.MaxID), Step: cur.Step})
		time.Sleep(2 * time.Millisecond)
		if i%2 == 1 {
			// Repair this one and the one before, to their marks (or a bit above).
			for _, name := range []string{tag, fmt.Sprintf("t%d", (i-1)%tags)} {
				to := marks.Mark(name) + rand.Int64N(3)
				cur, _ := store.inner.Tag(context.Background(), name)
				if to > cur.MaxID {
					// A Take since the read may have passed to: then the store is repaired already.
					if _, err := store.UpdateTag(context.Background(), TagUpdate{Name: name, MaxID: &to}); err != nil && !errors.Is(err, ErrInvalidTag) {
						t.Fatalf("UpdateTag: %v", err)
					}
				}
			}
		}
		time.Sleep(3 * time.Millisecond)
	}
	stopWorkers()
	st := g.Stats()
	t.Logf("stats %+v, %d refusals", st, refusals.Load())
	if st.StoreWentBack == 0 || refusals.Load() == 0 {
		t.Fatalf("the store was rewound 40 times and never refused: the test did not test")
	}
}
