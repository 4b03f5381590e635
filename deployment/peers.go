package deployment

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/leafbus/leafbus/client"
	"github.com/leafbus/leafbus/wire"
)

// ownMeta is Own as $SRV.INFO metadata carries it (wire.MetaDeployment).
type ownMeta struct {
	Store    wire.DeployedStore    `json:"segment_store"`
	Registry wire.DeployedRegistry `json:"worker_registry"`
	Layout   wire.DeployedLayout   `json:"snowflake"`
}

// Meta is own as the value of wire.MetaDeployment.
func (o Own) Meta() string {
	b, _ := json.Marshal(ownMeta(o)) // plain structs: never fails
	return string(b)
}

// Peer is a live dispenser of the prefix as its $SRV.INFO answer describes it.
type Peer struct {
	NodeID   string
	Instance string
	Own      Own
	known    bool // its metadata says what it is (wire.MetaDeployment)
}

// Known reports whether the peer said what it is: a dispenser of a version before
// wire.MetaDeployment does not.
func (p Peer) Known() bool { return p.known }

// Fits reports whether the peer fits rec as a start would check it.
func (p Peer) Fits(rec wire.Deployment) bool {
	diffs, _ := Compare(rec, p.Own)
	return p.known && len(diffs) == 0
}

func (p Peer) String() string {
	if !p.known {
		return fmt.Sprintf("node %s (instance %s, which does not say its store)", wire.Quote(p.NodeID), p.Instance)
	}
	return fmt.Sprintf("node %s (instance %s, store %s, registry %s)", wire.Quote(p.NodeID), p.Instance, describeStore(p.Own.Store), describeRegistry(p.Own.Registry))
}

// parsePeer reads one $SRV.INFO answer.
func parsePeer(data []byte) (Peer, error) {
	var info micro.Info
	if err := json.Unmarshal(data, &info); err != nil {
		return Peer{}, err
	}
	p := Peer{NodeID: info.Metadata[wire.MetaNodeID], Instance: info.ID}
	if v, ok := info.Metadata[wire.MetaDeployment]; ok {
		var m ownMeta
		if err := json.Unmarshal([]byte(v), &m); err == nil {
			p.Own, p.known = Own(m), true
		}
	}
	return p, nil
}

// LivePeers asks every live dispenser of prefix ($SRV.INFO.<prefix>, client.AskAll)
// what it is, leaving out the service instance self ("": none). An answer that is not a
// $SRV.INFO answer is left out; a dispenser that does not say what it is is listed, not
// Known.
func LivePeers(ctx context.Context, nc *nats.Conn, prefix, self string) ([]Peer, error) {
	subject, err := micro.ControlSubject(micro.InfoVerb, prefix, "")
	if err != nil {
		return nil, err
	}
	answers, err := client.AskAll{Prefix: prefix}.Do(ctx, nc, nats.NewMsg(subject))
	if err != nil {
		return nil, fmt.Errorf("deployment: ask the live dispensers (%s): %w", subject, err)
	}
	var peers []Peer
	for _, m := range answers.Msgs {
		p, err := parsePeer(m.Data)
		if err != nil || (self != "" && p.Instance == self) {
			continue
		}
		peers = append(peers, p)
	}
	return peers, nil
}

// describePeers names up to five peers.
func describePeers(peers []Peer) string {
	var names []string
	for i, p := range peers {
		if i == 5 {
			names = append(names, fmt.Sprintf("and %d more", len(peers)-5))
			break
		}
		names = append(names, p.String())
	}
	return strings.Join(names, "; ")
}

// ErrFleetLive is returned by Check when there is no record but live dispensers of the
// prefix answer: they write it back (Watch), and a start waits for that, within
// --start-timeout, rather than write a record of its own.
var ErrFleetLive = fmt.Errorf("no deployment record, but live dispensers of this deployment answer: waiting for them to write it back")

// Contradicting lists the peers that do not fit rec (those that do not say what they
// are among them): what `dispenser deployment set` refuses to write over.
func Contradicting(peers []Peer, rec wire.Deployment) []Peer {
	var out []Peer
	for _, p := range peers {
		if !p.Fits(rec) {
			out = append(out, p)
		}
	}
	return out
}

// ErrLiveContradict is returned by `dispenser deployment set` for a record that live
// dispensers of the prefix contradict.
var ErrLiveContradict = fmt.Errorf("live dispensers of this deployment do not fit the new record")

// LiveContradictError names them.
func LiveContradictError(peers []Peer) error {
	return fmt.Errorf("%w: %s; stop them first (a running dispenser writes back the record it runs under over one it contradicts)", ErrLiveContradict, describePeers(peers))
}
