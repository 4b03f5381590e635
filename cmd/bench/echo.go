package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/leafbus/leafbus/client"
	"github.com/leafbus/leafbus/wire"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
)

// echoServer is the baseline: bare NATS responders, each on its own connection with one
// queue subscription, answering every request with a canned body the size of the
// dispenser's reply. Loaded exactly like the dispenser, it measures what NATS and this
// client cost by themselves, so the dispenser/echo ratio is what the dispenser adds.
//
// Each responder is one subscription whose callback nats.go runs serially, as a micro
// endpoint's handler runs serially per service instance; the default number of responders
// is therefore the number of endpoint instances serving the subject.
type echoServer struct {
	prefix string // _bench.echo.<unique>; requests go to prefix.<tag>
	conns  []*benchConn
}

// newEchoPrefix is a subject prefix no other run uses: _bench.echo.<unique>.
func newEchoPrefix() string {
	return "_bench.echo." + strings.TrimPrefix(nats.NewInbox(), nats.InboxPrefix)
}

// startEcho connects responders responders through cfg and subscribes them to
// prefix.<tag>. payloads[i] answers requests for tags[i], on the reply subjects the
// dispenser of replies would answer on (PROTOCOL.md "Reply subjects"): a caller cannot
// aim the echo at a KV key or a dispenser subject, and the echo does the dispenser's
// per-request check too.
func startEcho(cfg client.ConnConfig, replies wire.Subjects, prefix string, tags []string, payloads [][]byte, responders int, logger *slog.Logger) (*echoServer, error) {
	e := &echoServer{prefix: prefix}
	byTag := make(map[string][]byte, len(tags))
	for i, tag := range tags {
		byTag[tag] = payloads[i]
	}
	for i := range responders {
		cl, err := connect(cfg, "", fmt.Sprintf("leafbus-bench-echo-%d", i), logger)
		if err != nil {
			e.stop()
			return nil, fmt.Errorf("echo responder %d: %w", i, err)
		}
		e.conns = append(e.conns, cl)
		nc := cl.nc
		_, err = nc.QueueSubscribe(e.prefix+".*", "bench-echo", func(m *nats.Msg) {
			if !replies.ReplyAllowed(m.Reply) {
				return
			}
			// A failed respond can only mean a closed connection; the client counts a timeout.
			_ = m.Respond(byTag[m.Subject[len(e.prefix)+1:]])
		})
		if err == nil {
			err = nc.Flush()
		}
		if err != nil {
			e.stop()
			return nil, fmt.Errorf("echo responder %d: subscribe: %w", i, err)
		}
	}
	return e, nil
}

// subject is where the echo copy of a request for tag goes.
func (e *echoServer) subject(tag string) string { return e.prefix + "." + tag }

// stop closes the responders' connections.
func (e *echoServer) stop() { closeClients(e.conns) }

// sampleReplies asks the dispenser once per subject, with the load's body and header,
// and returns the reply bodies: the echo's canned payloads. Using a real reply keeps the
// size exact for the batch and encoding, and lets the client parse echo replies with the
// very code, and cost, it spends on the dispenser's.
func sampleReplies(nc *nats.Conn, spec *loadSpec) ([][]byte, error) {
	var out [][]byte
	for _, subj := range spec.subjects {
		m, err := nc.RequestMsg(&nats.Msg{Subject: subj, Header: spec.header, Data: spec.body}, spec.timeout)
		if err == nil {
			_, err = parseReply(m.Header, m.Data, spec.batch, spec.enc, nil)
		}
		if err != nil {
			return nil, fmt.Errorf("sample reply from %s: %w", subj, err)
		}
		out = append(out, m.Data)
	}
	return out, nil
}

// countResponders asks $SRV.INFO.<service> and counts the endpoints, over every instance
// that answers within wait, whose subject covers subject. A deployment that is not a
// micro service (no answer) counts 0.
func countResponders(nc *nats.Conn, service, subject string, wait time.Duration) (int, error) {
	infoSubject, err := micro.ControlSubject(micro.InfoVerb, service, "")
	if err != nil {
		return 0, fmt.Errorf("service info: %w", err)
	}
	// Instances answer together: once one has, stragglers get a short grace.
	ask := client.AskAll{Prefix: service, Window: wait, Quiet: 200 * time.Millisecond}
	answers, err := ask.Do(context.Background(), nc, &nats.Msg{Subject: infoSubject})
	if err != nil {
		return 0, fmt.Errorf("service info: %w", err)
	}
	n := 0
	for _, m := range answers.Msgs {
		var info micro.Info
		if err := json.Unmarshal(m.Data, &info); err != nil {
			return n, fmt.Errorf("service info from %s: %w", service, err)
		}
		for _, ep := range info.Endpoints {
			if subjectMatches(ep.Subject, subject) {
				n++
			}
		}
	}
	return n, nil
}

// subjectMatches reports whether the NATS subject pattern (with * and >) covers subject.
func subjectMatches(pattern, subject string) bool {
	pt, st := strings.Split(pattern, "."), strings.Split(subject, ".")
	for i, p := range pt {
		if p == ">" {
			return len(st) > i
		}
		if i >= len(st) || (p != "*" && p != st[i]) {
			return false
		}
	}
	return len(pt) == len(st)
}
