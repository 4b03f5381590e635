package httpapi

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/leafbus/leafbus/wire"
)

// quietAfter ends a fan-in: once the first answer came, no answer for this long means
// every dispenser that will answer has.
const quietAfter = 100 * time.Millisecond

// Discover returns a Status.Cluster func that finds every dispenser of prefix over nc:
// each answers $SRV.INFO.<prefix> (its version, and the node_id and worker_id of its
// metadata) and <prefix>.time (its clock, named by the Leaf-Node-Id header); the two
// are joined on the node ID. A dispenser whose INFO has no node_id shows twice, once
// per answer. Each call waits for answers until ctx ends or none came for 100ms.
func Discover(nc *nats.Conn, prefix string) func(ctx context.Context) ([]Peer, error) {
	sub := wire.Subjects{Prefix: prefix}
	return func(ctx context.Context) ([]Peer, error) {
		infoSubject, err := micro.ControlSubject(micro.InfoVerb, sub.Service(), "")
		if err != nil {
			return nil, err
		}
		var (
			wg               sync.WaitGroup
			infos, clocks    []*nats.Msg
			infoErr, timeErr error
		)
		wg.Go(func() { infos, infoErr = fanIn(ctx, nc, infoSubject) })
		wg.Go(func() { clocks, timeErr = fanIn(ctx, nc, sub.Time()) })
		wg.Wait()
		peers := join(infos, clocks)
		return peers, errors.Join(infoErr, timeErr)
	}
}

// join makes one Peer per node from the INFO and time answers.
func join(infos, clocks []*nats.Msg) []Peer {
	byNode := map[string]*Peer{}
	var peers []*Peer
	for _, m := range infos {
		var info struct {
			ID       string            `json:"id"`
			Version  string            `json:"version"`
			Metadata map[string]string `json:"metadata"`
		}
		if err := json.Unmarshal(m.Data, &info); err != nil {
			continue
		}
		p := &Peer{NodeID: info.Metadata[wire.MetaNodeID], Version: info.Version, WorkerID: -1}
		if p.NodeID == "" {
			p.NodeID, p.Error = "service "+info.ID, "its $SRV.INFO names no node_id"
		}
		if w, err := strconv.ParseInt(info.Metadata[wire.MetaWorkerID], 10, 64); err == nil {
			p.WorkerID = w
		}
		byNode[p.NodeID] = p
		peers = append(peers, p)
	}
	for _, m := range clocks {
		node := m.Header.Get(wire.NodeIDHeader)
		ms, err := strconv.ParseInt(string(m.Data), 10, 64)
		if node == "" || err != nil {
			continue
		}
		p := byNode[node]
		if p == nil {
			p = &Peer{NodeID: node, WorkerID: -1}
			byNode[node] = p
			peers = append(peers, p)
		}
		p.Clock = time.UnixMilli(ms)
	}
	out := make([]Peer, 0, len(peers))
	for _, p := range peers {
		out = append(out, *p)
	}
	slices.SortFunc(out, func(a, b Peer) int { return cmp.Compare(a.NodeID, b.NodeID) })
	return out
}

// fanIn publishes an empty request on subject and collects every answer: until ctx
// ends, or quietAfter passed without one once the first came. NATS' "no responders"
// status ends it with no answers and no error.
func fanIn(ctx context.Context, nc *nats.Conn, subject string) ([]*nats.Msg, error) {
	inbox := nc.NewRespInbox()
	s, err := nc.SubscribeSync(inbox)
	if err != nil {
		return nil, fmt.Errorf("discover %s: %w", subject, err)
	}
	defer s.Unsubscribe() //nolint:errcheck // the inbox is ours alone
	if err := nc.PublishRequest(subject, inbox, nil); err != nil {
		return nil, fmt.Errorf("discover %s: %w", subject, err)
	}
	var out []*nats.Msg
	for {
		wait := ctx
		cancel := context.CancelFunc(func() {})
		if len(out) > 0 {
			wait, cancel = context.WithTimeout(ctx, quietAfter)
		}
		m, err := s.NextMsgWithContext(wait)
		cancel()
		switch {
		case errors.Is(err, nats.ErrNoResponders), err == nil && wire.NoResponders(m.Header, m.Data):
			return out, nil
		case err != nil && len(out) > 0:
			return out, nil
		case err != nil:
			return nil, fmt.Errorf("discover %s: no answer: %w", subject, err)
		}
		out = append(out, m)
	}
}
