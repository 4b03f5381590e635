package chaos

import (
	"encoding/json"
	"sort"
	"strings"
	"time"

	"github.com/leafbus/leafbus/monotonic"
	"github.com/nats-io/nats.go"
)

// health is one dispenser's state as its $SRV.STATS shows it.
type health struct {
	node     string
	workerID int64
	serving  bool   // issuing snowflake IDs, every dependency connected
	why      string // what is not right when not serving
	mono     monotonic.TagStats
}

// statsReply is the part of a dispenser's $SRV.STATS answer the probe reads.
type statsReply struct {
	Metadata  map[string]string `json:"metadata"`
	Endpoints []struct {
		Name string `json:"name"`
		Data struct {
			Source struct {
				Clock struct {
					WorkerID      int64  `json:"worker_id"`
					Suspended     bool   `json:"suspended"`
					SuspendReason string `json:"suspend_reason"`
				} `json:"clock"`
				Monotonic struct {
					Ready *bool                `json:"ready"` // nil: no monotonic tags here
					Tags  []monotonic.TagStats `json:"tags"`
				} `json:"monotonic"` // the segment endpoint's
				Recovery struct {
					InFault bool   `json:"in_fault"`
					Down    string `json:"down"`
				} `json:"recovery"`
			} `json:"source"`
		} `json:"data"`
	} `json:"endpoints"`
}

// probe asks every dispenser for its $SRV.STATS and returns the answers that came
// within window, by node ID (fewer than want: some are down or not subscribed).
func (w *world) probe(want int, window time.Duration) map[string]health {
	inbox := nats.NewInbox()
	sub, err := w.nc.SubscribeSync(inbox)
	if err != nil {
		return nil
	}
	defer sub.Unsubscribe()
	if err := w.nc.PublishRequest("$SRV.STATS.leaf", inbox, nil); err != nil {
		return nil
	}
	out := map[string]health{}
	deadline := time.Now().Add(window)
	for len(out) < want {
		msg, err := sub.NextMsg(time.Until(deadline))
		if err != nil {
			break
		}
		var r statsReply
		if json.Unmarshal(msg.Data, &r) != nil {
			continue
		}
		h := health{node: r.Metadata["node_id"], serving: true}
		for _, e := range r.Endpoints {
			src := e.Data.Source
			if e.Name == "segment" {
				// Until its marks are loaded a dispenser answers segment requests late and
				// admin calls 503 (waitServing took such a node as serving, and the
				// harness's mark of the monotonic tag was refused under load).
				if r := src.Monotonic.Ready; r != nil && !*r && h.serving {
					h.serving, h.why = false, "monotonic marks not loaded"
				}
				for _, ts := range src.Monotonic.Tags {
					if ts.Tag == monoTag {
						h.mono = ts
					}
				}
			}
			if e.Name != "snowflake" {
				continue
			}
			h.workerID = src.Clock.WorkerID
			switch {
			case src.Clock.Suspended:
				h.serving, h.why = false, "suspended: "+src.Clock.SuspendReason
			case src.Recovery.InFault:
				h.serving, h.why = false, "in fault: "+src.Recovery.Down
			}
		}
		out[h.node] = h
	}
	return out
}

// waitFullService waits until all of nodes answer and serve, and returns when they did
// (ok false, and what was not right, after timeout).
func (w *world) waitFullService(nodes []string, timeout time.Duration) (at time.Time, ok bool, why string) {
	deadline := time.Now().Add(timeout)
	for {
		hs := w.probe(len(nodes), 150*time.Millisecond)
		var bad []string
		for _, n := range nodes {
			h, answered := hs[n]
			switch {
			case !answered:
				bad = append(bad, n+": no answer")
			case !h.serving:
				bad = append(bad, n+": "+h.why)
			}
		}
		if len(bad) == 0 {
			return time.Now(), true, ""
		}
		if time.Now().After(deadline) {
			sort.Strings(bad)
			return time.Now(), false, strings.Join(bad, "; ")
		}
		time.Sleep(20 * time.Millisecond)
	}
}
