package client_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/leafbus/leafbus/client"
	"github.com/leafbus/leafbus/testenv"
)

// responder answers every request on subject with n answers, the i-th made by answer.
func responder(t *testing.T, nc *nats.Conn, subject string, n int, answer func(i int) []byte) {
	t.Helper()
	sub, err := nc.Subscribe(subject, func(m *nats.Msg) {
		for i := range n {
			_ = nc.Publish(m.Reply, answer(i))
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sub.Unsubscribe() })
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
}

// askAll runs a.Do on subject, bounded by a test deadline.
func askAll(t *testing.T, nc *nats.Conn, a client.AskAll, subject string) (client.Answers, error, time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	start := time.Now()
	got, err := a.Do(ctx, nc, nats.NewMsg(subject))
	return got, err, time.Since(start)
}

func TestAskAll(t *testing.T) {
	ns := testenv.StartNATS(t)
	nc := ns.Connect(t, nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {})) // the flood's slow consumer: counted in Lost
	// Three dispensers answering once each.
	for i := range 3 {
		responder(t, ns.Connect(t), "leaf.time", 1, func(int) []byte { return []byte(fmt.Sprint(i)) })
	}
	// A rogue answering 5,000 times, once with 20 KB.
	responder(t, ns.Connect(t), "rogue.flood", 5000, func(i int) []byte {
		if i == 0 {
			return []byte(strings.Repeat("x", 20<<10))
		}
		return []byte("fake")
	})
	// A rogue's 2,000 answers, then a dispenser's, on one connection: in that order.
	responder(t, ns.Connect(t), "leaf.flooded", 2001, func(i int) []byte {
		if i == 2000 {
			return []byte("dispenser")
		}
		return []byte("fake")
	})
	// The asker's own answer at once, a peer's 300 ms later (a busy machine).
	self, late := ns.Connect(t), ns.Connect(t)
	responder(t, self, "leaf.late", 1, func(int) []byte { return []byte("self") })
	lateSub, err := late.Subscribe("leaf.late", func(m *nats.Msg) {
		time.AfterFunc(300*time.Millisecond, func() { _ = late.Publish(m.Reply, []byte("peer")) })
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lateSub.Unsubscribe() })
	if err := late.Flush(); err != nil {
		t.Fatal(err)
	}
	// Answers that never stop coming.
	stream := ns.Connect(t)
	sub, err := stream.Subscribe("rogue.stream", func(m *nats.Msg) {
		go func() {
			for i := 0; i < 10_000; i++ {
				if stream.Publish(m.Reply, []byte("again")) != nil {
					return
				}
				time.Sleep(time.Millisecond)
			}
		}()
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sub.Unsubscribe() })
	if err := stream.Flush(); err != nil {
		t.Fatal(err)
	}

	t.Run("OK/three answers, ended by the quiet time", func(t *testing.T) {
		got, err, took := askAll(t, nc, client.AskAll{Prefix: "leaf", Window: 20 * time.Second, Quiet: 100 * time.Millisecond}, "leaf.time")
		if err != nil || len(got.Msgs) != 3 || got.More || got.Dropped() != 0 {
			t.Fatalf("Do = %d answers, more %v, dropped %d, %v; want 3, none more or dropped, nil", len(got.Msgs), got.More, got.Dropped(), err)
		}
		if took >= 10*time.Second {
			t.Errorf("Do took %v: the quiet time did not end it before the 20s window", took)
		}
	})
	t.Run("OK/no responders", func(t *testing.T) {
		got, err, took := askAll(t, nc, client.AskAll{Prefix: "leaf", Window: 20 * time.Second}, "nobody.here")
		if err != nil || len(got.Msgs) != 0 {
			t.Fatalf("Do = %d answers, %v; want none and nil", len(got.Msgs), err)
		}
		if took >= 10*time.Second {
			t.Errorf("Do took %v: the no-responders status did not end it", took)
		}
	})
	t.Run("Bounded/answers kept and bytes per answer", func(t *testing.T) {
		got, err, _ := askAll(t, nc, client.AskAll{Prefix: "leaf", MaxAnswers: 100, MaxBytes: 1 << 10}, "rogue.flood")
		if err != nil || len(got.Msgs) != 100 || !got.More || got.TooLong != 1 {
			t.Fatalf("Do = %d answers, more %v, too long %d, %v; want 100, more, 1 too long, nil", len(got.Msgs), got.More, got.TooLong, err)
		}
		t.Logf("of 5,000 answers: 100 kept, 1 too long, %d dropped by the subscription's pending limit", got.Lost)
	})
	t.Run("OK/answers Keep refuses do not count towards MaxAnswers", func(t *testing.T) {
		keep := func(m *nats.Msg) bool { return string(m.Data) == "dispenser" }
		got, err, _ := askAll(t, nc, client.AskAll{Prefix: "leaf", MaxAnswers: 100, Keep: keep}, "leaf.flooded")
		if err != nil || len(got.Msgs) != 1 || string(got.Msgs[0].Data) != "dispenser" || got.More || got.Skipped+got.Lost != 2000 {
			t.Fatalf("Do = %d answers, more %v, skipped %d, lost %d, %v; want the dispenser's alone, 2,000 skipped or lost, nil",
				len(got.Msgs), got.More, got.Skipped, got.Lost, err)
		}
	})
	t.Run("OK/an answer Keep refuses does not start the quiet time", func(t *testing.T) {
		keep := func(m *nats.Msg) bool { return string(m.Data) != "self" }
		got, err, _ := askAll(t, nc, client.AskAll{Prefix: "leaf", Window: 20 * time.Second, Quiet: 100 * time.Millisecond, Keep: keep}, "leaf.late")
		if err != nil || len(got.Msgs) != 1 || string(got.Msgs[0].Data) != "peer" || got.Skipped != 1 {
			t.Fatalf("Do = %d answers, skipped %d, %v; want the peer's, 300ms after the refused one, kept", len(got.Msgs), got.Skipped, err)
		}
	})
	t.Run("OK/the asker's own answer, kept, does not start the quiet time", func(t *testing.T) {
		own := func(m *nats.Msg) bool { return string(m.Data) == "self" }
		got, err, _ := askAll(t, nc, client.AskAll{Prefix: "leaf", Window: 20 * time.Second, Quiet: 100 * time.Millisecond, Own: own}, "leaf.late")
		if err != nil || len(got.Msgs) != 2 || string(got.Msgs[0].Data) != "self" || string(got.Msgs[1].Data) != "peer" {
			t.Fatalf("Do = %d answers, %v; want its own and the peer's, 300ms later", len(got.Msgs), err)
		}
	})
	t.Run("Bounded/window", func(t *testing.T) {
		got, err, took := askAll(t, nc, client.AskAll{Prefix: "leaf", Window: 300 * time.Millisecond, Quiet: 200 * time.Millisecond}, "rogue.stream")
		if err != nil || len(got.Msgs) == 0 {
			t.Fatalf("Do = %d answers, %v; want some and nil", len(got.Msgs), err)
		}
		if took >= 10*time.Second {
			t.Errorf("Do took %v under a never-ending stream, want the 300ms window", took)
		}
	})
	t.Run("Error/context ended", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if _, err := (client.AskAll{Prefix: "leaf"}).Do(ctx, nc, nats.NewMsg("leaf.time")); !errors.Is(err, context.Canceled) {
			t.Fatalf("Do with an ended context = %v, want context.Canceled", err)
		}
	})
	t.Run("Error/inbox the dispensers do not answer", func(t *testing.T) {
		under := ns.Connect(t, nats.CustomInboxPrefix("leaf.inbox"))
		_, err, _ := askAll(t, under, client.AskAll{Prefix: "leaf"}, "leaf.time")
		if err == nil || !strings.Contains(err.Error(), "not a subject the dispensers of prefix \"leaf\" answer to") {
			t.Fatalf("Do with inboxes under the prefix = %v, want the reply rule named", err)
		}
	})
	t.Run("Error/bad bounds", func(t *testing.T) {
		_, err, _ := askAll(t, nc, client.AskAll{Prefix: "leaf", MaxAnswers: -1}, "leaf.time")
		if err == nil || !strings.Contains(err.Error(), "MaxAnswers -1") {
			t.Fatalf("Do with MaxAnswers -1 = %v, want it named", err)
		}
	})
}

// TestAskAllRefused: a subject the user may not publish to fails at once with
// nats.ErrPermissionViolation, not after the window.
func TestAskAllRefused(t *testing.T) {
	srv, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, NoLog: true, NoSigs: true,
		Users: []*server.User{{Username: "app", Password: "pw", Permissions: &server.Permissions{
			Publish: &server.SubjectPermission{Deny: []string{"$SRV.>"}},
		}}}})
	if err != nil {
		t.Fatal(err)
	}
	go srv.Start()
	t.Cleanup(srv.Shutdown)
	if !srv.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats-server not ready within 10s")
	}
	nc, err := nats.Connect("nats://"+srv.Addr().String(), nats.UserInfo("app", "pw"), nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	got, err, took := askAll(t, nc, client.AskAll{Prefix: "leaf", Window: 20 * time.Second}, "$SRV.INFO.leaf")
	if !errors.Is(err, nats.ErrPermissionViolation) || len(got.Msgs) != 0 {
		t.Fatalf("Do on a refused subject = %d answers, %v; want nats.ErrPermissionViolation", len(got.Msgs), err)
	}
	if took >= 10*time.Second {
		t.Errorf("the refusal took %v, want it at once", took)
	}
}
