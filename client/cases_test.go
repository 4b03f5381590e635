package client_test

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/leafbus/leafbus/client"
	"github.com/leafbus/leafbus/testenv"
	"github.com/leafbus/leafbus/wire"
)

// clientCases is clients/testdata/cases.json: the table of tags, refusals and replies
// that the Go client (here) and the Node client (clients/js/test) are both tested against.
type clientCases struct {
	Tags []struct {
		Tag   string `json:"tag"`
		Token string `json:"token"`
	} `json:"tags"`
	InvalidTags []struct {
		Tag    string `json:"tag"`
		Reason string `json:"reason"`
	} `json:"invalid_tags"`
	Replies []struct {
		Name        string            `json:"name"`
		N           int               `json:"n"`
		Headers     map[string]string `json:"headers"`
		Body        string            `json:"body"`
		BodyHex     string            `json:"body_hex"`
		IDs         []string          `json:"ids"`
		Code        int               `json:"code"`
		Description string            `json:"description"`
		BadReply    bool              `json:"bad_reply"`
	} `json:"replies"`
	Decodes []struct {
		ID          string            `json:"id"`
		Reply       string            `json:"reply"`
		Headers     map[string]string `json:"headers"`
		Timestamp   int64             `json:"timestamp"`
		Time        string            `json:"time"`
		WorkerID    int64             `json:"worker_id"`
		Sequence    int64             `json:"sequence"`
		Code        int               `json:"code"`
		Description string            `json:"description"`
	} `json:"decodes"`
}

