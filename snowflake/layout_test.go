package snowflake_test

import (
	"math"
	"strings"
	"testing"
	"time"

	"github.com/leafbus/leafbus/internal/testutil"
	"github.com/leafbus/leafbus/snowflake"
)

func TestLayoutValidate(t *testing.T) {
	def := snowflake.DefaultLayout()
	tests := []struct {
		name    string
		layout  snowflake.Layout
		wantErr error
		wantMsg string // a part of the message that names field, value and bound
	}{
		{name: "OK/default", layout: def},
		{name: "OK/epoch0", layout: snowflake.Layout{Epoch: 0, TimeBits: 41, WorkerBits: 10, SequenceBits: 12}},
		{name: "OK/lopsided", layout: snowflake.Layout{Epoch: 1, TimeBits: 61, WorkerBits: 1, SequenceBits: 1}},
		{name: "OK/latestEpoch", layout: snowflake.Layout{Epoch: math.MaxInt64 - (1<<41 - 1), TimeBits: 41, WorkerBits: 10, SequenceBits: 12}},
		{name: "ErrInvalidConfig/zero", layout: snowflake.Layout{}, wantErr: snowflake.ErrInvalidConfig, wantMsg: "TimeBits is 0, must be at least 1"},
		{name: "ErrInvalidConfig/timeBits", layout: snowflake.Layout{Epoch: 1, TimeBits: 0, WorkerBits: 51, SequenceBits: 12}, wantErr: snowflake.ErrInvalidConfig, wantMsg: "TimeBits is 0"},
		{name: "ErrInvalidConfig/workerBits", layout: snowflake.Layout{Epoch: 1, TimeBits: 52, WorkerBits: -1, SequenceBits: 12}, wantErr: snowflake.ErrInvalidConfig, wantMsg: "WorkerBits is -1, must be at least 1"},
		{name: "ErrInvalidConfig/sequenceBits", layout: snowflake.Layout{Epoch: 1, TimeBits: 41, WorkerBits: 22, SequenceBits: 0}, wantErr: snowflake.ErrInvalidConfig, wantMsg: "SequenceBits is 0"},
		{name: "OK/sum62", layout: snowflake.Layout{Epoch: 1, TimeBits: 40, WorkerBits: 10, SequenceBits: 12}},
		{name: "ErrInvalidConfig/sum64", layout: snowflake.Layout{Epoch: 1, TimeBits: 42, WorkerBits: 10, SequenceBits: 12}, wantErr: snowflake.ErrInvalidConfig, wantMsg: "sum to 64"},
		{name: "ErrInvalidConfig/negativeEpoch", layout: snowflake.Layout{Epoch: -1, TimeBits: 41, WorkerBits: 10, SequenceBits: 12}, wantErr: snowflake.ErrInvalidConfig, wantMsg: "Epoch is -1, must be at least 0"},
		{name: "ErrInvalidConfig/epochTooLate", layout: snowflake.Layout{Epoch: math.MaxInt64 - (1<<41 - 1) + 1, TimeBits: 41, WorkerBits: 10, SequenceBits: 12}, wantErr: snowflake.ErrInvalidConfig, wantMsg: "with 41 time bits"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.layout.Validate()
			testutil.CheckErr(t, "Validate()", err, tt.wantErr, tt.wantMsg)
		})
	}
}

func TestLayoutLimits(t *testing.T) {
	tests := []struct {
		name                string
		layout              snowflake.Layout
		wantWorker, wantSeq int64
		wantMaxTS           int64
		wantMaxTime         string
	}{
		{
			name: "default", layout: snowflake.DefaultLayout(),
			wantWorker: 1023, wantSeq: 4095, wantMaxTS: 1288834974657 + 1<<41 - 1,
			wantMaxTime: "2080-07-10T17:30:30.208Z",
		},
		{
			name: "unixEpoch/39+12+12", layout: snowflake.Layout{Epoch: 0, TimeBits: 39, WorkerBits: 12, SequenceBits: 12},
			wantWorker: 4095, wantSeq: 4095, wantMaxTS: 1<<39 - 1,
			wantMaxTime: "1987-06-03T21:56:53.887Z",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := tt.layout
			if got := l.MaxWorkerID(); got != tt.wantWorker {
				t.Errorf("MaxWorkerID() = %d, want %d", got, tt.wantWorker)
			}
			if got := l.MaxSequence(); got != tt.wantSeq {
				t.Errorf("MaxSequence() = %d, want %d", got, tt.wantSeq)
			}
			if got := l.MaxTimestamp(); got != tt.wantMaxTS {
				t.Errorf("MaxTimestamp() = %d, want %d", got, tt.wantMaxTS)
			}
			if got := time.UnixMilli(l.MaxTimestamp()).UTC().Format(time.RFC3339Nano); got != tt.wantMaxTime {
				t.Errorf("MaxTimestamp() is %s, want %s", got, tt.wantMaxTime)
			}
		})
	}
}

