package httpapi

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/leafbus/leafbus/client"
	"github.com/leafbus/leafbus/wire"
)

// Discovery's bounds (client.AskAll): dispensers answer from memory within
// milliseconds and together, so a window of half a second with 100 ms of quiet finds
// them; a dispenser's $SRV.INFO is about 2 KB and its time answer 13 digits.
const (
	discoverWindow    = 500 * time.Millisecond
	discoverQuiet     = 100 * time.Millisecond
	discoverInfoBytes = 16 << 10
	discoverTimeBytes = 256
	// maxPeerText is the longest node ID, version or note shown as it is; a longer
	// one is cut (a rogue's 20 KB node ID).
	maxPeerText = 64
)

// Discover returns a Status.Cluster func that finds every dispenser of prefix over nc:
// each answers $SRV.INFO.<prefix> (its version, and the node_id and worker_id of its
// metadata) and <prefix>.time (its clock, named by the Leaf-Node-Id header); the two
// are joined on the node ID. A dispenser whose INFO has no node_id shows twice, once
// per answer. Each call asks with client.AskAll's bounds (at most 1,024 answers of each,
// for at most half a second, ended by 100 ms without an answer) and cuts every text an
// answer holds to 64 bytes; when answers were left out, the error says how many. self
// is this node's node ID ("": none): its own answers, the first to come, do not start
// the quiet time, or on a busy machine the others' came too late to be listed.
func Discover(nc *nats.Conn, prefix, self string) func(ctx context.Context) ([]Peer, error) {
	sub := wire.Subjects{Prefix: prefix}
	return func(ctx context.Context) ([]Peer, error) {
		infoSubject, err := micro.ControlSubject(micro.InfoVerb, sub.Service(), "")
		if err != nil {
			return nil, err
		}
		ask := client.AskAll{Prefix: prefix, Window: discoverWindow, Quiet: discoverQuiet}
		var (
			wg               sync.WaitGroup
			infos, clocks    client.Answers
			infoErr, timeErr error
		)
		wg.Go(func() {
			a := ask
			a.MaxBytes = discoverInfoBytes
			a.Own = func(m *nats.Msg) bool {
				var info struct {
					Metadata map[string]string `json:"metadata"`
				}
				return self != "" && json.Unmarshal(m.Data, &info) == nil && info.Metadata[wire.MetaNodeID] == self
			}
			infos, infoErr = a.Do(ctx, nc, nats.NewMsg(infoSubject))
		})
		wg.Go(func() {
			a := ask
			a.MaxBytes = discoverTimeBytes
			a.Own = func(m *nats.Msg) bool { return self != "" && m.Header.Get(wire.NodeIDHeader) == self }
			clocks, timeErr = a.Do(ctx, nc, nats.NewMsg(sub.Time()))
		})
		wg.Wait()
		peers := join(infos.Msgs, clocks.Msgs)
		return peers, errors.Join(infoErr, timeErr, leftOut(infoSubject, infos), leftOut(sub.Time(), clocks))
	}
}

// leftOut says how many answers to subject discovery did not keep, nil when none.
func leftOut(subject string, a client.Answers) error {
	if !a.More && a.Dropped() == 0 {
		return nil
	}
	more := ""
	if a.More {
		more = fmt.Sprintf("; more than %d answered, the rest were not read", len(a.Msgs))
	}
	return fmt.Errorf("%s: %d answers kept, %d too long and %d lost dropped%s", subject, len(a.Msgs), a.TooLong, a.Lost, more)
}

// peerText is s as it is when short and printable, else quoted and cut (wire.Quote).
func peerText(s string) string {
	if len(s) <= maxPeerText && strings.IndexFunc(s, func(r rune) bool { return !unicode.IsPrint(r) }) < 0 {
		return s
	}
	return wire.Quote(s)
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
		p := &Peer{NodeID: peerText(info.Metadata[wire.MetaNodeID]), Version: peerText(info.Version), WorkerID: -1}
		if p.NodeID == "" {
			p.NodeID, p.Error = "service "+peerText(info.ID), "its $SRV.INFO names no node_id"
		}
		if w, err := strconv.ParseInt(info.Metadata[wire.MetaWorkerID], 10, 64); err == nil {
			p.WorkerID = w
		}
		byNode[p.NodeID] = p
		peers = append(peers, p)
	}
	for _, m := range clocks {
		node := peerText(m.Header.Get(wire.NodeIDHeader))
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
