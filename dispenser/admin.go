package dispenser

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/leafbus/leafbus/deployment"
	"github.com/leafbus/leafbus/wire"
)

// The admin commands that change what a start would find: `dispenser deployment
// show|set` and `dispenser fence`. Each runs the part of a start it needs (New with
// only those steps), with the same configuration as the dispensers, so that what it
// computes is what a start would: the data dir's lock (with the embedded server, whose
// JetStream store is in the data dir: no dispenser may run on it meanwhile), NATS, and
// the segment store and worker registry as a start opens them. The embedded server
// listens on a random loopback port only, so no client reaches it.

// openAdmin runs the steps named of New with cfg, for an admin command; Close undoes
// them.
func openAdmin(ctx context.Context, cfg Config, steps []stepName, opts ...Option) (*Dispenser, error) {
	cfg.Listen, cfg.Monitor, cfg.HTTP = "127.0.0.1:0", "", ""
	if slices.Contains(steps, stepDataDir) {
		// An admin command never makes a data dir (and an empty JetStream store in it).
		if _, err := os.Stat(cfg.DataDir); err != nil {
			return nil, fmt.Errorf("--data-dir: %w (give the data dir of the dispenser, or --nats to reach a running deployment)", err)
		}
	}
	only := map[stepName]bool{}
	for _, s := range steps {
		only[s] = true
	}
	return New(ctx, cfg, append(opts, func(o *options) error { o.onlySteps = only; return nil })...)
}

// adminSteps are the steps every admin command runs: the data dir's lock when the
// JetStream store is in it (embedded), or always (withDir), and NATS.
func adminSteps(cfg Config, withDir bool, more ...stepName) []stepName {
	var steps []stepName
	if withDir || cfg.NATS == "" {
		steps = append(steps, stepDataDir)
	}
	return append(append(steps, stepNATS), more...)
}

// DeploymentView is the deployment record as `dispenser deployment show` shows it.
type DeploymentView struct {
	Bucket   string
	Revision uint64           // 0: there is no record
	Raw      []byte           // the value as stored
	Record   *wire.Deployment // nil when there is none or it is unreadable
	Err      error            // why Raw is not a record (wrapping deployment.ErrCorrupt)
}

// ShowDeployment reads the deployment record of cfg's deployment.
func ShowDeployment(ctx context.Context, cfg Config, opts ...Option) (DeploymentView, error) {
	d, err := openAdmin(ctx, cfg, adminSteps(cfg, false), opts...)
	if err != nil {
		return DeploymentView{}, err
	}
	defer d.Close()
	// Bound to, never created: show only reads, and a user that may only read the
	// bucket (deploy/nats-roles.conf: operator) can. A permissions violation ends it at
	// once instead of waiting out the request it refused.
	var v DeploymentView
	err = d.attempt(ctx, step{name: "deployment show", run: func(ctx context.Context) error {
		records, err := deployment.Look(ctx, d.js, cfg.Prefix)
		if errors.Is(err, jetstream.ErrBucketNotFound) {
			v.Bucket = wire.Subjects{Prefix: cfg.Prefix}.Bucket(wire.DeploymentBucket)
			return nil // no dispenser has started yet
		}
		if err != nil {
			return err
		}
		v, err = viewDeployment(ctx, records)
		return err
	}}, 0)
	if errors.Is(err, nats.ErrPermissionViolation) {
		return v, fmt.Errorf("deployment show: the NATS server denies %s a read of KV bucket %s (give the user the read rights of user operator in deploy/nats-roles.conf): %w",
			d.describeCreds(Credentials{}), wire.Subjects{Prefix: cfg.Prefix}.Bucket(wire.DeploymentBucket), err)
	}
	return v, err
}

