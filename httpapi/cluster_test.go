package httpapi_test

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/leafbus/leafbus/client"
	"github.com/leafbus/leafbus/httpapi"
	"github.com/leafbus/leafbus/testenv"
	"github.com/leafbus/leafbus/wire"
)

// fakeDispenser answers discovery as a dispenser does: a micro service named after
// the prefix, with metadata, and a responder on <prefix>.time naming its node.
func fakeDispenser(t *testing.T, nc *nats.Conn, meta map[string]string, node string, clock time.Time) {
	t.Helper()
	svc, err := micro.AddService(nc, micro.Config{Name: "leaf", Version: "1.4.0", Metadata: meta})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { svc.Stop() })
	defer func() {
		if err := nc.Flush(); err != nil { // the server has the subscriptions before Discover asks
			t.Fatal(err)
		}
	}()
	if node == "" {
		return
	}
	sub, err := nc.Subscribe("leaf.time", func(m *nats.Msg) {
		reply := nats.NewMsg(m.Reply)
		reply.Header.Set(wire.NodeIDHeader, node)
		reply.Data = []byte(strconv.FormatInt(clock.UnixMilli(), 10))
		m.RespondMsg(reply)
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sub.Unsubscribe() })
}

func TestDiscover(t *testing.T) {
	srv := testenv.StartNATS(t)
	nc := srv.Connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if peers, err := httpapi.Discover(nc, "leaf", "")(ctx); err != nil || len(peers) != 0 {
		t.Fatalf("Discover with no dispenser = %v, %v, want none and no error", peers, err)
	}

	t1, t2 := time.UnixMilli(1_763_792_400_123), time.UnixMilli(1_763_792_400_456)
	fakeDispenser(t, srv.Connect(t), map[string]string{"node_id": "d1", "worker_id": "3"}, "d1", t1)
	fakeDispenser(t, srv.Connect(t), map[string]string{"node_id": "d2", "worker_id": "7"}, "d2", t2)
	fakeDispenser(t, srv.Connect(t), map[string]string{"worker_id": "9"}, "", time.Time{})

	peers, err := httpapi.Discover(nc, "leaf", "")(ctx)
	if err != nil {
		t.Fatalf("Discover: %v", err)
	}
	if len(peers) != 3 {
		t.Fatalf("Discover found %d dispensers: %+v, want 3", len(peers), peers)
	}
	for i, want := range []httpapi.Peer{
		{NodeID: "d1", Version: "1.4.0", WorkerID: 3, Clock: t1},
		{NodeID: "d2", Version: "1.4.0", WorkerID: 7, Clock: t2},
	} {
		if got := peers[i]; got.NodeID != want.NodeID || got.Version != want.Version || got.WorkerID != want.WorkerID || !got.Clock.Equal(want.Clock) {
			t.Errorf("peer %d = %+v, want %+v", i, got, want)
		}
	}
	if p := peers[2]; p.WorkerID != 9 || !p.Clock.IsZero() || p.Error == "" {
		t.Errorf("a dispenser without node_id: %+v, want worker 9, no clock, and a note why", p)
	}
}

// TestDiscoverRogue: a responder that answers $SRV.INFO for 10,000 fake dispensers with
// 20 KB node IDs, and leaf.time for as many, costs discovery a bounded list with every
// text cut short, and says that answers were left out.
func TestDiscoverRogue(t *testing.T) {
	srv := testenv.StartNATS(t)
	fakeDispenser(t, srv.Connect(t), map[string]string{"node_id": "d1", "worker_id": "3"}, "d1", time.UnixMilli(1_763_792_400_123))
	rogue := srv.Connect(t, nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
	long := strings.Repeat("n", 20<<10)
	for _, subject := range []string{"$SRV.INFO.leaf", "leaf.time"} {
		sub, err := rogue.Subscribe(subject, func(m *nats.Msg) {
			for i := range 10_000 {
				reply := nats.NewMsg(m.Reply)
				node := fmt.Sprintf("fake-%05d-%s", i, long[:min(len(long), 2000)])
				if subject == "leaf.time" {
					reply.Header.Set(wire.NodeIDHeader, node)
					reply.Data = []byte("1763792400123")
				} else {
					reply.Data = fmt.Appendf(nil, `{"id":"fake%d","version":%q,"metadata":{"node_id":%q}}`, i, long[:100], node)
				}
				_ = rogue.PublishMsg(reply)
			}
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { sub.Unsubscribe() })
	}
	if err := rogue.Flush(); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	peers, err := httpapi.Discover(srv.Connect(t), "leaf", "")(ctx)
	if len(peers) == 0 || len(peers) > 2*client.DefaultAskMaxAnswers {
		t.Fatalf("Discover beside 10,000 fakes: %d peers, want some and at most %d", len(peers), 2*client.DefaultAskMaxAnswers)
	}
	for _, p := range peers {
		if len(p.NodeID) > 80 || len(p.Version) > 80 {
			t.Fatalf("a peer's node ID of %d bytes and version of %d, want them cut to 64 and quoted: %.100q", len(p.NodeID), len(p.Version), p.NodeID)
		}
	}
	if err == nil || !strings.Contains(err.Error(), "answers kept") {
		t.Errorf("Discover's error %v, want it to say answers were left out", err)
	}
	t.Logf("%d peers kept of 20,000 answers: %v", len(peers), err)
}
