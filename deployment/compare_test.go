package deployment

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"github.com/leafbus/leafbus/wire"
)

// Deployments of the tests: a MySQL store, ZooKeeper worker IDs under leaf-prod,
// Leaf's layout.
var (
	mysqlStore = wire.DeployedStore{Kind: "mysql", Identity: "mysql db1:3306/leaf"}
	kvStore    = wire.DeployedStore{Kind: "kv", Identity: "kv leaf_segments"}
	leafLayout = wire.DeployedLayout{Epoch: 1288834974657, TimeBits: 41, WorkerBits: 10, SequenceBits: 12}
)

func zkReg(name string, min, max int64) wire.DeployedRegistry {
	return wire.DeployedRegistry{Kind: "zk", Identity: "zk /snowflake/" + name, WorkerIDMin: min, WorkerIDMax: max}
}

func kvReg(min, max int64) wire.DeployedRegistry {
	return wire.DeployedRegistry{Kind: "kv", Identity: "kv leaf_leases", WorkerIDMin: min, WorkerIDMax: max}
}

func record(store wire.DeployedStore, layout wire.DeployedLayout, regs ...wire.DeployedRegistry) wire.Deployment {
	return wire.Deployment{Version: 1, SegmentStore: store, WorkerRegistries: regs, Snowflake: layout,
		WrittenBy: "disp-1", WrittenAt: "2026-11-24T10:00:00.000Z", Reason: "first start"}
}

