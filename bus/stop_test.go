package bus

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/leafbus/leafbus/core"
	"github.com/leafbus/leafbus/internal/testutil"
	"github.com/leafbus/leafbus/testenv"
	"github.com/leafbus/leafbus/wire"
)

// TestStopAnswersEveryDeliveredRequest: Stop while requests wait for a segment, and
// while more keep arriving: every request that got in is answered (IDs or a 503), none
// is left to time out, nothing races (run with -race), and Stop returns.
func TestStopAnswersEveryDeliveredRequest(t *testing.T) {
	ns := testenv.StartNATS(t)
	src := testutil.NewStalledSegments()
	coreCfg := func(c *core.Config) { c.Segments, c.WaitMax = src, 2*time.Second }
	cfg := DefaultConfig()
	cfg.Core = newCore(t, coreCfg)
	svc, err := New(ns.Connect(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	nc := ns.Connect(t)
	var wg sync.WaitGroup
	var mu sync.Mutex
	answered, unanswered := 0, 0
	ask := func(i int) {
		defer wg.Done()
		msg, err := nc.Request("leaf.segment.orders", nil, 5*time.Second)
		mu.Lock()
		defer mu.Unlock()
		switch {
		case err == nil && (len(msg.Data) > 0 || msg.Header.Get(wire.ServiceErrorCodeHeader) == "503"):
			answered++
		case errors.Is(err, nats.ErrNoResponders):
			// sent after the service had stopped: NATS says so at once
		default:
			unanswered++
			t.Logf("request %d: %v", i, err)
		}
	}
	for i := range 100 {
		wg.Add(1)
		go ask(i)
	}
	deadline := time.Now().Add(10 * time.Second)
	for svc.core.Stats(wire.Segment).Waited < 100 {
		if time.Now().After(deadline) {
			t.Fatalf("%d requests waiting, want 100", svc.core.Stats(wire.Segment).Waited)
		}
		time.Sleep(time.Millisecond)
	}
	for i := 100; i < 200; i++ { // more keep coming while the service stops
		wg.Add(1)
		go ask(i)
	}
	go func() {
		time.Sleep(20 * time.Millisecond)
		close(src.Release)
	}()
	if err := svc.Stop(); err != nil {
		t.Errorf("Stop: %v", err)
	}
	wg.Wait()
	if unanswered > 0 || answered < 100 {
		t.Fatalf("%d answered, %d left unanswered: every delivered request must be answered", answered, unanswered)
	}
}
