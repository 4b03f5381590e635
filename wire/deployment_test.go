package wire

import (
	"errors"
	"strings"
	"testing"
)

// okRecord is the record of the package doc, byte for byte as Marshal writes it.
const okRecord = `{"version":1,"segment_store":{"kind":"mysql","identity":"mysql db1:3306/leaf"},` +
	`"worker_registries":[{"kind":"zk","identity":"zk /snowflake/leaf-prod","worker_id_min":0,"worker_id_max":1023}],` +
	`"snowflake":{"epoch":1288834974657,"time_bits":41,"worker_bits":10,"sequence_bits":12},` +
	`"monotonic_tags":["orders"],"written_by":"disp-1","written_at":"2026-11-24T10:00:00.000Z","reason":"first start"}`

func TestParseDeployment(t *testing.T) {
	edit := func(old, new string) string {
		if !strings.Contains(okRecord, old) {
			t.Fatalf("okRecord has no %q", old)
		}
		return strings.Replace(okRecord, old, new, 1)
	}
	ranges := func(list string) string {
		return edit(`"monotonic_tags":["orders"],`, `"monotonic_tags":["orders"],"tag_ranges":[`+list+`],`)
	}
	twoRegistries := func(second string) string {
		return edit(`"worker_id_max":1023}]`, `"worker_id_max":511},`+second+`]`)
	}
	tests := []struct {
		name    string
		in      string
		wantErr string // "" for OK
	}{
		{"OK", okRecord, ""},
		{"OKTwoRegistriesDisjoint", twoRegistries(`{"kind":"kv","identity":"kv leaf_leases","worker_id_min":512,"worker_id_max":1023}`), ""},
		{"OKOneRegistryTwoRanges", twoRegistries(`{"kind":"zk","identity":"zk /snowflake/leaf-prod","worker_id_min":100,"worker_id_max":700}`), ""},
		{"OKNoMonotonicTags", edit(`["orders"]`, `[]`), ""},
		{"ErrNewerVersion", edit(`"version":1`, `"version":2`), "version 2"},
		{"ErrUnknownField", edit(`"reason"`, `"layout":"x","reason"`), "unknown field"},
		{"ErrTrailingData", okRecord + `{}`, "more than one JSON value"},
		{"ErrNotJSON", `garbage`, "invalid character"},
		{"ErrEmpty", ``, "EOF"},
		{"ErrStoreKind", edit(`"kind":"mysql"`, `"kind":"oracle"`), "segment store"},
		{"ErrStoreIdentity", edit(`"identity":"mysql db1:3306/leaf"`, `"identity":""`), "segment store"},
		{"ErrNoRegistry", edit(`[{"kind":"zk","identity":"zk /snowflake/leaf-prod","worker_id_min":0,"worker_id_max":1023}]`, `[]`), "no worker registry"},
		{"ErrRegistryKind", edit(`"kind":"zk"`, `"kind":"etcd"`), "worker registry 0"},
		{"ErrRange", edit(`"worker_id_min":0`, `"worker_id_min":2000`), "worker IDs 2000..1023"},
		{"ErrRegistriesShareIDs", twoRegistries(`{"kind":"kv","identity":"kv leaf_leases","worker_id_min":511,"worker_id_max":1023}`), "share worker IDs"},
		{"ErrBits", edit(`"time_bits":41`, `"time_bits":42`), "sum to at most 63"},
		{"ErrNegativeEpoch", edit(`"epoch":1288834974657`, `"epoch":-1`), "epoch -1"},
		{"ErrBadTag", edit(`["orders"]`, `["or\u0001ders"]`), "monotonic tag 0"},
		{"ErrUnsortedTags", edit(`["orders"]`, `["users","orders"]`), "not sorted"},
		{"ErrRepeatedTag", edit(`["orders"]`, `["orders","orders"]`), "not sorted or repeated"},
		{"OKTagRanges", ranges(`{"tag":"invoices","bits":53,"opaque":true,"key":"f412d2d97e6120bb37a45c97"},{"tag":"web","bits":53}`), ""},
		{"ErrRangeBits", ranges(`{"tag":"web","bits":64}`), "bits 64"},
		{"ErrRangeDefault", ranges(`{"tag":"web","bits":63}`), "not written as a range of its own"},
		{"ErrRangeNoBits", ranges(`{"tag":"web","opaque":true,"key":"f412d2d97e6120bb37a45c97"}`), "not written as a range of its own"},
		{"ErrRangeNoKey", ranges(`{"tag":"web","bits":53,"opaque":true}`), "key fingerprint"},
		{"ErrRangeKeyNotOpaque", ranges(`{"tag":"web","bits":53,"key":"f412d2d97e6120bb37a45c97"}`), "not opaque"},
		{"ErrRangeBadTag", ranges(`{"tag":"w\u0001b","bits":53}`), "tag range 0"},
		{"ErrRangesUnsorted", ranges(`{"tag":"web","bits":53},{"tag":"app","bits":53}`), "tag ranges not sorted"},
		{"ErrRangeUnknownField", ranges(`{"tag":"web","bits":53,"salt":1}`), "unknown field"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d, err := ParseDeployment([]byte(tt.in))
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("ParseDeployment(%s) = %v, want no error", tt.in, err)
				}
				b, err := d.Marshal()
				if err != nil {
					t.Fatalf("Marshal: %v", err)
				}
				if string(b) != tt.in {
					t.Errorf("Marshal(ParseDeployment(x)):\n got %s\nwant %s", b, tt.in)
				}
				return
			}
			if !errors.Is(err, ErrBadDeployment) || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("ParseDeployment(%s) = %v, want ErrBadDeployment saying %q", tt.in, err, tt.wantErr)
			}
		})
	}
}

