package workerid

import (
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/leafbus/leafbus/internal/testutil"
	"github.com/leafbus/leafbus/snowflake"
)

// issueBound is the issue's promise (issue 12): a lease changed under its holder stops
// the holder within 100 ms.
const issueBound = 100 * time.Millisecond

// refusalWait bounds every wait for a refusal, generously: a hang fails the test instead
// of stalling it, while the measured latency is what is compared with issueBound.
const refusalWait = 5 * time.Second

// watchedHolder is a holder of a real lease: a real snowflake generator driven by a
// heartbeat that runs, and so watches the lease when it can.
type watchedHolder struct {
	gen  *snowflake.Generator
	hb   *Heartbeat
	stop func() error    // ends the heartbeat's Run and returns its error
	done <-chan struct{} // closed when Run returned
}

// startWatchedHolder starts a holder of lease, issuing once its first beat is recorded,
// with the heartbeat's configuration changed by edits.
func startWatchedHolder(tb testing.TB, lease Lease, edits ...func(*HeartbeatConfig)) *watchedHolder {
	tb.Helper()
	gen, err := snowflake.New(snowflake.Config{WorkerID: lease.WorkerID(), BorrowMax: DefaultBorrowMax})
	must(tb, "snowflake.New", err)
	hb := testHeartbeat(tb, heartbeatConfig(func(c *HeartbeatConfig) {
		c.NodeID, c.Lease, c.Generator = "holder", lease, gen
		for _, edit := range edits {
			edit(c)
		}
	}))
	must(tb, "first Beat", hb.Beat(testutil.Context(tb, 10*time.Second)))
	if _, err := gen.Next(); err != nil {
		tb.Fatalf("Next after the first beat: %v", err)
	}
	stop, done := runHeartbeat(tb, hb)
	return &watchedHolder{gen: gen, hb: hb, stop: stop, done: done}
}

// refusalAfter makes change (the lease changing under the holder) while two goroutines
// issue IDs from gen, and waits until gen refuses with an error wrapping want, failing
// tb after refusalWait. change returns when the change took effect, as exactly as the
// test can tell (a server's timestamp, else the time before the call). It returns the
// latency from then to the first refusal, logs it and compares it with issueBound. It
// also checks what matters for uniqueness: no call that started after a refused call
// returned issued an ID, and gen goes on refusing.
//
// The issuing loops pause briefly every 64 calls: spinning on the machine's 2 cores
// would starve the servers whose notice is being measured.
func refusalAfter(tb testing.TB, gen *snowflake.Generator, want error, change func() time.Time) time.Duration {
	tb.Helper()
	type issued struct {
		n             int
		lastOKStart   time.Time // when the last call that issued an ID started
		refusedEnd    time.Time // when the first refused call returned
		refusal       error
		okAfterRefuse int // IDs issued after this goroutine's own first refusal
	}
	var stopIssuing atomic.Bool
	refusedOnce := make(chan struct{}, 2)
	results := make(chan issued, 2)
	for range 2 {
		go func() {
			var r issued
			for i := 0; !stopIssuing.Load(); i++ {
				start := time.Now()
				_, err := gen.Next()
				switch {
				case err != nil && r.refusal == nil:
					r.refusedEnd, r.refusal = time.Now(), err
					refusedOnce <- struct{}{}
				case err != nil:
				case r.refusal != nil:
					r.okAfterRefuse++
				default:
					r.n++
					r.lastOKStart = start
				}
				if i%64 == 0 {
					time.Sleep(50 * time.Microsecond)
				}
			}
			results <- r
		}()
	}

	begun := time.Now()
	effective := change()
	deadline := time.After(refusalWait)
	for range 2 { // both goroutines refused
		select {
		case <-refusedOnce:
		case <-deadline:
			stopIssuing.Store(true)
			tb.Fatalf("the holder still issues %s after the lease changed", refusalWait)
		}
	}
	for i := range 100 {
		if _, err := gen.Next(); !errors.Is(err, want) {
			tb.Fatalf("call %d after the refusal: error %v, want one wrapping %v", i, err, want)
		}
	}
	stopIssuing.Store(true)
	var rs []issued
	for range 2 {
		rs = append(rs, receive(tb, results, "an issuing goroutine to stop"))
	}
	var refused time.Time // the first refused call's return
	for _, r := range rs {
		if r.refusal != nil && (refused.IsZero() || r.refusedEnd.Before(refused)) {
			refused = r.refusedEnd
		}
	}
	for i, r := range rs {
		switch {
		case r.refusal == nil:
			tb.Errorf("issuing goroutine %d was never refused", i)
		case !errors.Is(r.refusal, snowflake.ErrSuspended) || !errors.Is(r.refusal, want):
			tb.Errorf("issuing goroutine %d refused with %v, want ErrSuspended wrapping %v", i, r.refusal, want)
		case r.okAfterRefuse > 0:
			tb.Errorf("issuing goroutine %d got %d IDs after its first refusal", i, r.okAfterRefuse)
		case r.lastOKStart.After(refused):
			tb.Errorf("issuing goroutine %d issued an ID in a call started %s after another call had been refused", i, r.lastOKStart.Sub(refused))
		}
	}
	latency := refused.Sub(effective)
	tb.Logf("refused %s after the change took effect (%s after the test began it); %d + %d IDs issued before",
		latency.Round(10*time.Microsecond), refused.Sub(begun).Round(10*time.Microsecond), rs[0].n, rs[1].n)
	if latency > issueBound {
		tb.Errorf("refused %s after the change took effect, over the %s of issue 12", latency, issueBound)
	}
	return latency
}

// now is a change's time when the test cannot tell better: just before it is made.
func now(change func()) func() time.Time {
	return func() time.Time {
		t := time.Now()
		change()
		return t
	}
}

// waitWatched waits until the holder's lease watch sees the lease, so that what a test
// measures is the watch and not its start.
func (h *watchedHolder) waitWatched(tb testing.TB) {
	tb.Helper()
	testutil.Eventually(tb, 10*time.Second, "the lease watch to see the lease", func() bool { return h.hb.Stats().LeaseWatched })
}

// waitRunLost waits for the holder's heartbeat Run to end with ErrLeaseLost.
func (h *watchedHolder) waitRunLost(tb testing.TB) {
	tb.Helper()
	receive(tb, h.done, "the heartbeat's Run to end")
	wantErrIs(tb, "Run", h.stop(), ErrLeaseLost)
	if st := h.hb.Stats(); !st.LeaseLost || !st.Suspended {
		tb.Fatalf("Stats() = %+v, want the lease lost and the generator suspended", st)
	}
}
