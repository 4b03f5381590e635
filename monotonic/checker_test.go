package monotonic

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/leafbus/leafbus/internal/testutil"
	"github.com/nats-io/nats.go"
)

// reply is one answered request as a client saw it: sent before the request left,
// recv after the answer arrived, on the test's one clock.
type reply struct {
	sent, recv  time.Duration
	first, last int64
	n           int
	client      int
}

// recorder collects what many clients got, to check the promise afterwards.
type recorder struct {
	start time.Time

	mu      sync.Mutex
	replies []reply
	ids     []int64
	codes   map[int]int // error answers by code; 0: no answer (time-out, no responders)
	lastErr map[int]string
}

func newRecorder() *recorder {
	return &recorder{start: time.Now(), codes: map[int]int{}, lastErr: map[int]string{}}
}

func (r *recorder) since() time.Duration { return time.Since(r.start) }

// load runs clients goroutines, spread over conns, each asking for 1 to maxCount IDs of
// subject in a loop (pausing 2ms after an error) until ctx ends.
func (r *recorder) load(ctx context.Context, conns []*nats.Conn, subject string, clients, maxCount int) (wait func()) {
	var wg sync.WaitGroup
	for c := range clients {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(c), 1))
			nc := conns[c%len(conns)]
			for ctx.Err() == nil {
				count := 1
				if maxCount > 1 && rng.IntN(4) == 0 {
					count = 1 + rng.IntN(maxCount)
				}
				sent := r.since()
				ids, code, err := request(nc, subject, count, 2*time.Second)
				recv := r.since()
				if err != nil {
					r.failed(code, err)
					time.Sleep(2 * time.Millisecond)
					continue
				}
				r.add(reply{sent: sent, recv: recv, first: ids[0], last: ids[len(ids)-1], n: len(ids), client: c}, ids)
			}
		}()
	}
	return wg.Wait
}

func (r *recorder) add(rep reply, ids []int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.replies = append(r.replies, rep)
	r.ids = append(r.ids, ids...)
}

func (r *recorder) failed(code int, err error) {
	if errors.Is(err, context.Canceled) {
		return
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.codes[code]++
	r.lastErr[code] = err.Error()
}

// check fails t unless every ID is unique and every reply lies above every reply
// received before it was sent (PROTOCOL.md "Monotonic tags"). It returns the number of
// replies checked.
func (r *recorder) check(t testing.TB) (replies int) {
	t.Helper()
	dups, broken, examples := r.verify()
	if dups > 0 || broken > 0 {
		t.Fatalf("%d IDs handed out twice, %d of %d replies broke the monotonic promise; first ones:\n%s", dups, broken, len(r.replies), strings.Join(examples, "\n"))
	}
	return len(r.replies)
}

// verify counts the IDs handed out twice and the replies not above every reply received
// before they were sent (testutil's checks, which the chaos suite shares), with a few
// examples.
func (r *recorder) verify() (dups, broken int, examples []string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	twice := testutil.Duplicates(r.ids)
	for _, id := range twice[:min(len(twice), 5)] {
		examples = append(examples, fmt.Sprintf("ID %d handed out twice", id))
	}
	checked := make([]testutil.Reply, len(r.replies))
	for i, rep := range r.replies {
		checked[i] = testutil.Reply{First: rep.first, Last: rep.last, Sent: rep.sent, Recv: rep.recv}
	}
	bad := testutil.BrokenPromises(checked)
	for _, b := range bad[:min(len(bad), 5)] {
		rep := r.replies[b.Reply]
		examples = append(examples, fmt.Sprintf("reply [%d..%d] (client %d, sent %v, received %v) is not above ID %d, received before it was sent",
			rep.first, rep.last, rep.client, rep.sent, rep.recv, b.Above))
	}
	return len(twice), len(bad), examples
}

// brokenAfter checks the replies to requests sent at or after at, each against every
// reply received before it was sent (those to earlier requests too): it returns the
// ones not above all of them.
func (r *recorder) brokenAfter(at time.Duration) []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	byRecv := slices.Clone(r.replies)
	slices.SortFunc(byRecv, func(a, b reply) int { return cmp.Compare(a.recv, b.recv) })
	highest := make([]int64, len(byRecv)) // the highest ID received up to each reply, by receipt
	for i, rep := range byRecv {
		highest[i] = rep.last
		if i > 0 {
			highest[i] = max(highest[i], highest[i-1])
		}
	}
	var broken []string
	for _, rep := range r.replies {
		if rep.sent < at {
			continue
		}
		// The replies received before rep was sent.
		n, _ := slices.BinarySearchFunc(byRecv, rep.sent, func(x reply, t time.Duration) int { return cmp.Compare(x.recv, t) })
		if n > 0 && rep.first <= highest[n-1] {
			broken = append(broken, fmt.Sprintf("[%d..%d] sent %v, not above %d", rep.first, rep.last, rep.sent, highest[n-1]))
		}
	}
	return broken
}

// summary says how many replies and errors there were, for the test log.
func (r *recorder) summary() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var b strings.Builder
	fmt.Fprintf(&b, "%d replies, %d IDs", len(r.replies), len(r.ids))
	for code, n := range r.codes {
		fmt.Fprintf(&b, "; %d errors of code %d (last: %s)", n, code, r.lastErr[code])
	}
	return b.String()
}

// errorsOf returns how many answers had code.
func (r *recorder) errorsOf(code int) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.codes[code]
}

// answeredAfter is when the first request sent at or after at was answered with IDs:
// at plus the time the tag was unavailable after a fault at at.
// waitAnswers waits until n requests sent at or after at were answered with IDs, and
// fails t when that takes longer than within: a test goes on once the dispensers have
// served, not after a fixed time that a busy machine could make too short.
func (r *recorder) waitAnswers(t testing.TB, at time.Duration, n int, within time.Duration) {
	t.Helper()
	testutil.Eventually(t, within, fmt.Sprintf("%d answers to requests sent after %v", n, at), func() bool {
		r.mu.Lock()
		defer r.mu.Unlock()
		got := 0
		for _, rep := range r.replies {
			if rep.sent >= at {
				got++
			}
		}
		return got >= n
	})
}

func (r *recorder) answeredAfter(at time.Duration) (time.Duration, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	first, ok := time.Duration(0), false
	for _, rep := range r.replies {
		if rep.sent >= at && (!ok || rep.recv < first) {
			first, ok = rep.recv, true
		}
	}
	return first, ok
}

// longestGap is the longest time from at on without an answer with IDs: between two
// answers received after at, or from at to the first.
func (r *recorder) longestGap(at time.Duration) time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	var recvs []time.Duration
	for _, rep := range r.replies {
		if rep.recv >= at {
			recvs = append(recvs, rep.recv)
		}
	}
	slices.Sort(recvs)
	longest, prev := time.Duration(0), at
	for _, recv := range recvs {
		longest, prev = max(longest, recv-prev), recv
	}
	return longest
}