func TestDeploymentMarshalValidates(t *testing.T) {
	d, err := ParseDeployment([]byte(okRecord))
	if err != nil {
		t.Fatal(err)
	}
	d.MonotonicTags = nil
	b, err := d.Marshal()
	if err != nil || !strings.Contains(string(b), `"monotonic_tags":[]`) {
		t.Errorf("Marshal with nil tags = %s, %v; want an empty list", b, err)
	}
	if strings.Contains(string(b), "tag_ranges") {
		t.Errorf("Marshal without tag ranges = %s; want no tag_ranges field, which versions before it refuse", b)
	}
	d.TagRanges = []DeployedRange{{Tag: "web", TagRange: TagRange{Bits: 53}}}
	if got := d.RangeOf("web"); got != (TagRange{Bits: 53}) || !d.RangeOf("orders").IsDefault() {
		t.Errorf("RangeOf = %v and %v, want 53 bits and the default", got, d.RangeOf("orders"))
	}
	d.Snowflake.WorkerBits = 0
	if _, err := d.Marshal(); !errors.Is(err, ErrBadDeployment) {
		t.Errorf("Marshal of a bad layout = %v, want ErrBadDeployment", err)
	}
}

func TestDeployedRegistryRanges(t *testing.T) {
	r := func(min, max int64) DeployedRegistry {
		return DeployedRegistry{Kind: "kv", Identity: "kv leaf_leases", WorkerIDMin: min, WorkerIDMax: max}
	}
	tests := []struct {
		a, b             DeployedRegistry
		overlaps, within bool
	}{
		{r(0, 1023), r(0, 1023), true, true},
		{r(0, 511), r(0, 1023), true, true},
		{r(0, 1023), r(0, 511), true, false},
		{r(0, 511), r(512, 1023), false, false},
		{r(500, 600), r(600, 700), true, false},
		{r(7, 7), r(7, 7), true, true},
	}
	for _, tt := range tests {
		if got := tt.a.Overlaps(tt.b); got != tt.overlaps {
			t.Errorf("%d..%d Overlaps %d..%d = %v, want %v", tt.a.WorkerIDMin, tt.a.WorkerIDMax, tt.b.WorkerIDMin, tt.b.WorkerIDMax, got, tt.overlaps)
		}
		if got := tt.a.Within(tt.b); got != tt.within {
			t.Errorf("%d..%d Within %d..%d = %v, want %v", tt.a.WorkerIDMin, tt.a.WorkerIDMax, tt.b.WorkerIDMin, tt.b.WorkerIDMax, got, tt.within)
		}
	}
}