// TestSharedCases runs the shared table through the Go client: each tag's subject token
// as a responder sees it, each invalid tag's 400 and reason, and what the client makes
// of each reply (IDs, the error code and text, or a reply that breaks the protocol), and
// of each decode reply.
func TestSharedCases(t *testing.T) {
	raw, err := os.ReadFile("../clients/testdata/cases.json")
	if err != nil {
		t.Fatal(err)
	}
	var cases clientCases
	if err := json.Unmarshal(raw, &cases); err != nil {
		t.Fatal(err)
	}
	if len(cases.Tags) == 0 || len(cases.InvalidTags) == 0 || len(cases.Replies) == 0 || len(cases.Decodes) == 0 {
		t.Fatal("cases.json has an empty section")
	}

	ns := testenv.StartNATS(t)
	responder := ns.Connect(t)
	replies := map[string]int{} // token of case-<name> -> index in cases.Replies
	for i, r := range cases.Replies {
		replies[wire.TagToken("case-"+r.Name)] = i
	}
	var mu sync.Mutex
	var lastToken string
	const prefix = "conf"
	if _, err := responder.Subscribe(prefix+".segment.*", func(m *nats.Msg) {
		token := strings.TrimPrefix(m.Subject, prefix+".segment.")
		i, ok := replies[token]
		if !ok {
			mu.Lock()
			lastToken = token
			mu.Unlock()
			_ = m.Respond([]byte("1"))
			return
		}
		r := cases.Replies[i]
		out := nats.NewMsg(m.Reply)
		for k, v := range r.Headers {
			out.Header.Set(k, v)
		}
		out.Data = []byte(r.Body)
		if r.BodyHex != "" {
			out.Data, _ = hex.DecodeString(r.BodyHex)
		}
		_ = m.RespondMsg(out)
	}); err != nil {
		t.Fatal(err)
	}
	decodes := map[string]int{} // ID -> index in cases.Decodes
	for i, d := range cases.Decodes {
		decodes[d.ID] = i
	}
	if _, err := responder.Subscribe(prefix+".decode.snowflake", func(m *nats.Msg) {
		i, ok := decodes[string(m.Data)]
		if !ok {
			return // the test fails on the timeout: the client sent another body
		}
		d := cases.Decodes[i]
		out := nats.NewMsg(m.Reply)
		for k, v := range d.Headers {
			out.Header.Set(k, v)
		}
		out.Data = []byte(d.Reply)
		_ = m.RespondMsg(out)
	}); err != nil {
		t.Fatal(err)
	}
	if err := responder.Flush(); err != nil {
		t.Fatal(err)
	}
	c, err := client.NewClient(ns.Connect(t), client.WithPrefix(prefix))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()

	for _, tc := range cases.Tags {
		if got := wire.TagToken(tc.Tag); got != tc.Token {
			t.Errorf("TagToken(%q) = %q, want %q", tc.Tag, got, tc.Token)
		}
		if got, err := wire.ParseTagToken(tc.Token); err != nil || got != tc.Tag {
			t.Errorf("ParseTagToken(%q) = %q, %v; want %q", tc.Token, got, err, tc.Tag)
		}
		if _, err := c.Segment(ctx, tc.Tag); err != nil {
			t.Fatalf("Segment(%q): %v", tc.Tag, err)
		}
		mu.Lock()
		got := lastToken
		mu.Unlock()
		if got != tc.Token {
			t.Errorf("Segment(%q) asked on token %q, want %q", tc.Tag, got, tc.Token)
		}
	}

	mu.Lock()
	lastToken = ""
	mu.Unlock()
	for _, tc := range cases.InvalidTags {
		err := wire.CheckTag(tc.Tag)
		if !errors.Is(err, wire.ErrBadRequest) || !strings.Contains(err.Error(), tc.Reason) {
			t.Errorf("CheckTag(%q) = %v, want a 400 saying %q", tc.Tag, err, tc.Reason)
		}
		// The client refuses it itself, as the Node.js client does: nothing is sent.
		for call, f := range map[string]func() error{
			"Segment":    func() error { _, err := c.Segment(ctx, tc.Tag); return err },
			"SnowflakeN": func() error { _, err := c.SnowflakeN(ctx, tc.Tag, 3); return err },
			"Buffer": func() error {
				b, err := c.Buffer(wire.Segment, tc.Tag, client.BufferOptions{Batch: 10})
				if err == nil {
					b.Close()
				}
				return err
			},
			"NewConsumer": func() error { _, err := client.NewConsumer(ctx, nil, prefix, wire.Segment, tc.Tag); return err },
		} {
			if err := f(); !errors.Is(err, wire.ErrBadRequest) || !strings.Contains(err.Error(), tc.Reason) {
				t.Errorf("%s(%q) = %v, want a 400 saying %q", call, tc.Tag, err, tc.Reason)
			}
		}
	}
	if err := responder.Flush(); err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	if lastToken != "" {
		t.Errorf("an invalid tag was asked for on token %q, want it refused by the client", lastToken)
	}
	mu.Unlock()

	for _, r := range cases.Replies {
		ids, err := c.SegmentN(ctx, "case-"+r.Name, r.N)
		switch {
		case r.IDs != nil:
			if err != nil {
				t.Errorf("%s: %v", r.Name, err)
				continue
			}
			var want []string
			for _, id := range ids {
				want = append(want, strconv.FormatInt(id, 10))
			}
			if strings.Join(want, ",") != strings.Join(r.IDs, ",") {
				t.Errorf("%s: IDs %v, want %v", r.Name, want, r.IDs)
			}
		case r.BadReply:
			if !errors.Is(err, wire.ErrBadReply) {
				t.Errorf("%s: %v, want a bad reply", r.Name, err)
			}
		default:
			var e *wire.Error
			if !errors.As(err, &e) || e.Code != r.Code || e.Description != r.Description {
				t.Errorf("%s: %v, want code %d and %q", r.Name, err, r.Code, r.Description)
			}
		}
	}
	for _, d := range cases.Decodes {
		id, err := strconv.ParseInt(d.ID, 10, 64)
		if err != nil {
			t.Fatal(err)
		}
		got, err := c.Decode(ctx, id)
		if d.Code != 0 {
			var e *wire.Error
			if !errors.As(err, &e) || e.Code != d.Code || e.Description != d.Description {
				t.Errorf("decode %s: %v, want code %d and %q", d.ID, err, d.Code, d.Description)
			}
			continue
		}
		want := wire.DecodedID{ID: d.ID, Timestamp: d.Timestamp, Time: d.Time, WorkerID: d.WorkerID, Sequence: d.Sequence}
		if err != nil || got != want {
			t.Errorf("decode %s: %+v, %v; want %+v", d.ID, got, err, want)
		}
	}
}
