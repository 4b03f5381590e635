package deployment

import (
	"errors"
	"fmt"
	"strings"

	"github.com/leafbus/leafbus/snowflake"
	"github.com/leafbus/leafbus/wire"
)

// Own is what one dispenser is, as its configuration and its store and registry say:
// what it compares with the record, and what it writes as the first.
type Own struct {
	Store    wire.DeployedStore
	Registry wire.DeployedRegistry
	Layout   wire.DeployedLayout
}

// Difference is one way a dispenser does not fit the record: what differs, the record's
// value and this dispenser's, and the flags that would make it fit.
type Difference struct {
	What     string
	Recorded string
	Own      string
	Fix      string
}

func (d Difference) String() string {
	return fmt.Sprintf("%s: the deployment's is %s, this dispenser's is %s (%s)", d.What, d.Recorded, d.Own, d.Fix)
}

// ErrMismatch is returned (wrapped in a *MismatchError) when a dispenser does not fit
// the deployment record: it must not serve.
var ErrMismatch = errors.New("this dispenser does not fit the deployment")

// MismatchError names every difference between a dispenser and the record.
type MismatchError struct {
	Bucket      string
	Record      wire.Deployment
	Differences []Difference
}

func (e *MismatchError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%v recorded in KV bucket %s (written by %s at %s: %s): ", ErrMismatch, e.Bucket, e.Record.WrittenBy, e.Record.WrittenAt, e.Record.Reason)
	for i, d := range e.Differences {
		if i > 0 {
			b.WriteString("; ")
		}
		b.WriteString(d.String())
	}
	b.WriteString(". If the deployment itself is to change, run `dispenser deployment set` with this dispenser's flags and --confirm (README \"The deployment record\")")
	return b.String()
}

func (e *MismatchError) Unwrap() error { return ErrMismatch }

// Compare says how own differs from the record rec: the segment store, the snowflake
// layout and epoch, and every registry of rec that hands out worker IDs own's range
// shares. No difference and add true means own's registry is to be added to the
// record: no registry of rec hands out all of own's worker IDs (a registry for a range
// no one uses yet, such as another datacenter's), and none of them is another
// registry's. Compare is pure; it does not look at the monotonic tags, which follow
// the admin API, not a dispenser's flags.
func Compare(rec wire.Deployment, own Own) (diffs []Difference, add bool) {
	if rec.SegmentStore != own.Store {
		diffs = append(diffs, Difference{
			What:     "segment store",
			Recorded: describeStore(rec.SegmentStore),
			Own:      describeStore(own.Store),
			Fix:      storeFix(rec.SegmentStore, own.Store),
		})
	}
	if l, o := rec.Snowflake, own.Layout; l.Epoch != o.Epoch {
		diffs = append(diffs, Difference{
			What:     "snowflake epoch",
			Recorded: fmt.Sprint(l.Epoch),
			Own:      fmt.Sprint(o.Epoch),
			Fix:      fmt.Sprintf("start it with --epoch %d", l.Epoch),
		})
	}
	if l, o := rec.Snowflake, own.Layout; l.TimeBits != o.TimeBits || l.WorkerBits != o.WorkerBits || l.SequenceBits != o.SequenceBits {
		diffs = append(diffs, Difference{
			What:     "snowflake layout",
			Recorded: describeBits(l),
			Own:      describeBits(o),
			Fix:      layoutFix(l),
		})
	}
	covered := false
	for _, r := range rec.WorkerRegistries {
		if !r.Overlaps(own.Registry) {
			continue
		}
		if !r.SameRegistry(own.Registry) {
			diffs = append(diffs, Difference{
				What:     fmt.Sprintf("worker registry of worker IDs %d..%d", r.WorkerIDMin, r.WorkerIDMax),
				Recorded: describeRegistry(r),
				Own:      fmt.Sprintf("%s for worker IDs %d..%d", describeRegistry(own.Registry), own.Registry.WorkerIDMin, own.Registry.WorkerIDMax),
				Fix:      registryFix(r, own.Registry, rec.WorkerRegistries),
			})
			continue
		}
		covered = covered || own.Registry.Within(r)
	}
	return diffs, len(diffs) == 0 && !covered
}

// withRegistry is rec with r added.
func withRegistry(rec wire.Deployment, r wire.DeployedRegistry) wire.Deployment {
	rec.WorkerRegistries = append(append([]wire.DeployedRegistry(nil), rec.WorkerRegistries...), r)
	return rec
}

func describeStore(s wire.DeployedStore) string { return fmt.Sprintf("%q", s.Identity) }

