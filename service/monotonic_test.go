package service

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/leafbus/leafbus/segment"
	"github.com/leafbus/leafbus/snowflake"
	"github.com/leafbus/leafbus/testenv"
	"github.com/leafbus/leafbus/wire"
)

// fakeMonotonic marks tags in memory and hands out IDs from 7000 up: from TryFill when
// inMemory, else from Fill.
type fakeMonotonic struct {
	mu       sync.Mutex
	marks    map[string]bool
	next     int64
	inMemory bool
	notReady bool
	fillErr  error // Fill's answer, when set
	fills    int
	ready    chan struct{} // Ready; nil: loaded, or stopped (a 503 at once)
}

func (f *fakeMonotonic) Ready() <-chan struct{} {
	if f.ready == nil {
		closed := make(chan struct{})
		close(closed)
		return closed
	}
	return f.ready
}

func (f *fakeMonotonic) IsMonotonic(tag string) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.notReady {
		return false, fmt.Errorf("%w: marks not loaded", wire.ErrUnavailable)
	}
	if tag == "ORDERED" {
		return false, wire.BadRequest("differs only in case from %q", "ordered")
	}
	return f.marks[tag], nil
}

func (f *fakeMonotonic) take(dst []int64) {
	for i := range dst {
		dst[i] = 7000 + f.next
		f.next++
	}
}

func (f *fakeMonotonic) TryFill(_ string, dst []int64) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.inMemory {
		return false, nil
	}
	f.take(dst)
	return true, nil
}

func (f *fakeMonotonic) Fill(_ context.Context, _ string, dst []int64) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.fills++
	if f.fillErr != nil {
		return f.fillErr
	}
	f.take(dst)
	return nil
}

func (f *fakeMonotonic) SetMonotonic(_ context.Context, tag string, on bool) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.marks[tag] = on
	return nil
}

func (f *fakeMonotonic) MonotonicTags(context.Context) (map[string]bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := map[string]bool{}
	for k, v := range f.marks {
		if v {
			out[k] = true
		}
	}
	return out, nil
}

// everyBatch has a ready batch (IDs 1..n) for any request.
type everyBatch struct{}

func (everyBatch) Take(_ wire.Kind, _ string, n int, enc wire.Encoding) ([]byte, bool) {
	ids := make([]int64, n)
	for i := range ids {
		ids[i] = int64(i + 1)
	}
	return wire.AppendIDs(nil, ids, enc), true
}

// fixedSegments hands out 100, 101, ... for any tag, in memory.
type fixedSegments struct{}

func (fixedSegments) TryFill(_ string, dst []int64) (bool, error) {
	for i := range dst {
		dst[i] = int64(100 + i)
	}
	return true, nil
}
func (s fixedSegments) Fill(_ context.Context, tag string, dst []int64) error {
	_, err := s.TryFill(tag, dst)
	return err
}

