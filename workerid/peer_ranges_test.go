package workerid

import (
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/leafbus/leafbus/internal/testutil"
)

func TestRangeConflict(t *testing.T) {
	mine := Range{Min: 0, Max: 511}
	withRange := func(node string, id, lo, hi int64) peer {
		return peer{nodeID: node, workerID: id, rng: Range{Min: lo, Max: hi}, hasRange: true}
	}
	tests := []struct {
		name string
		p    peer
		want string // in the reason; "" for none
	}{
		{"OK/same range", withRange("a2", 1, 0, 511), ""},
		{"OK/disjoint range", withRange("b1", 512, 512, 1023), ""},
		{"OK/older peer without range", peer{nodeID: "old", workerID: 7}, ""},
		{"OK/own node ID", withRange("a1", 0, 0, 511), ""},
		{"Conflict/overlap", withRange("c1", 256, 256, 767), "its worker IDs 256..767 overlap this node's 0..511"},
		{"Conflict/full range", withRange("d1", 3, 0, 1023), "its worker IDs 0..1023 overlap"},
		{"Conflict/same worker ID", withRange("e1", 0, 0, 511), "worker ID 0, the same as this node's"},
		{"Conflict/same worker ID, no range", peer{nodeID: "old", workerID: 0}, "worker ID 0, the same"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := rangeConflict("a1", 0, mine, tt.p)
			if tt.want == "" && got != "" || !strings.Contains(got, tt.want) {
				t.Errorf("rangeConflict(a1, 0, %s, %+v) = %q, want %q", mine, tt.p, got, tt.want)
			}
		})
	}
}

// TestLayoutConflict: a peer running another snowflake layout than this node's is a
// conflict of the periodic check; one that publishes none runs Leaf's.
func TestLayoutConflict(t *testing.T) {
	js := peer{nodeID: "js", workerID: 1, layout: "js53"}
	if got := peerConflict("a1", 0, Range{Max: 31}, "js53", js); got != "" {
		t.Errorf("a js53 peer of a js53 node: conflict %q, want none", got)
	}
	p, err := parsePeer([]byte(`{"id":"x","metadata":{"node_id":"old","worker_id":"1"}}`))
	if err != nil {
		t.Fatal(err)
	}
	if got := peerConflict("a1", 0, Range{Max: 31}, "js53", p); !strings.Contains(got, "runs the leaf snowflake layout, this node the js53 one") {
		t.Errorf("a peer without layout metadata next to a js53 node: conflict %q, want the leaf/js53 layouts named", got)
	}
	if got := peerConflict("a1", 0, Range{Max: 31}, "", js); got != "" {
		t.Errorf("with the layout comparison off: conflict %q, want none", got)
	}
}

// infoAnswer is an $SRV.INFO answer of instance with metadata.
func infoAnswer(t *testing.T, instance string, metadata map[string]string) *nats.Msg {
	t.Helper()
	b, err := json.Marshal(micro.Info{ServiceIdentity: micro.ServiceIdentity{Name: "leaf", ID: instance, Metadata: metadata}})
	if err != nil {
		t.Fatal(err)
	}
	return &nats.Msg{Data: b}
}

// TestPeerRangesCheck: a check counts the conflicting peers, skips this node's own
// answer and answers that are not $SRV.INFO, and logs one peer's conflict again only
// after WarnEvery.
func TestPeerRangesCheck(t *testing.T) {
	var logs testutil.SyncBuffer
	w := newPeerRanges(PeersConfig{Range: Range{Min: 0, Max: 511}, Self: func() string { return "me" }, WarnEvery: time.Minute},
		"a1", func() int64 { return 3 }, slog.New(slog.NewTextHandler(io.MultiWriter(&logs, testutil.LogWriter(t)), nil)))
	answers := []*nats.Msg{
		infoAnswer(t, "me", map[string]string{"node_id": "a1", "worker_id": "3", "worker_id_min": "256", "worker_id_max": "767"}),
		infoAnswer(t, "p1", map[string]string{"node_id": "a2", "worker_id": "4", "worker_id_min": "0", "worker_id_max": "511"}),
		infoAnswer(t, "p2", map[string]string{"node_id": "c1", "worker_id": "300", "worker_id_min": "256", "worker_id_max": "767"}),
		infoAnswer(t, "p3", map[string]string{"node_id": "e1", "worker_id": "3"}),
		{Data: []byte("not JSON")},
	}
	start := time.Unix(1_763_790_000, 0)
	w.check(answers, start)
	if got := w.conflicts.Load(); got != 2 {
		t.Fatalf("conflicts = %d, want 2 (p2's overlapping range, p3's worker ID)\n%s", got, logs.String())
	}
	count := func() int { return strings.Count(logs.String(), "worker-ID range conflicts") }
	if n := count(); n != 2 {
		t.Fatalf("%d warnings after the first check, want 2:\n%s", n, logs.String())
	}
	w.check(answers, start.Add(30*time.Second))
	if n := count(); n != 2 {
		t.Fatalf("%d warnings after a second check within WarnEvery, want still 2", n)
	}
	w.check(answers, start.Add(time.Minute))
	if n := count(); n != 4 {
		t.Fatalf("%d warnings after WarnEvery, want 4", n)
	}
}

