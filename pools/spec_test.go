package pools

import (
	"errors"
	"strings"
	"testing"

	"github.com/leafbus/leafbus/segment"
	"github.com/leafbus/leafbus/wire"
)

// TestParseSpec: --pool names the tag in the subject encoding, so any tag fits between
// the colons and in LEAFBUS_POOL's comma-separated list, and String gives it back.
func TestParseSpec(t *testing.T) {
	for _, tt := range []struct {
		name, in string
		want     Spec
		wantErr  error
	}{
		{"OK", "segment:orders:1000:64", Spec{wire.Segment, "orders", 1000, 64}, nil},
		{"OK/Encoded", "snowflake:order%3Acreate%2C%E8%AE%A2%E5%8D%95:5:2", Spec{wire.Snowflake, "order:create,订单", 5, 2}, nil},
		{"ErrInvalidTag/Raw", "segment:订单:5:2", Spec{}, segment.ErrInvalidTag},
		{"ErrInvalidTag/ConsumerTooLong", "segment:" + strings.Repeat("%E8%AE%A2", 28) + ":5:2", Spec{}, segment.ErrInvalidTag},
		{"ErrColonUnencoded", "segment:order:create:5:2", Spec{}, nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseSpec(tt.in)
			if tt.want == (Spec{}) {
				if err == nil || (tt.wantErr != nil && !errors.Is(err, tt.wantErr)) {
					t.Fatalf("ParseSpec(%q) = %+v, %v; want an error (%v)", tt.in, got, err, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("ParseSpec(%q) = %+v, %v; want %+v", tt.in, got, err, tt.want)
			}
			if got.String() != tt.in {
				t.Errorf("String() = %q, want %q", got.String(), tt.in)
			}
		})
	}
}
