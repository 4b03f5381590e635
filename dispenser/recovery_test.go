package dispenser

import (
	"encoding/json"
	"testing"
	"time"

	"github.com/leafbus/leafbus/testenv"
)

// A NATS server restart is a fault the dispenser recovers from by itself: its
// connection comes back, its lease watch sees the lease again and it serves snowflake
// IDs, and the time from the server's return to full service is in $SRV.STATS.
func TestRecoveryAfterNATSRestart(t *testing.T) {
	srv := testenv.StartNATS(t)
	cfg := testConfig(t)
	cfg.NATS = srv.URL()
	d, err := newTest(t, cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	runTest(t, d)
	srv.Stop()
	// The server comes back once the dispenser has seen it gone (not after a fixed time,
	// which a busy machine could make too short for the fault to be noticed at all).
	seen := time.Now().Add(20 * time.Second)
	for !d.recovery.Stats().InFault {
		if time.Now().After(seen) {
			t.Fatalf("the dispenser did not notice NATS going away within 20s: %+v", d.recovery.Stats())
		}
		time.Sleep(20 * time.Millisecond)
	}
	srv.Start()
	back := time.Now()
	deadline := time.Now().Add(20 * time.Second)
	for {
		st := d.recovery.Stats()
		if st.Last != nil && !st.InFault {
			t.Logf("recovered: %+v (%s after the server was started again)", *st.Last, time.Since(back).Round(time.Millisecond))
			if st.Faults != 1 || st.Last.RecoveryMs > 2000 || st.Last.What == "" {
				t.Fatalf("recovery stats %+v: want one fault, recovered within 2s", st)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no recovery 20s after NATS came back: %+v", st)
		}
		time.Sleep(50 * time.Millisecond)
	}
	nc := srv.Connect(t)
	msg, err := nc.Request("$SRV.STATS."+cfg.Prefix, nil, 5*time.Second)
	for retry := 0; err != nil && retry < 50; retry++ { // the service's own connection may still be reconnecting
		time.Sleep(100 * time.Millisecond)
		msg, err = nc.Request("$SRV.STATS."+cfg.Prefix, nil, 5*time.Second)
	}
	if err != nil {
		t.Fatalf("$SRV.STATS: %v", err)
	}
	var stats struct {
		Endpoints []struct {
			Name string `json:"name"`
			Data struct {
				Source struct {
					Recovery RecoveryStats `json:"recovery"`
				} `json:"source"`
			} `json:"data"`
		} `json:"endpoints"`
	}
	if err := json.Unmarshal(msg.Data, &stats); err != nil {
		t.Fatalf("$SRV.STATS %s: %v", msg.Data, err)
	}
	for _, e := range stats.Endpoints {
		if e.Name == "snowflake" && e.Data.Source.Recovery.Last != nil && e.Data.Source.Recovery.Faults == 1 {
			return
		}
	}
	t.Fatalf("$SRV.STATS has no recovery for the snowflake endpoint: %s", msg.Data)
}