// TestPeerRangesCheckRogue: 10,000 fake dispensers cost a bounded number of warning
// lines of bounded length, whatever they rotate: instances and node IDs (one reason, one
// line), or ranges (at most maxWarnReasons lines and one summing up the rest, per
// WarnEvery), and a 20 KB node ID (one in a thousand here) is cut.
func TestPeerRangesCheckRogue(t *testing.T) {
	var logs testutil.SyncBuffer
	w := newPeerRanges(PeersConfig{Range: Range{Min: 0, Max: 511}, WarnEvery: time.Minute},
		"a1", func() int64 { return 3 }, slog.New(slog.NewTextHandler(&logs, nil)))
	long := strings.Repeat("x", 20<<10)
	fakes := func(round int, rangeOf func(i int) (lo, hi int)) []*nats.Msg {
		var out []*nats.Msg
		for i := range 10_000 {
			lo, hi := rangeOf(i)
			node := fmt.Sprintf("fake-%d", i)
			if i%1000 == 0 {
				node += long
			}
			out = append(out, infoAnswer(t, fmt.Sprintf("fake%d-%d", round, i), map[string]string{
				"node_id": node, "worker_id": "9",
				"worker_id_min": fmt.Sprint(lo), "worker_id_max": fmt.Sprint(hi),
			}))
		}
		return out
	}
	mark := 0 // lines before it are from earlier steps
	lines := func() []string {
		var out []string
		for l := range strings.SplitSeq(strings.TrimSpace(logs.String()[mark:]), "\n") {
			if l != "" {
				out = append(out, l)
			}
		}
		return out
	}
	start := time.Unix(1_763_790_000, 0)
	sameRange := func(int) (int, int) { return 256, 767 }
	for round := range 3 { // new instances every check, as a rotating rogue's
		w.check(fakes(round, sameRange), start.Add(time.Duration(round)*time.Second))
	}
	if got := lines(); len(got) != 1 || w.conflicts.Load() != 10_000 {
		t.Fatalf("three checks of 10,000 rotating fakes with one conflict: %d lines, %d conflicts; want 1 line and 10,000 conflicts:\n%.2000s", len(got), w.conflicts.Load(), logs.String())
	}
	if l := lines()[0]; len(l) > 2000 || !strings.Contains(l, "peers=10000") || !strings.Contains(l, `+9995 more`) {
		t.Errorf("the line is %d bytes, want under 2,000 naming 10,000 peers, five of them:\n%.3000s", len(l), l)
	}
	mark = len(logs.String())
	w.check(fakes(9, func(i int) (int, int) { return i % 500, 600 + i%400 }), start.Add(2*time.Minute))
	if got := lines(); len(got) != maxWarnReasons+1 || !strings.Contains(got[len(got)-1], "more peer dispensers conflict") {
		t.Fatalf("10,000 fakes with their own ranges: %d lines, want %d and a summary:\n%.3000s", len(got), maxWarnReasons+1, logs.String())
	}
	mark = len(logs.String())
	w.check(fakes(10, func(i int) (int, int) { return i % 500, 600 + i%400 }), start.Add(2*time.Minute+time.Second))
	if got := lines(); len(got) != 0 {
		t.Errorf("the same again within WarnEvery: %d lines, want none:\n%.3000s", len(got), logs.String())
	}
}
