package workerid

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/leafbus/leafbus/internal/testutil"
	"github.com/leafbus/leafbus/snowflake"
	"github.com/leafbus/leafbus/wire"
)

func TestTimeResponder(t *testing.T) {
	env := startJS(t)
	clock := snowflake.NewFakeClock(t0)
	r, err := NewTimeResponder(env.srv.Connect(t), "acme", "p1", clock, testutil.Logger(t))
	must(t, "NewTimeResponder", err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()

	var body string
	testutil.Eventually(t, 5*time.Second, "an answer on acme.time", func() bool {
		m, err := env.nc.Request("acme.time", nil, 200*time.Millisecond)
		if err != nil {
			return false
		}
		if got := m.Header.Get(wire.NodeIDHeader); got != "p1" {
			t.Fatalf("%s header = %q, want p1", wire.NodeIDHeader, got)
		}
		body = string(m.Data)
		return true
	})
	if body != strconv.FormatInt(t0ms, 10) {
		t.Fatalf("answer = %q, want the clock in Unix ms %d", body, t0ms)
	}

	cancel()
	select {
	case err := <-done:
		must(t, "Run", err)
	case <-time.After(5 * time.Second):
		t.Fatal("Run did not return after its context ended")
	}
	if _, err := env.nc.Request("acme.time", nil, 200*time.Millisecond); err == nil {
		t.Fatal("a stopped responder still answers")
	}
}

func TestNewTimeResponderValidates(t *testing.T) {
	env := startJS(t)
	if _, err := NewTimeResponder(nil, "leaf", "n1", nil, nil); err == nil {
		t.Fatal("NewTimeResponder without a connection succeeded")
	}
	_, err := NewTimeResponder(env.nc, "leaf", "bad id", snowflake.SystemClock(), nil)
	wantErrIs(t, "NewTimeResponder with a bad node ID", err, ErrInvalidNodeID)
	_, err = NewTimeResponder(env.nc, "", "n1", snowflake.SystemClock(), nil)
	wantErrIs(t, "NewTimeResponder without a prefix", err, ErrInvalidConfig)
	_, err = NewTimeResponder(env.nc, "leaf", "n1", nil, nil)
	wantErrIs(t, "NewTimeResponder without a clock", err, ErrInvalidConfig)
}

// TestTimeResponderAnswersInboxesOnly: an answer is a publish with the dispenser's
// rights, so a request whose reply subject is not an inbox ($KV..., the deployment's own
// subjects) is dropped, as the service's endpoints drop it.
func TestTimeResponderAnswersInboxesOnly(t *testing.T) {
	env := startJS(t)
	r, err := NewTimeResponder(env.srv.Connect(t), "acme", "p1", snowflake.NewFakeClock(t0), testutil.Logger(t))
	must(t, "NewTimeResponder", err)
	must(t, "Start", r.Start())
	t.Cleanup(r.Stop)
	for _, reply := range []string{"$KV.acme_scratch.k", "acme.not-an-inbox", "_INBOX.ok"} {
		sub, err := env.nc.SubscribeSync(reply)
		must(t, "SubscribeSync", err)
		must(t, "PublishRequest", env.nc.PublishRequest("acme.time", reply, nil))
		_, err = sub.NextMsg(300 * time.Millisecond)
		if answered := err == nil; answered != (reply == "_INBOX.ok") {
			t.Errorf("request with reply subject %s: answered %v, want %v", reply, answered, reply == "_INBOX.ok")
		}
		_ = sub.Unsubscribe()
	}
}
