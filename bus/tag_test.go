package bus

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/leafbus/leafbus/core"
	"github.com/leafbus/leafbus/internal/testutil"
	"github.com/leafbus/leafbus/segment"
	"github.com/leafbus/leafbus/testenv"
	"github.com/leafbus/leafbus/wire"
)

// namedSegments serves only the tags it holds, each from its own counter, so a reply
// says which tag the service asked the core for.
type namedSegments struct{ base map[string]int64 }

func (s namedSegments) TryFill(tag string, dst []int64) (bool, error) {
	return true, s.Fill(context.Background(), tag, dst)
}

func (s namedSegments) Fill(_ context.Context, tag string, dst []int64) error {
	base, ok := s.base[tag]
	if !ok {
		return fmt.Errorf("segment: tag %q: %w", tag, segment.ErrTagNotFound)
	}
	for i := range dst {
		dst[i] = base + int64(i)
	}
	return nil
}

// TestTagTokens: the last token of an ID subject is the tag in the subject encoding
// (wire.TagToken): the service asks the core for the decoded tag, plain tokens (every
// v1 tag) are the tag itself, and a token that is not exactly one tag's encoding is a
// 400 that names the token to send.
func TestTagTokens(t *testing.T) {
	ns := testenv.StartNATS(t)
	segs := namedSegments{base: map[string]int64{
		"orders": 100, "com.acme.order": 200, "order:create": 300, "a b": 400, "订单": 500, "%41": 600,
	}}
	cfg := DefaultConfig()
	cfg.Core = newCore(t, func(c *core.Config) { c.Segments = segs })
	cfg.Logger = testutil.Logger(t)
	svc, err := New(ns.Connect(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { svc.Stop() })
	nc := ns.Connect(t)
	ask := func(subject string) (reply, code, desc string) {
		t.Helper()
		m, err := nc.Request(subject, nil, 5*time.Second)
		if err != nil {
			t.Fatalf("request %s: %v", subject, err)
		}
		return string(m.Data), m.Header.Get(wire.ServiceErrorCodeHeader), m.Header.Get(wire.ServiceErrorHeader)
	}
	for _, tt := range []struct {
		name, token, want, wantCode, wantDesc string
	}{
		{"OK/Plain", "orders", "100", "", ""},
		{"OK/Dotted", "com%2Eacme%2Eorder", "200", "", ""},
		{"OK/Colon", "order%3Acreate", "300", "", ""},
		{"OK/Space", "a%20b", "400", "", ""},
		{"OK/Chinese", "%E8%AE%A2%E5%8D%95", "500", "", ""},
		{"OK/Percent", "%2541", "600", "", ""},
		{"ErrTagNotFound", "%2Eorders", "", "404", ""},
		{"ErrRawText", "订单", "", "400", `send "%E8%AE%A2%E5%8D%95"`},
		{"ErrLowerHex", "a%2eb", "", "400", "upper-case hex"},
		{"ErrNotCanonical", "%6Frders", "", "400", "stands as it is"},
		{"ErrControl", "a%0Ab", "", "400", "control character"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			reply, code, desc := ask("leaf.segment." + tt.token)
			if reply != tt.want || code != tt.wantCode || !strings.Contains(desc, tt.wantDesc) {
				t.Errorf("leaf.segment.%s = %q, code %q (%s); want %q, code %q saying %q", tt.token, reply, code, desc, tt.want, tt.wantCode, tt.wantDesc)
			}
		})
	}
	// The subjects wire builds are these tokens: a client names the tag as it is.
	for tag, want := range map[string]string{"com.acme.order": "200", "订单": "500", "%41": "600"} {
		m, err := nc.RequestMsg(&nats.Msg{Subject: wire.Subjects{Prefix: "leaf"}.IDs(wire.Segment, tag)}, 5*time.Second)
		if err != nil || string(m.Data) != want {
			t.Errorf("IDs(%q): %v, %v; want %s", tag, m, err, want)
		}
	}
}
