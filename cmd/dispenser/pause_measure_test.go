package main

// A measurement, not a test: what a client that does not hedge (a plain nc.Request loop
// with a 1 s timeout) loses while one of two dispensers is stopped by SIGSTOP, with the
// NATS server's default liveness settings and with the ones the embedded server and
// deploy/nats.conf use (bus.ApplyLiveness). It runs only when asked:
//
//	LEAFBUS_MEASURE_PAUSE=8 go test -count=1 -v -timeout 10m -run TestMeasurePausedDispenser ./cmd/dispenser/
//
// BENCHMARKS.md ("Paused dispensers found by the server") has its figures.

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/leafbus/leafbus/bus"
)

// The measurement's shape: requests for warm before the stop, the stop, and after it
// until the end; LEAFBUS_MEASURE_PAUSE is the number of plain request loops on one
// connection (1 when not a number); LEAFBUS_MEASURE_KIND=segment asks for segment IDs;
// LEAFBUS_MEASURE_LOGS=1 prints the stopped dispenser's log.
const (
	pauseWarm    = 5 * time.Second
	pauseStop    = 20 * time.Second
	pauseAfter   = 10 * time.Second
	pauseTimeout = time.Second
)

func TestMeasurePausedDispenser(t *testing.T) {
	if os.Getenv("LEAFBUS_MEASURE_PAUSE") == "" {
		t.Skip("a measurement: set LEAFBUS_MEASURE_PAUSE=1 to run it (BENCHMARKS.md)")
	}
	for _, mode := range []struct {
		name     string
		liveness bool
	}{{"nats-server defaults (ping 2m x 2, write deadline 10s)", false}, {"leafbus settings (ping 2s x 2, write deadline 2s)", true}} {
		t.Run(strings.Fields(mode.name)[0], func(t *testing.T) {
			r := measurePause(t, mode.liveness)
			t.Logf("%s: %s", mode.name, r)
		})
	}
}

// pauseResult is what the loops saw.
type pauseResult struct {
	ok, timeouts, errs          int           // before, during and after the stop
	stopTimeouts, afterTimeouts int           // timeouts of requests sent during the stop, and after it
	lastTimeout                 time.Duration // the send time of the last request that timed out during the stop, from the SIGSTOP
	dropped                     time.Duration // when the server had dropped the stopped dispenser's connections, from the SIGSTOP; 0 if it had not by SIGCONT
	bySecond                    map[int]int   // timeouts by the second (from the SIGSTOP) their request was sent in
}

func (r pauseResult) String() string {
	dropped := "not within the stop"
	if r.dropped > 0 {
		dropped = r.dropped.Round(100 * time.Millisecond).String()
	}
	return fmt.Sprintf("%d answered, %d timeouts (%d of requests sent during the %v stop, %d after it), %d other errors; last timed-out request of the stop sent %v after SIGSTOP; server dropped the stopped dispenser after %s; timeouts by second of sending from SIGSTOP: %v",
		r.ok, r.timeouts, r.stopTimeouts, pauseStop, r.afterTimeouts, r.errs, r.lastTimeout.Round(100*time.Millisecond), dropped, r.bySecond)
}

func measurePause(t *testing.T, liveness bool) pauseResult {
	opts := &server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, JetStream: true, StoreDir: t.TempDir(), NoSigs: true}
	if liveness {
		bus.ApplyLiveness(opts)
	}
	srv, err := server.NewServer(opts)
	if err != nil {
		t.Fatal(err)
	}
	go srv.Start()
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server not ready")
	}
	t.Cleanup(srv.Shutdown)
	url := srv.ClientURL()

	var procs []*process
	for _, name := range []string{"p1", "p2"} {
		procs = append(procs, startProcess(t, "--nats", url, "--data-dir", t.TempDir(), "--node-id", name, "--http", ""))
	}
	stopped := procs[1]
	stoppedConns := func() int {
		cz, err := srv.Connz(&server.ConnzOptions{})
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, c := range cz.Conns {
			// The dispenser names its connections after its node ID ("leafbus p2",
			// "leafbus service p2").
			if strings.HasSuffix(c.Name, " p2") {
				n++
			}
		}
		return n
	}
	if stoppedConns() == 0 {
		t.Fatalf("no connection of p2 found by name on the server")
	}

	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()

	var (
		mu  sync.Mutex
		r   = pauseResult{bySecond: map[int]int{}}
		wg  sync.WaitGroup
		end = time.Now().Add(pauseWarm + pauseStop + pauseAfter)
	)
	stopAt := time.Now().Add(pauseWarm)
	contAt := stopAt.Add(pauseStop)
	loops, err := strconv.Atoi(os.Getenv("LEAFBUS_MEASURE_PAUSE"))
	if err != nil || loops < 1 {
		loops = 1
	}
	// LEAFBUS_MEASURE_KIND=segment asks the sample tag's segment IDs instead.
	subject := "leaf.snowflake.pause"
	if os.Getenv("LEAFBUS_MEASURE_KIND") == "segment" {
		subject = "leaf.segment.leaf-segment-test"
	}
	t.Logf("%d request loops on %s", loops, subject)
	for range loops {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for time.Now().Before(end) {
				sent := time.Now()
				_, err := nc.Request(subject, nil, pauseTimeout)
				mu.Lock()
				switch {
				case err == nil:
					r.ok++
				case errors.Is(err, nats.ErrTimeout):
					r.timeouts++
					r.bySecond[int(sent.Sub(stopAt).Seconds())]++
					if sent.After(stopAt) && sent.Before(contAt) {
						r.stopTimeouts++
						r.lastTimeout = max(r.lastTimeout, sent.Sub(stopAt))
					} else if !sent.Before(contAt) {
						r.afterTimeouts++
					}
				default:
					r.errs++
				}
				mu.Unlock()
			}
		}()
	}
	time.Sleep(time.Until(stopAt))
	if err := syscall.Kill(stopped.cmd.Process.Pid, syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	for time.Now().Before(contAt) {
		if r.dropped == 0 && stoppedConns() == 0 {
			r.dropped = time.Since(stopAt)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if err := syscall.Kill(stopped.cmd.Process.Pid, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	if os.Getenv("LEAFBUS_MEASURE_LOGS") != "" {
		t.Logf("the stopped dispenser's log:\n%s", stopped.stderr.String())
	}
	return r
}
