package dispenser

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/leafbus/leafbus/client"
	"github.com/leafbus/leafbus/wire"
)

// A rolling upgrade runs dispensers from before the deployment record beside this one
// (docs/operations.md "Rolling upgrade"). Those neither check themselves against the
// record nor watch it, so the record's checks hold only among the dispensers that
// publish wire.MetaDeploymentRecord: noteOldPeers says so once, at start, naming them.

// Its bounds: the peers answer $SRV.INFO from memory, together (as discovery's).
const (
	oldPeersWindow = 2 * time.Second
	oldPeersQuiet  = 200 * time.Millisecond
	oldPeersShown  = 16 // node IDs named in the line; the rest are counted
)

// noteOldPeers asks $SRV.INFO of this deployment's service once and logs a warning
// naming the dispensers whose metadata has no deployment_record. Nothing is logged when
// every one has it, or when the ask fails (a user that may not ask $SRV: the worker-ID
// range check says that one).
func (d *Dispenser) noteOldPeers(ctx context.Context) {
	if d.nc == nil {
		return
	}
	service := wire.Subjects{Prefix: d.cfg.Prefix}.Service()
	subject, err := micro.ControlSubject(micro.InfoVerb, service, "")
	if err != nil {
		return
	}
	answers, err := client.AskAll{Prefix: d.cfg.Prefix, Window: oldPeersWindow, Quiet: oldPeersQuiet}.Do(ctx, d.nc, nats.NewMsg(subject))
	switch {
	case errors.Is(err, nats.ErrPermissionViolation):
		d.log.Info("mixed fleet check off: this NATS user may not ask $SRV.INFO, so dispensers from before the deployment record are not looked for", "err", err)
		return
	case err != nil:
		d.log.Debug("mixed fleet check: $SRV.INFO not asked", "err", err)
		return
	}
	old := oldPeers(answers.Msgs)
	if len(old) == 0 {
		return
	}
	shown := old[:min(len(old), oldPeersShown)]
	d.log.Warn("dispensers from before the deployment record serve beside this one: they do not check themselves against the record (segment store, worker registries, snowflake layout and epoch) nor keep its monotonic tags, so its checks hold among the upgraded ones only; finish the rolling upgrade (docs/operations.md \"Rolling upgrade\")",
		"old_dispensers", len(old), "node_ids", strings.Join(shown, ","))
}

// oldPeers are the node IDs (cut to 64 bytes; the instance ID when there is none) of
// the $SRV.INFO answers without wire.MetaDeploymentRecord, sorted.
func oldPeers(msgs []*nats.Msg) []string {
	var old []string
	for _, m := range msgs {
		var info micro.Info
		if err := json.Unmarshal(m.Data, &info); err != nil {
			continue // not a dispenser's answer
		}
		if _, ok := info.Metadata[wire.MetaDeploymentRecord]; ok {
			continue
		}
		name := info.Metadata[wire.MetaNodeID]
		if name == "" {
			name = "instance " + info.ID
		}
		if len(name) > 64 {
			name = name[:64]
		}
		old = append(old, name)
	}
	slices.Sort(old)
	return old
}