func TestCompare(t *testing.T) {
	prod := record(mysqlStore, leafLayout, zkReg("leaf-prod", 0, 1023))
	twoDC := record(mysqlStore, leafLayout, zkReg("leaf-dc1", 0, 511), zkReg("leaf-dc2", 512, 1023))
	otherEpoch := leafLayout
	otherEpoch.Epoch = 1700000000000
	otherBits := leafLayout
	otherBits.WorkerBits, otherBits.SequenceBits = 8, 14
	tests := []struct {
		name    string
		rec     wire.Deployment
		own     Own
		wantAdd bool
		want    []string // one substring per difference, in order
	}{
		{"OK", prod, Own{mysqlStore, zkReg("leaf-prod", 0, 1023), leafLayout}, false, nil},
		{"OKSmallerRange", prod, Own{mysqlStore, zkReg("leaf-prod", 100, 200), leafLayout}, false, nil},
		{"OKOtherDatacenter", twoDC, Own{mysqlStore, zkReg("leaf-dc2", 512, 1023), leafLayout}, false, nil},
		{"AddDisjointRange", record(mysqlStore, leafLayout, zkReg("leaf-dc1", 0, 511)), Own{mysqlStore, kvReg(512, 1023), leafLayout}, true, nil},
		{"AddWiderRangeSameRegistry", record(mysqlStore, leafLayout, zkReg("leaf-prod", 0, 511)), Own{mysqlStore, zkReg("leaf-prod", 0, 1023), leafLayout}, true, nil},
		{"ErrDefaultFlagsInMySQLDeployment", prod, Own{kvStore, kvReg(0, 1023), leafLayout}, false, []string{
			`segment store: the deployment's is "mysql db1:3306/leaf", this dispenser's is "kv leaf_segments" (start it with --segment-store mysql --mysql-dsn naming database "leaf" on the server db1:3306)`,
			`worker registry of worker IDs 0..1023: the deployment's is "zk /snowflake/leaf-prod", this dispenser's is "kv leaf_leases" for worker IDs 0..1023 (start it with --worker-registry zk --zk-name leaf-prod)`,
		}},
		{"ErrOtherDatabase", prod, Own{wire.DeployedStore{Kind: "mysql", Identity: "mysql db1:3306/leaf2"}, zkReg("leaf-prod", 0, 1023), leafLayout}, false, []string{
			`start it with a --mysql-dsn naming database "leaf" on the server db1:3306`,
		}},
		{"ErrKVInMySQLDeploymentOnly", record(kvStore, leafLayout, kvReg(0, 1023)), Own{mysqlStore, kvReg(0, 1023), leafLayout}, false, []string{
			`(start it with --segment-store kv)`,
		}},
		{"ErrTwoZKNames", prod, Own{mysqlStore, zkReg("leaf", 0, 1023), leafLayout}, false, []string{
			`the deployment's is "zk /snowflake/leaf-prod", this dispenser's is "zk /snowflake/leaf" for worker IDs 0..1023 (start it with --zk-name leaf-prod)`,
		}},
		{"ErrTwoZKNamesWithAFreeRange", record(mysqlStore, leafLayout, zkReg("leaf-prod", 0, 511)), Own{mysqlStore, zkReg("leaf", 0, 1023), leafLayout}, false, []string{
			`(start it with --zk-name leaf-prod, or give it worker IDs no registry of the deployment hands out (--worker-id-min 512 --worker-id-max 1023))`,
		}},
		{"ErrOverlapsOtherDatacenter", twoDC, Own{mysqlStore, zkReg("leaf-dc2", 500, 1023), leafLayout}, false, []string{
			`worker registry of worker IDs 0..511: the deployment's is "zk /snowflake/leaf-dc1"`,
		}},
		{"ErrZKRecycle", prod, Own{mysqlStore, wire.DeployedRegistry{Kind: "zk", Identity: "zk /snowflake/leaf-prod (recycle)", WorkerIDMax: 1023}, leafLayout}, false, []string{
			`(start it with --zk-name leaf-prod --zk-recycle=false)`,
		}},
		{"ErrZKNotRecycle", record(mysqlStore, leafLayout, wire.DeployedRegistry{Kind: "zk", Identity: "zk /snowflake/leaf-prod (recycle)", WorkerIDMax: 1023}), Own{mysqlStore, kvReg(0, 1023), leafLayout}, false, []string{
			`(start it with --worker-registry zk --zk-name leaf-prod --zk-recycle)`,
		}},
		{"ErrMySQLRegistry", record(mysqlStore, leafLayout, wire.DeployedRegistry{Kind: "mysql", Identity: "mysql db1:3306/leaf.leaf_workerid_alloc", WorkerIDMax: 1023}), Own{mysqlStore, kvReg(0, 1023), leafLayout}, false, []string{
			`start it with --worker-registry mysql --mysql-dsn naming database "leaf" on the server db1:3306 (table leaf_workerid_alloc)`,
		}},
		{"ErrStatic", record(mysqlStore, leafLayout, wire.DeployedRegistry{Kind: "static", Identity: "static", WorkerIDMax: 1023}), Own{mysqlStore, kvReg(0, 1023), leafLayout}, false, []string{
			`start it with --worker-registry static --worker-id N`,
		}},
		{"ErrEpoch", prod, Own{mysqlStore, zkReg("leaf-prod", 0, 1023), otherEpoch}, false, []string{
			`snowflake epoch: the deployment's is 1288834974657, this dispenser's is 1700000000000 (start it with --epoch 1288834974657)`,
		}},
		{"ErrLayout", prod, Own{mysqlStore, zkReg("leaf-prod", 0, 1023), otherBits}, false, []string{
			`snowflake layout: the deployment's is 41/10/12 bits (time/worker/sequence), this dispenser's is 41/8/14 bits`,
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			diffs, add := Compare(tt.rec, tt.own)
			if add != tt.wantAdd {
				t.Errorf("Compare add = %v, want %v", add, tt.wantAdd)
			}
			if len(diffs) != len(tt.want) {
				t.Fatalf("Compare = %d differences %v, want %d", len(diffs), diffs, len(tt.want))
			}
			for i, d := range diffs {
				if !strings.Contains(d.String(), tt.want[i]) {
					t.Errorf("difference %d:\n got %s\nwant it to hold %s", i, d, tt.want[i])
				}
			}
			if len(diffs) > 0 {
				err := error(&MismatchError{Bucket: "leaf_deployment", Record: tt.rec, Differences: diffs})
				msg := err.Error()
				if !errors.Is(err, ErrMismatch) || !strings.Contains(msg, "leaf_deployment (written by disp-1 at 2026-11-24T10:00:00.000Z: first start)") ||
					!strings.Contains(msg, "dispenser deployment set") {
					t.Errorf("MismatchError = %q, want ErrMismatch naming the bucket, the writer and `dispenser deployment set`", msg)
				}
			}
		})
	}
}