// TestMonotonicRouting: a monotonic tag is served by Monotonic only, never by a pool
// or the ordinary segments; an ordinary tag is served as before; the answer of
// IsMonotonic is the answer to every segment request while it fails. Every answer is
// observed once, those that waited for Monotonic.Fill included (success and error).
func TestMonotonicRouting(t *testing.T) {
	ns := testenv.StartNATS(t)
	mono := &fakeMonotonic{marks: map[string]bool{"ordered": true}}
	rec := &recorder{}
	sfs, err := snowflake.New(snowflake.Config{WorkerID: 1})
	if err != nil {
		t.Fatal(err)
	}
	cfg := DefaultConfig()
	cfg.Segments, cfg.Snowflakes, cfg.Batches, cfg.Monotonic = fixedSegments{}, sfs, everyBatch{}, mono
	cfg.Observer = rec
	svc, err := New(ns.Connect(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = svc.Stop() })
	nc := ns.Connect(t)
	unavailable := fmt.Errorf("%w: no leader", wire.ErrUnavailable)
	var want []observation
	for _, tt := range []struct {
		name, subject string
		inMemory      bool
		notReady      bool
		fillErr       error
		want          string // reply body, or "code N"
		observed      observation
	}{
		{"OrdinaryFromPool", "leaf.segment.orders", true, false, nil, "1\n2", observation{"nats", "segment", 200, 2}},
		{"MonotonicInMemory", "leaf.segment.ordered", true, false, nil, "7000\n7001", observation{"nats", "segment", 200, 2}},
		{"MonotonicWaits", "leaf.segment.ordered", false, false, nil, "7002\n7003", observation{"nats", "segment", 200, 2}},
		{"ErrMonotonicWaits", "leaf.segment.ordered", false, false, unavailable, "code 503", observation{"nats", "segment", 503, 0}},
		{"ErrCaseFold", "leaf.segment.ORDERED", true, false, nil, "code 400", observation{"nats", "segment", 400, 0}},
		{"ErrNotReady", "leaf.segment.orders", true, true, nil, "code 503", observation{"nats", "segment", 503, 0}},
		{"SnowflakeWhileNotReady", "leaf.snowflake.orders", true, true, nil, "snowflake", observation{"nats", "snowflake", 200, 2}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			mono.mu.Lock()
			mono.inMemory, mono.notReady, mono.fillErr = tt.inMemory, tt.notReady, tt.fillErr
			mono.mu.Unlock()
			msg, err := nc.Request(tt.subject, []byte("2"), 5*time.Second)
			if err != nil {
				t.Fatalf("request %s: %v", tt.subject, err)
			}
			got := string(msg.Data)
			if code := msg.Header.Get(wire.ServiceErrorCodeHeader); code != "" {
				got = "code " + code
			} else if tt.want == "snowflake" {
				got = "snowflake"
			}
			if got != tt.want {
				t.Fatalf("request %s = %q (%s), want %q", tt.subject, got, msg.Header.Get(wire.ServiceErrorHeader), tt.want)
			}
			// An answer off the delivery goroutine is observed just after it is sent.
			want = append(want, tt.observed)
			deadline := time.Now().Add(5 * time.Second)
			for len(rec.observations()) < len(want) && time.Now().Before(deadline) {
				time.Sleep(time.Millisecond)
			}
		})
	}
	if mono.fills != 2 {
		t.Fatalf("Monotonic.Fill called %d times, want twice (the requests not in memory)", mono.fills)
	}
	if got := rec.observations(); !slices.Equal(got, want) {
		t.Errorf("observed\n%v\nwant\n%v", got, want)
	}
}

