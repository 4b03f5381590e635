package testenv

import (
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

// TestProxy: requests pass a running proxy, wait while it is paused and are answered
// on Resume, and a killed proxy drops the connection and refuses it again.
func TestProxy(t *testing.T) {
	n := StartNATS(t)
	responder := n.Connect(t)
	if _, err := responder.Subscribe("echo", func(m *nats.Msg) { _ = m.Respond(m.Data) }); err != nil {
		t.Fatal(err)
	}
	if err := responder.Flush(); err != nil {
		t.Fatal(err)
	}
	p := StartProxy(t, n.Server().Addr().String())
	disconnected := make(chan struct{}, 1)
	nc := connect(t, p.URL(), nats.DisconnectErrHandler(func(*nats.Conn, error) {
		select {
		case disconnected <- struct{}{}:
		default:
		}
	}))
	if _, err := nc.Request("echo", []byte("a"), 2*time.Second); err != nil {
		t.Fatalf("request through the proxy: %v", err)
	}

	p.Pause()
	if _, err := nc.Request("echo", []byte("b"), 200*time.Millisecond); !errors.Is(err, nats.ErrTimeout) {
		t.Fatalf("request while paused = %v, want a time-out", err)
	}
	answered := make(chan error, 1)
	go func() {
		_, err := nc.Request("echo", []byte("c"), 5*time.Second)
		answered <- err
	}()
	select { // the request is held: no answer while paused
	case err := <-answered:
		t.Fatalf("request answered while paused: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	p.Resume()
	select {
	case err := <-answered:
		if err != nil {
			t.Fatalf("request held by the pause = %v, want an answer after Resume", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("request held by the pause not answered within 5s of Resume")
	}

	p.Kill()
	select {
	case <-disconnected:
	case <-time.After(5 * time.Second):
		t.Fatal("connection not dropped within 5s of Kill")
	}
	time.Sleep(200 * time.Millisecond) // reconnect attempts come and are refused
	if nc.IsConnected() {
		t.Fatal("connected again through a killed proxy")
	}
}
