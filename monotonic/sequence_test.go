package monotonic

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/leafbus/leafbus/segment"
	"github.com/leafbus/leafbus/wire"
)

func always() bool { return true }

// TestSequenceInOrder: IDs come out in order across the current segment and the one
// ahead, a take that needs all of dst takes nothing short of it, and switching to the
// segment ahead wakes the loader.
func TestSequenceInOrder(t *testing.T) {
	s := newSequence()
	dst := make([]int64, 4)
	if n, wait, err := s.take(dst, false); n != 0 || wait == nil || err != nil {
		t.Fatalf("take from an empty sequence = %d, %v, %v; want 0, a wait channel, nil", n, wait, err)
	}
	for _, r := range []segment.Range{{First: 10, End: 13}, {First: 20, End: 22}} {
		if ok, err := s.install(r, always); !ok || err != nil {
			t.Fatalf("install(%+v) = %v, %v", r, ok, err)
		}
	}
	if n, _, _ := s.take(make([]int64, 6), true); n != 0 {
		t.Fatalf("take(all) of 6 with 5 in memory took %d, want 0", n)
	}
	if n, _, err := s.take(dst, true); n != 4 || err != nil || fmt.Sprint(dst) != "[10 11 12 20]" {
		t.Fatalf("take(all) = %d, %v, %v; want 4 IDs 10 11 12 20", n, dst, err)
	}
	select {
	case <-s.wake:
	default:
		t.Fatal("switching to the segment ahead did not wake the loader")
	}
	if !s.wantsLoad() {
		t.Fatal("wantsLoad = false with nothing ahead")
	}
	n, wait, err := s.take(dst, false)
	if n != 1 || dst[0] != 21 || wait == nil || err != nil {
		t.Fatalf("take of 4 with 1 left = %d (%v), %v, %v; want 1 (21) and a wait channel", n, dst[:n], wait, err)
	}
	if ok, err := s.install(segment.Range{First: 30, End: 40}, always); !ok || err != nil {
		t.Fatalf("install: %v, %v", ok, err)
	}
	select {
	case <-wait:
	default:
		t.Fatal("install did not close the wait channel")
	}
}

// TestSequenceRefuses: a range that does not follow the last one, a range whose term
// lapsed, and anything after close are refused; a final load error is returned to a
// take that comes up short.
func TestSequenceRefuses(t *testing.T) {
	s := newSequence()
	if ok, err := s.install(segment.Range{First: 100, End: 110}, always); !ok || err != nil {
		t.Fatal(ok, err)
	}
	if ok, err := s.install(segment.Range{First: 50, End: 60}, always); ok || err == nil {
		t.Fatalf("install of a lower range = %v, %v; want refused with an error", ok, err)
	}
	if ok, err := s.install(segment.Range{First: 200, End: 210}, func() bool { return false }); ok || err != nil {
		t.Fatalf("install after the lease lapsed = %v, %v; want refused, no error", ok, err)
	}
	s.take(make([]int64, 10), false)
	s.failed(fmt.Errorf("load: %w", segment.ErrTagNotFound))
	if _, _, err := s.take(make([]int64, 1), false); !errors.Is(err, segment.ErrTagNotFound) {
		t.Fatalf("take after a final load error = %v, want ErrTagNotFound", err)
	}
	s.close()
	if _, _, err := s.take(make([]int64, 1), false); !errors.Is(err, errTermEnded) || !errors.Is(err, wire.ErrUnavailable) {
		t.Fatalf("take after close = %v, want errTermEnded (a 503)", err)
	}
	if ok, _ := s.install(segment.Range{First: 300, End: 310}, always); ok {
		t.Fatal("install after close succeeded")
	}
}

