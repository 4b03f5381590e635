package chaos

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/leafbus/leafbus/client"
	"github.com/leafbus/leafbus/wire"
)

// loadSpec is the steady load: per kind, workers asking for one ID at a time and
// workers asking for batches, each worker pacing itself to rate requests a second.
type loadSpec struct {
	singles, batchers int
	singleRate        float64
	batchRate         float64
	batch             int // largest batch; each batch is 1/2 to all of it
	tags              []string
}

// load runs the steady load and keeps every ID, and every failure and gap with the
// phase (the fault in progress) it fell in.
type load struct {
	spec  loadSpec
	cl    *client.Client
	phase atomic.Pointer[string]

	mu       sync.Mutex
	ids      map[string][]int64 // by kind and, for segments, tag
	requests map[string]int
	failures map[string]map[string]int // phase -> code -> count
	samples  map[string][]string       // phase -> a few failure messages
	gaps     map[string]map[wire.Kind]time.Duration
	lastOK   map[wire.Kind]time.Time

	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// startLoad starts the load through a hedging client on its own connection.
func startLoad(w *world, spec loadSpec) *load {
	w.t.Helper()
	nc := w.nats.Connect(w.t, nats.Name("chaos load"))
	cl, err := client.NewClient(nc, client.WithTimeout(5*time.Second))
	if err != nil {
		w.t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	l := &load{
		spec: spec, cl: cl, cancel: cancel,
		ids: map[string][]int64{}, requests: map[string]int{}, failures: map[string]map[string]int{},
		samples: map[string][]string{}, gaps: map[string]map[wire.Kind]time.Duration{},
		lastOK: map[wire.Kind]time.Time{wire.Segment: time.Now(), wire.Snowflake: time.Now()},
	}
	l.setPhase("steady")
	worker := 0
	for _, kind := range []wire.Kind{wire.Segment, wire.Snowflake} {
		for i := 0; i < spec.singles+spec.batchers; i++ {
			single := i < spec.singles
			rate := spec.batchRate
			if single {
				rate = spec.singleRate
			}
			l.wg.Add(1)
			go l.work(ctx, kind, single, rate, rand.New(rand.NewPCG(uint64(worker), 13)))
			worker++
		}
	}
	w.t.Cleanup(l.stop)
	return l
}

// setPhase names the fault in progress ("steady" between faults).
func (l *load) setPhase(name string) { l.phase.Store(&name) }

// stop ends the load and waits for its workers.
func (l *load) stop() {
	l.cancel()
	l.wg.Wait()
}

// work asks for IDs of kind until ctx ends, at rate requests a second.
func (l *load) work(ctx context.Context, kind wire.Kind, single bool, rate float64, rng *rand.Rand) {
	defer l.wg.Done()
	every := time.Duration(float64(time.Second) / rate)
	next := time.Now()
	buf := make([]int64, max(l.spec.batch, 1))
	for ctx.Err() == nil {
		n := 1
		if !single {
			n = l.spec.batch/2 + rng.IntN(l.spec.batch/2+1)
		}
		tag := l.spec.tags[rng.IntN(len(l.spec.tags))]
		rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		err := l.cl.Fill(rctx, kind, tag, buf[:n])
		cancel()
		if ctx.Err() != nil {
			return
		}
		l.record(kind, tag, buf[:n], err)
		if !waitTurn(ctx, &next, every) {
			return
		}
	}
}

// waitTurn waits for the next slot of a timetable of one request every every, moving
// next on to it. A client more than a second behind (a slow answer) starts afresh from
// now instead of bursting to catch up. It returns false once ctx ends.
func waitTurn(ctx context.Context, next *time.Time, every time.Duration) bool {
	*next = next.Add(every)
	if d := time.Until(*next); d > 0 {
		select {
		case <-ctx.Done():
			return false
		case <-time.After(d):
		}
	} else if d < -time.Second {
		*next = time.Now()
	}
	return true
}

// record keeps the IDs of a success, or counts a failure, in the current phase.
func (l *load) record(kind wire.Kind, tag string, ids []int64, err error) {
	phase := *l.phase.Load()
	now := time.Now()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.requests[phase]++
	if err != nil {
		code := codeOf(err)
		if l.failures[phase] == nil {
			l.failures[phase] = map[string]int{}
		}
		l.failures[phase][kind.String()+" "+code]++
		if len(l.samples[phase]) < 3 {
			l.samples[phase] = append(l.samples[phase], fmt.Sprintf("%s %s: %v", kind, tag, err))
		}
		return
	}
	key := kind.String()
	if kind == wire.Segment {
		key += "/" + tag
	}
	l.ids[key] = append(l.ids[key], ids...)
	if gap := now.Sub(l.lastOK[kind]); gap > l.gap(phase, kind) {
		if l.gaps[phase] == nil {
			l.gaps[phase] = map[wire.Kind]time.Duration{}
		}
		l.gaps[phase][kind] = gap
	}
	l.lastOK[kind] = now
}

// gap is the longest gap of kind seen in phase. l.mu is held.
func (l *load) gap(phase string, kind wire.Kind) time.Duration {
	return l.gaps[phase][kind]
}

// codeOf names a failure: the reply's code, or what went wrong on the way.
func codeOf(err error) string {
	switch {
	case wire.ClassCode(err) != 0:
		return fmt.Sprint(wire.ClassCode(err))
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, nats.ErrTimeout):
		return "timeout"
	case errors.Is(err, nats.ErrNoResponders):
		return "no-responders"
	}
	return "other"
}

// idCount is how many IDs the load got so far.
func (l *load) idCount() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, ids := range l.ids {
		n += len(ids)
	}
	return n
}

// check sorts every kind's IDs and counts those handed out more than once.
func (l *load) check() (total, duplicates int, examples []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for key, ids := range l.ids {
		slices.Sort(ids)
		total += len(ids)
		for i := 1; i < len(ids); i++ {
			if ids[i] == ids[i-1] {
				duplicates++
				if len(examples) < 5 {
					examples = append(examples, fmt.Sprintf("%s %d", key, ids[i]))
				}
			}
		}
	}
	return total, duplicates, examples
}

// failuresIn is the failures of phase by code, and a few of their messages.
func (l *load) failuresIn(phase string) (map[string]int, []string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[string]int{}
	for k, v := range l.failures[phase] {
		out[k] = v
	}
	return out, append([]string(nil), l.samples[phase]...)
}

// gapsIn is the longest gap of each kind in phase.
func (l *load) gapsIn(phase string) map[wire.Kind]time.Duration {
	l.mu.Lock()
	defer l.mu.Unlock()
	return map[wire.Kind]time.Duration{wire.Segment: l.gaps[phase][wire.Segment], wire.Snowflake: l.gaps[phase][wire.Snowflake]}
}

// requestsIn is how many requests were answered or failed in phase.
func (l *load) requestsIn(phase string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.requests[phase]
}
