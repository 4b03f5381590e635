package wire

import (
	"strings"
	"testing"
)

func TestTagRange(t *testing.T) {
	const fp = "f412d2d97e6120bb37a45c97"
	tests := []struct {
		name    string
		r       TagRange
		width   int
		max     int64
		dflt    bool
		normal  TagRange
		str     string
		wantErr string
	}{
		{"Zero", TagRange{}, 63, 1<<63 - 1, true, TagRange{}, "63 bits", ""},
		{"Explicit63", TagRange{Bits: 63}, 63, 1<<63 - 1, true, TagRange{}, "63 bits", ""},
		{"JS", TagRange{Bits: 53}, 53, 1<<53 - 1, false, TagRange{Bits: 53}, "53 bits", ""},
		{"Opaque", TagRange{Opaque: true, Key: fp}, 63, 1<<63 - 1, false, TagRange{Bits: 63, Opaque: true, Key: fp}, "opaque, 63 bits, key " + fp, ""},
		{"Opaque16", TagRange{Bits: 16, Opaque: true, Key: fp}, 16, 65535, false, TagRange{Bits: 16, Opaque: true, Key: fp}, "opaque, 16 bits, key " + fp, ""},
		{"ErrNarrow", TagRange{Bits: 15}, 15, 1<<15 - 1, false, TagRange{Bits: 15}, "15 bits", "bits 15"},
		{"ErrWide", TagRange{Bits: 64}, 64, 0, false, TagRange{Bits: 64}, "64 bits", "bits 64"},
		{"ErrOpaqueNoKey", TagRange{Bits: 53, Opaque: true}, 53, 1<<53 - 1, false, TagRange{Bits: 53, Opaque: true}, "opaque, 53 bits, key ", "key fingerprint"},
		{"ErrOpaqueShortKey", TagRange{Bits: 53, Opaque: true, Key: "abc"}, 53, 1<<53 - 1, false, TagRange{Bits: 53, Opaque: true, Key: "abc"}, "opaque, 53 bits, key abc", "key fingerprint"},
		{"ErrOpaqueUpperKey", TagRange{Bits: 53, Opaque: true, Key: strings.ToUpper(fp)}, 53, 1<<53 - 1, false, TagRange{Bits: 53, Opaque: true, Key: strings.ToUpper(fp)}, "opaque, 53 bits, key " + strings.ToUpper(fp), "key fingerprint"},
		{"ErrKeyNotOpaque", TagRange{Bits: 53, Key: fp}, 53, 1<<53 - 1, false, TagRange{Bits: 53, Key: fp}, "53 bits", "not opaque"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.r.Width(); got != tt.width {
				t.Errorf("Width() = %d, want %d", got, tt.width)
			}
			if tt.width <= 63 {
				if got := tt.r.Max(); got != tt.max {
					t.Errorf("Max() = %d, want %d", got, tt.max)
				}
			}
			if got := tt.r.IsDefault(); got != tt.dflt {
				t.Errorf("IsDefault() = %v, want %v", got, tt.dflt)
			}
			if got := tt.r.Normal(); got != tt.normal {
				t.Errorf("Normal() = %+v, want %+v", got, tt.normal)
			}
			if got := tt.r.String(); got != tt.str {
				t.Errorf("String() = %q, want %q", got, tt.str)
			}
			err := tt.r.Validate()
			if tt.wantErr == "" && err != nil || tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)) {
				t.Errorf("Validate() = %v, want %q", err, tt.wantErr)
			}
		})
	}
}