func viewDeployment(ctx context.Context, records *deployment.Records) (DeploymentView, error) {
	v := DeploymentView{Bucket: records.Bucket()}
	var err error
	if v.Raw, v.Revision, err = records.Raw(ctx); err != nil || v.Raw == nil {
		return v, err
	}
	e, err := records.Get(ctx)
	switch {
	case errors.Is(err, deployment.ErrCorrupt):
		v.Err = err
	case err != nil:
		return v, err
	default:
		v.Record, v.Revision = &e.Record, e.Revision
	}
	return v, nil
}

// SetOptions is what `dispenser deployment set` is asked to do.
type SetOptions struct {
	// Confirm writes the record; without it SetDeployment only says what it would write.
	Confirm bool
	// Revision, when not 0, is the revision the record must still be at (the one an
	// operator read with show, or a dry run): the write is a compare-and-set on it.
	// 0: the revision read now.
	Revision uint64
	// DropOthers keeps no registry but this configuration's (a datacenter given up).
	DropOthers bool
}

// DeploymentChange is what SetDeployment found and did.
type DeploymentChange struct {
	Current     DeploymentView
	Next        wire.Deployment
	Differences []deployment.Difference // how cfg differs from the current record
	Written     bool
	Revision    uint64            // the revision written
	Against     []deployment.Peer // live dispensers that contradict Next: nothing is written
}

// ErrNotConfirmed is returned by SetDeployment without SetOptions.Confirm: nothing was
// written.
var ErrNotConfirmed = errors.New("nothing written: check the record above and add --confirm to write it")

// SetDeployment computes the deployment record from cfg as a start would (its segment
// store and worker registry as they name themselves, its worker-ID range, its layout)
// and, with set.Confirm, writes it over the current record with a compare-and-set on
// its revision (deployment.Replace keeps the monotonic tags and the registries of other
// worker IDs). A record that changed since it was read is not overwritten
// (deployment.ErrChanged), nor is a record that a live dispenser of the prefix
// contradicts (deployment.ErrLiveContradict, naming each): stop those first.
func SetDeployment(ctx context.Context, cfg Config, set SetOptions, opts ...Option) (DeploymentChange, error) {
	d, err := openAdmin(ctx, cfg, adminSteps(cfg, false, stepSegmentStore, stepWorkerRegistry), opts...)
	if err != nil {
		return DeploymentChange{}, err
	}
	defer d.Close()
	records, err := deployment.Open(ctx, d.js, cfg.Prefix, cfg.KVReplicas)
	if err != nil {
		return DeploymentChange{}, err
	}
	own, err := d.ownDeployment()
	if err != nil {
		return DeploymentChange{}, err
	}
	var ch DeploymentChange
	if ch.Current, err = viewDeployment(ctx, records); err != nil {
		return ch, err
	}
	if ch.Current.Record != nil {
		ch.Differences, _ = deployment.Compare(*ch.Current.Record, own)
	}
	ch.Next = deployment.Replace(ch.Current.Record, own, set.DropOthers, cfg.NodeID, d.clock.Now())
	// The record follows the fleet: a running dispenser writes back the record it runs
	// under over one it contradicts (deployment.Watch), so such a change is refused
	// here first, naming them, dry run or not.
	peers, err := d.livePeers(ctx)
	if err != nil {
		return ch, err
	}
	if against := deployment.Contradicting(peers, ch.Next); len(against) > 0 {
		ch.Against = against
		return ch, deployment.LiveContradictError(against)
	}
	if !set.Confirm {
		return ch, ErrNotConfirmed
	}
	rev := set.Revision
	if rev == 0 {
		rev = ch.Current.Revision
	}
	var e deployment.Entry
	if rev == 0 {
		e, err = records.Create(ctx, ch.Next)
	} else {
		e, err = records.Update(ctx, ch.Next, rev)
	}
	if err != nil {
		return ch, err
	}
	ch.Written, ch.Revision = true, e.Revision
	d.log.Warn("deployment record written by `dispenser deployment set`", "bucket", records.Bucket(), "revision", e.Revision, "reason", ch.Next.Reason)
	return ch, nil
}