// TestTermLapseIsFinal: a term serves between serveFrom and validUntil; a renewal
// extends it only while it lives; once the clock reached validUntil nothing revives it.
func TestTermLapseIsFinal(t *testing.T) {
	tm := &term{seq: newSequence()}
	tm.serveFrom.Store(10)
	tm.validUntil.Store(100)
	for _, tt := range []struct {
		now  int64
		want bool
	}{{9, false}, {10, true}, {99, true}, {100, false}} {
		if got := tm.serving(duration(tt.now)); got != tt.want {
			t.Fatalf("serving(%d) = %v, want %v", tt.now, got, tt.want)
		}
	}
	if !tm.extend(50, 150) || tm.validUntil.Load() != 150 {
		t.Fatalf("extend(50, 150) on a live term: validUntil %d, want 150", tm.validUntil.Load())
	}
	if !tm.extend(60, 120) || tm.validUntil.Load() != 150 {
		t.Fatalf("extend to an earlier end moved validUntil to %d, want 150", tm.validUntil.Load())
	}
	if tm.extend(150, 300) || tm.serving(200) {
		t.Fatal("a renewal revived a term that lapsed")
	}
	tm.validUntil.Store(1000)
	tm.end()
	if tm.serving(500) || tm.extend(500, 2000) {
		t.Fatal("an ended term serves or extends")
	}
}

func TestParseCounts(t *testing.T) {
	for _, tt := range []struct {
		body      string
		want      int
		wantError bool
	}{
		{"1", 1, false},
		{"1 1 5", 7, false},
		{"10 10", 20, false},
		{"", 0, true},
		{"1  1", 0, true},
		{"1 ", 0, true},
		{"0", 0, true},
		{"11", 0, true},      // above maxBatch 10
		{"10 10 1", 0, true}, // above maxForward 20
		{"x", 0, true},
	} {
		got, err := parseCounts([]byte(tt.body), 10, 20)
		if (err != nil) != tt.wantError || got != tt.want {
			t.Errorf("parseCounts(%q) = %d, %v; want %d, error %v", tt.body, got, err, tt.want, tt.wantError)
		}
		if err != nil && !errors.Is(err, wire.ErrBadRequest) {
			t.Errorf("parseCounts(%q) error %v is not a 400", tt.body, err)
		}
	}
}

func TestMarkSetLookup(t *testing.T) {
	s := newMarkSet(map[string]bool{"Orders": true, "users": false})
	for _, tt := range []struct {
		tag  string
		want bool
	}{
		{"Orders", true},
		{"orders", false}, // another tag: the segment store refuses it if it is Orders' row
		{"ORDERS", false},
		{"users", false},
		{"other", false},
	} {
		if got, err := s.lookup(tt.tag); got != tt.want || err != nil {
			t.Errorf("lookup(%q) = %v, %v; want %v", tt.tag, got, err, tt.want)
		}
	}
	if n := testing.AllocsPerRun(100, func() { _, _ = s.lookup("payments") }); n != 0 {
		t.Errorf("lookup of an ordinary tag allocates %v times, want 0", n)
	}
}

func duration(n int64) time.Duration { return time.Duration(n) }

// TestForwardOnlyToInboxes: a lease record is a leader to forward to only when its
// subject is an inbox; one naming a KV key, a pool subject or a dispenser subject (a
// bucket written by hand) is not, since followers would publish there with their rights.
func TestForwardOnlyToInboxes(t *testing.T) {
	m := &Manager{subjects: wire.Subjects{Prefix: "leaf"}, instance: "me"}
	for _, tt := range []struct {
		subject string
		want    bool
	}{
		{"_INBOX.abc.def", true},
		{"_INBOX_client-a.x", true},
		{"", false},
		{"$KV.leaf_tagopts.orders", false},
		{"$JS.API.STREAM.DELETE.KV_leaf_segments", false},
		{"leaf.pool.segment.orders", false},
		{"leaf.segment.orders", false},
	} {
		h := &holder{rec: leaseRecord{Node: "other", Instance: "them", Subject: tt.subject}}
		if got := m.leaderKnown(h); got != tt.want {
			t.Errorf("leaderKnown(record subject %q) = %v, want %v", tt.subject, got, tt.want)
		}
	}
	if m.leaderKnown(&holder{rec: leaseRecord{Instance: "me", Subject: "_INBOX.x"}}) {
		t.Error("this dispenser's own record is a leader to forward to")
	}
}
