package snowflake_test

import (
	"math"
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
		{name: "ErrInvalidConfig/sum62", layout: snowflake.Layout{Epoch: 1, TimeBits: 40, WorkerBits: 10, SequenceBits: 12}, wantErr: snowflake.ErrInvalidConfig, wantMsg: "bits sum to 62 (TimeBits 40 + WorkerBits 10 + SequenceBits 12), must be 63"},
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
		{name: "ErrInvalidConfig/layout", layout: snowflake.Layout{TimeBits: 41, WorkerBits: 10, SequenceBits: 11}, id: 1, wantErr: snowflake.ErrInvalidConfig},
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