// TestMonotonicWaitsForMarks: segment requests that come while the marks load (a
// dispenser just started) wait for them, off the delivery goroutine, and are answered
// once they are in: from Monotonic for a monotonic tag, from the buffers for the
// others; each answer observed once.
func TestMonotonicWaitsForMarks(t *testing.T) {
	ns := testenv.StartNATS(t)
	mono := &fakeMonotonic{marks: map[string]bool{"ordered": true}, notReady: true, ready: make(chan struct{})}
	rec := &recorder{}
	cfg := DefaultConfig()
	cfg.Segments, cfg.Batches, cfg.Monotonic, cfg.Observer = fixedSegments{}, everyBatch{}, mono, rec
	svc, err := New(ns.Connect(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = svc.Stop() })
	nc := ns.Connect(t)
	type answer struct {
		body string
		err  error
	}
	answers := map[string]chan answer{"leaf.segment.orders": make(chan answer, 1), "leaf.segment.ordered": make(chan answer, 1)}
	for subject, ch := range answers {
		go func() {
			msg, err := nc.Request(subject, []byte("2"), 5*time.Second)
			if err == nil && msg.Header.Get(wire.ServiceErrorCodeHeader) != "" {
				err = fmt.Errorf("code %s: %s", msg.Header.Get(wire.ServiceErrorCodeHeader), msg.Header.Get(wire.ServiceErrorHeader))
			}
			if err != nil {
				ch <- answer{err: err}
				return
			}
			ch <- answer{body: string(msg.Data)}
		}()
	}
	time.Sleep(100 * time.Millisecond) // the requests arrive and wait
	mono.mu.Lock()
	mono.notReady = false
	close(mono.ready)
	mono.mu.Unlock()
	for subject, want := range map[string]string{"leaf.segment.orders": "100\n101", "leaf.segment.ordered": "7000\n7001"} {
		select {
		case a := <-answers[subject]:
			if a.err != nil || a.body != want {
				t.Errorf("request %s while the marks load = %q, %v; want %q once they are in", subject, a.body, a.err, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("request %s: no answer within 10s", subject)
		}
	}
	want := []observation{{"nats", "segment", 200, 2}, {"nats", "segment", 200, 2}}
	deadline := time.Now().Add(5 * time.Second)
	for len(rec.observations()) < len(want) && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if got := rec.observations(); !slices.Equal(got, want) {
		t.Errorf("observed\n%v\nwant\n%v", got, want)
	}
}

// TestMonotonicAdmin: add, update and list carry the mark; an update may change only
// the mark; a dispenser without monotonic tags refuses to set it.
func TestMonotonicAdmin(t *testing.T) {
	ctx := context.Background()
	store := segment.NewInmemStore()
	mono := &fakeMonotonic{marks: map[string]bool{"stale": true}}
	s := &Service{cfg: Config{Tags: store, Monotonic: mono}, logger: slog.New(slog.DiscardHandler)}
	off := &Service{cfg: Config{Tags: store}, logger: slog.New(slog.DiscardHandler)}
	for _, tt := range []struct {
		name    string
		svc     *Service
		call    func(*Service, context.Context, []byte) (any, error)
		body    string
		want    bool // the reply's monotonic
		wantErr int
	}{
		{"AddOK", s, (*Service).addTag, `{"tag":"ordered","step":10,"monotonic":true}`, true, 0},
		{"AddStaleMarkCleared", s, (*Service).addTag, `{"tag":"stale","step":10}`, false, 0},
		{"AddErrOff", off, (*Service).addTag, `{"tag":"x","step":10,"monotonic":true}`, false, 503},
		{"AddOffFalseOK", off, (*Service).addTag, `{"tag":"y","step":10,"monotonic":false}`, false, 0},
		{"UpdateOnlyMark", s, (*Service).updateTag, `{"tag":"stale","monotonic":true}`, true, 0},
		{"UpdateStepKeepsMark", s, (*Service).updateTag, `{"tag":"stale","step":20}`, true, 0},
		{"UpdateClears", s, (*Service).updateTag, `{"tag":"ordered","monotonic":false}`, false, 0},
		{"UpdateErrMissing", s, (*Service).updateTag, `{"tag":"nope","monotonic":true}`, false, 404},
		{"UpdateErrOff", off, (*Service).updateTag, `{"tag":"stale","monotonic":true}`, false, 503},
	} {
		t.Run(tt.name, func(t *testing.T) {
			v, err := tt.call(tt.svc, ctx, []byte(tt.body))
			if code := codeOrZero(err); code != tt.wantErr {
				t.Fatalf("%s = %v, %v; want code %d", tt.body, v, err, tt.wantErr)
			}
			if err == nil && v.(wire.TagInfo).Monotonic != tt.want {
				t.Fatalf("%s = %+v, want monotonic %v", tt.body, v, tt.want)
			}
		})
	}
	v, err := s.listTags(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, info := range v.([]wire.TagInfo) {
		got[info.Tag] = info.Monotonic
	}
	if want := map[string]bool{"ordered": false, "stale": true, "y": false}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("list = %v, want %v", got, want)
	}
	if mono.marks["nope"] {
		t.Fatal("the update of a missing tag wrote its mark")
	}
}

func codeOrZero(err error) int {
	if err == nil {
		return 0
	}
	code, _ := CodeOf(err)
	return code
}