func TestLayoutDecode(t *testing.T) {
	def := snowflake.DefaultLayout()
	tests := []struct {
		name    string
		layout  snowflake.Layout
		id      int64
		want    snowflake.Decoded
		wantErr error
	}{
		{name: "OK/smallest", layout: def, id: 1, want: snowflake.Decoded{ID: 1, Timestamp: def.Epoch, Sequence: 1}},
		{name: "OK/firstMillisecond", layout: def, id: 1 << 22, want: snowflake.Decoded{ID: 1 << 22, Timestamp: def.Epoch + 1}},
		{
			name: "OK/parts", layout: def, id: 1000<<22 | 3<<12 | 17,
			want: snowflake.Decoded{ID: 1000<<22 | 3<<12 | 17, Timestamp: def.Epoch + 1000, WorkerID: 3, Sequence: 17},
		},
		{
			name: "OK/maxInt64", layout: def, id: math.MaxInt64,
			want: snowflake.Decoded{ID: math.MaxInt64, Timestamp: def.MaxTimestamp(), WorkerID: 1023, Sequence: 4095},
		},
		{
			name: "OK/otherLayout", layout: snowflake.Layout{Epoch: 5, TimeBits: 50, WorkerBits: 5, SequenceBits: 8},
			id: 7<<13 | 31<<8 | 255, want: snowflake.Decoded{ID: 7<<13 | 31<<8 | 255, Timestamp: 12, WorkerID: 31, Sequence: 255},
		},
		{name: "ErrInvalidID/zero", layout: def, id: 0, wantErr: snowflake.ErrInvalidID},
		{name: "ErrInvalidID/negative", layout: def, id: -1 << 62, wantErr: snowflake.ErrInvalidID},
		{name: "ErrInvalidID/minInt64", layout: def, id: math.MinInt64, wantErr: snowflake.ErrInvalidID},
		{name: "ErrInvalidConfig/layout", layout: snowflake.Layout{TimeBits: 41, WorkerBits: 10, SequenceBits: 13}, id: 1, wantErr: snowflake.ErrInvalidConfig},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := tt.layout.Decode(tt.id)
			testutil.CheckErr(t, "Decode()", err, tt.wantErr, "")
			if err == nil && got != tt.want {
				t.Errorf("Decode(%d) = %+v, want %+v", tt.id, got, tt.want)
			}
		})
	}
}

func TestDecodedTime(t *testing.T) {
	d := snowflake.Decoded{Timestamp: 1763790000123}
	got := d.Time()
	if want := time.Date(2025, 11, 22, 5, 40, 0, 123e6, time.UTC); !got.Equal(want) || got.Location() != time.UTC {
		t.Errorf("Time() = %v, want %v in UTC", got, want)
	}
}

// TestNamedLayouts: leaf is Leaf's 41+10+12; js53 keeps every ID at or below 2^53-1 (the
// largest integer a JavaScript Number holds exactly) for at least 50 years from its
// epoch, and a generator on it never issues one above, even at its last millisecond;
// names round-trip, and an unknown name is refused naming the two.
func TestNamedLayouts(t *testing.T) {
	leaf, err := snowflake.NamedLayout(snowflake.LayoutLeaf)
	if err != nil || leaf != snowflake.DefaultLayout() || leaf.Name() != "leaf" || leaf.MaxID() != math.MaxInt64 {
		t.Fatalf("NamedLayout(leaf) = %+v, %v (name %q, max %d); want Leaf's 41+10+12", leaf, err, leaf.Name(), leaf.MaxID())
	}
	js, err := snowflake.NamedLayout(snowflake.LayoutJS53)
	if err != nil || js.Validate() != nil || js.Name() != "js53" {
		t.Fatalf("NamedLayout(js53) = %+v, %v", js, err)
	}
	const maxSafe = 1<<53 - 1 // Number.MAX_SAFE_INTEGER
	if js.MaxID() != maxSafe || js.Bits() != 53 {
		t.Fatalf("js53 MaxID %d (%d bits), want %d", js.MaxID(), js.Bits(), int64(maxSafe))
	}
	if years := time.UnixMilli(js.MaxTimestamp()).Sub(time.UnixMilli(js.Epoch)).Hours() / 24 / 365.25; years < 50 {
		t.Fatalf("js53 lasts %.1f years from its epoch, want at least 50", years)
	}
	if js.MaxWorkerID() != 31 || js.MaxSequence() != 127 {
		t.Fatalf("js53: workers 0..%d, sequence 0..%d; want 0..31 and 0..127", js.MaxWorkerID(), js.MaxSequence())
	}
	// The last millisecond the layout encodes, the highest worker: the highest IDs it can
	// issue are still safe.
	clock := snowflake.NewFakeClock(time.UnixMilli(js.MaxTimestamp()))
	g, err := snowflake.New(snowflake.Config{Layout: js, WorkerID: js.MaxWorkerID(), Clock: clock, DenseSequence: true})
	if err != nil {
		t.Fatal(err)
	}
	ids := make([]int64, js.MaxSequence()+1)
	if err := g.Fill(ids); err != nil {
		t.Fatalf("Fill at js53's last millisecond: %v", err)
	}
	if last := ids[len(ids)-1]; last != maxSafe {
		t.Fatalf("the last ID of js53's last millisecond is %d, want exactly 2^53-1", last)
	}
	if _, err := snowflake.NamedLayout("js"); err == nil || !strings.Contains(err.Error(), "leaf or js53") {
		t.Fatalf("NamedLayout(js) = %v, want an error naming leaf and js53", err)
	}
	if got := (snowflake.Layout{TimeBits: 43, WorkerBits: 8, SequenceBits: 12}).Name(); got != "43+8+12" {
		t.Fatalf("Name of an unnamed layout = %q, want 43+8+12", got)
	}
}

// TestDecodeAboveLayout: an ID above a narrow layout's largest is no ID of it.
func TestDecodeAboveLayout(t *testing.T) {
	js, _ := snowflake.NamedLayout(snowflake.LayoutJS53)
	if _, err := js.Decode(js.MaxID()); err != nil {
		t.Fatalf("Decode(2^53-1) under js53: %v", err)
	}
	_, err := js.Decode(js.MaxID() + 1)
	testutil.CheckErr(t, "Decode(2^53) under js53", err, snowflake.ErrInvalidID, "the largest ID of the js53 layout")
}
