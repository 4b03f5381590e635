package client

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// TestPermissionRefusalIsReportedAtOnce: a request the user may not publish, or whose
// inbox it may not subscribe to, fails with nats.ErrPermissionViolation at once, not
// with a timeout after the client's whole deadline; an allowed subject still works.
func TestPermissionRefusalIsReportedAtOnce(t *testing.T) {
	srv := startConnServer(t, &server.Options{Users: []*server.User{
		{Username: "app", Password: "pw", Permissions: &server.Permissions{
			Publish:   &server.SubjectPermission{Allow: []string{"leaf.segment.>"}},
			Subscribe: &server.SubjectPermission{Allow: []string{"_INBOX.>"}},
		}},
		{Username: "noinbox", Password: "pw", Permissions: &server.Permissions{
			Publish:   &server.SubjectPermission{Allow: []string{"leaf.>"}},
			Subscribe: &server.SubjectPermission{Deny: []string{">"}},
		}},
		{Username: "dispenser", Password: "pw"},
	}})
	connect := func(user string) *nats.Conn {
		nc, err := nats.Connect(serverURL(srv), nats.UserInfo(user, "pw"), nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))
		if err != nil {
			t.Fatalf("connect as %s: %v", user, err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
	// A stand-in dispenser answering every subject, so that only permissions can fail.
	resp := connect("dispenser")
	if _, err := resp.Subscribe("leaf.>", func(m *nats.Msg) { _ = m.Respond([]byte("7")) }); err != nil {
		t.Fatal(err)
	}
	if err := resp.Flush(); err != nil {
		t.Fatal(err)
	}
	const timeout = 20 * time.Second // long: a refusal reported as a timeout would show
	for _, tt := range []struct {
		name, user string
		call       func(*Client) error
	}{
		{"AdminNotAllowed", "app", func(c *Client) error { _, err := c.Tags(context.Background()); return err }},
		{"DecodeNotAllowed", "app", func(c *Client) error { _, err := c.Decode(context.Background(), 1); return err }},
		{"InboxNotAllowed", "noinbox", func(c *Client) error { _, err := c.Segment(context.Background(), "orders"); return err }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c, err := NewClient(connect(tt.user), WithTimeout(timeout), WithEncoding(0))
			if err != nil {
				t.Fatal(err)
			}
			start := time.Now()
			err = tt.call(c)
			if !errors.Is(err, nats.ErrPermissionViolation) {
				t.Fatalf("got %v after %v, want nats.ErrPermissionViolation", err, time.Since(start))
			}
			t.Logf("refused in %v: %v", time.Since(start), err)
		})
	}
	c, err := NewClient(connect("app"), WithTimeout(timeout), WithEncoding(0))
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 { // the first goes the checked way, the others the shared inbox
		if id, err := c.Segment(context.Background(), "orders"); err != nil || id != 7 {
			t.Fatalf("Segment #%d as an allowed user = %d, %v; want 7", i, id, err)
		}
	}
}