func describeRegistry(r wire.DeployedRegistry) string { return fmt.Sprintf("%q", r.Identity) }

func describeBits(l wire.DeployedLayout) string {
	return fmt.Sprintf("%d/%d/%d bits (time/worker/sequence)", l.TimeBits, l.WorkerBits, l.SequenceBits)
}

// storeFix says which flags select the recorded store.
func storeFix(rec, own wire.DeployedStore) string {
	switch {
	case rec.Kind == "mysql" && own.Kind != "mysql":
		return "start it with --segment-store mysql --mysql-dsn naming " + mysqlWhere(rec.Identity)
	case rec.Kind == "mysql":
		return "start it with a --mysql-dsn naming " + mysqlWhere(rec.Identity)
	case own.Kind != "kv":
		return "start it with --segment-store kv"
	}
	return "start it with the --prefix of the deployment"
}

// mysqlWhere turns "mysql <server>/<database>[.table]" into words for a fix.
func mysqlWhere(identity string) string {
	server, db, ok := strings.Cut(strings.TrimPrefix(identity, "mysql "), "/")
	if !ok {
		return identity
	}
	if name, table, ok := strings.Cut(db, "."); ok {
		return fmt.Sprintf("database %q on the server %s (table %s)", name, server, table)
	}
	return fmt.Sprintf("database %q on the server %s", db, server)
}

// registryFix says which flags select the recorded registry r, or keep this
// dispenser's worker IDs out of its range.
func registryFix(r, own wire.DeployedRegistry, all []wire.DeployedRegistry) string {
	var flags []string
	if r.Kind != own.Kind {
		flags = append(flags, "--worker-registry "+r.Kind)
	}
	switch r.Kind {
	case "zk":
		name, recycle := strings.CutSuffix(strings.TrimPrefix(r.Identity, "zk /snowflake/"), " (recycle)")
		flags = append(flags, "--zk-name "+name)
		_, ownRecycle := strings.CutSuffix(own.Identity, " (recycle)")
		switch {
		case recycle && !ownRecycle:
			flags = append(flags, "--zk-recycle")
		case !recycle && own.Kind == "zk" && ownRecycle:
			flags = append(flags, "--zk-recycle=false")
		}
	case "mysql":
		flags = append(flags, "--mysql-dsn naming "+mysqlWhere(r.Identity))
	case "static":
		flags = append(flags, "--worker-id N (one no other dispenser uses)")
	}
	fix := "start it with " + strings.Join(flags, " ")
	if len(flags) == 0 {
		fix = "start it with the --prefix of the deployment"
	}
	if free, ok := freeRange(all, own); ok {
		fix += fmt.Sprintf(", or give it worker IDs no registry of the deployment hands out (--worker-id-min %d --worker-id-max %d)", free.WorkerIDMin, free.WorkerIDMax)
	}
	return fix
}

// freeRange is the widest run of worker IDs within own's layout bound (own's range
// stretched to 0..the highest recorded or own maximum) that no registry of all hands out.
func freeRange(all []wire.DeployedRegistry, own wire.DeployedRegistry) (wire.DeployedRegistry, bool) {
	top := own.WorkerIDMax
	for _, r := range all {
		top = max(top, r.WorkerIDMax)
	}
	var best wire.DeployedRegistry
	found := false
	for lo := int64(0); lo <= top; {
		hi := lo
		for hi <= top && !usedBy(all, hi) {
			hi++
		}
		if hi > lo && (!found || hi-lo > best.WorkerIDMax-best.WorkerIDMin+1) {
			best, found = wire.DeployedRegistry{WorkerIDMin: lo, WorkerIDMax: hi - 1}, true
		}
		lo = hi + 1
	}
	return best, found
}

func usedBy(all []wire.DeployedRegistry, id int64) bool {
	for _, r := range all {
		if r.WorkerIDMin <= id && id <= r.WorkerIDMax {
			return true
		}
	}
	return false
}

// layoutFix is the flag that gives a dispenser the recorded layout l, or, for bits no
// named layout has, what leafbus to run.
func layoutFix(l wire.DeployedLayout) string {
	name := snowflake.Layout{TimeBits: l.TimeBits, WorkerBits: l.WorkerBits, SequenceBits: l.SequenceBits}.Name()
	if _, err := snowflake.NamedLayout(name); err == nil {
		return "start it with --snowflake-layout " + name
	}
	return fmt.Sprintf("run a leafbus whose layout is %s", describeBits(l))
}