func TestFreeRange(t *testing.T) {
	tests := []struct {
		name     string
		regs     []wire.DeployedRegistry
		own      wire.DeployedRegistry
		min, max int64
		ok       bool
	}{
		{"AllTaken", []wire.DeployedRegistry{kvReg(0, 1023)}, kvReg(0, 1023), 0, 0, false},
		{"Top", []wire.DeployedRegistry{kvReg(0, 511)}, kvReg(0, 1023), 512, 1023, true},
		{"Bottom", []wire.DeployedRegistry{kvReg(100, 1023)}, kvReg(0, 1023), 0, 99, true},
		{"Widest", []wire.DeployedRegistry{kvReg(10, 20), kvReg(500, 600)}, kvReg(0, 1023), 21, 499, true},
		{"Middle", []wire.DeployedRegistry{kvReg(0, 99), kvReg(900, 1023)}, kvReg(0, 1023), 100, 899, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, ok := freeRange(tt.regs, tt.own)
			if ok != tt.ok || (ok && (got.WorkerIDMin != tt.min || got.WorkerIDMax != tt.max)) {
				t.Errorf("freeRange = %d..%d %v, want %d..%d %v", got.WorkerIDMin, got.WorkerIDMax, ok, tt.min, tt.max, tt.ok)
			}
		})
	}
}

func TestReplace(t *testing.T) {
	dc1, dc2 := zkReg("leaf-dc1", 0, 511), zkReg("leaf-dc2", 512, 1023)
	current := record(mysqlStore, leafLayout, dc1, dc2)
	current.MonotonicTags = []string{"orders"}
	otherEpoch := leafLayout
	otherEpoch.Epoch = 1700000000000
	tests := []struct {
		name       string
		current    *wire.Deployment
		own        Own
		dropOthers bool
		want       []wire.DeployedRegistry
	}{
		{"NoRecord", nil, Own{kvStore, kvReg(0, 1023), leafLayout}, false, []wire.DeployedRegistry{kvReg(0, 1023)}},
		{"ReplacesOverlapping", &current, Own{mysqlStore, zkReg("leaf-new", 400, 1023), otherEpoch}, false, []wire.DeployedRegistry{zkReg("leaf-new", 400, 1023)}},
		{"KeepsOthers", &current, Own{mysqlStore, zkReg("leaf-dc2b", 512, 1023), leafLayout}, false, []wire.DeployedRegistry{dc1, zkReg("leaf-dc2b", 512, 1023)}},
		{"DropsOthers", &current, Own{mysqlStore, zkReg("leaf-dc2b", 512, 1023), leafLayout}, true, []wire.DeployedRegistry{zkReg("leaf-dc2b", 512, 1023)}},
		{"SortedByRange", &current, Own{mysqlStore, kvReg(0, 100), leafLayout}, false, []wire.DeployedRegistry{kvReg(0, 100), dc2}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := Replace(tt.current, tt.own, tt.dropOthers, "operator", when)
			if err := got.Validate(); err != nil {
				t.Fatalf("Replace wrote an invalid record: %v", err)
			}
			if got.SegmentStore != tt.own.Store || got.Snowflake != tt.own.Layout {
				t.Errorf("store %+v layout %+v, want own's", got.SegmentStore, got.Snowflake)
			}
			if !slices.Equal(got.WorkerRegistries, tt.want) {
				t.Errorf("registries %+v, want %+v", got.WorkerRegistries, tt.want)
			}
			wantTags := []string{}
			if tt.current != nil {
				wantTags = []string{"orders"}
			}
			if !slices.Equal(got.MonotonicTags, wantTags) && !(len(got.MonotonicTags) == 0 && len(wantTags) == 0) {
				t.Errorf("monotonic tags %v, want %v", got.MonotonicTags, wantTags)
			}
			if got.WrittenBy != "operator" || got.Reason != "deployment set by operator" {
				t.Errorf("stamped %q %q", got.WrittenBy, got.Reason)
			}
			if diffs, add := Compare(got, tt.own); len(diffs) > 0 || add {
				t.Errorf("own does not fit the record set from it: %v, add %v", diffs, add)
			}
		})
	}
	if current.WorkerRegistries[0] != dc1 || len(current.WorkerRegistries) != 2 {
		t.Errorf("Replace changed the current record: %+v", current.WorkerRegistries)
	}
}
