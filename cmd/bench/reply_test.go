package main

import (
	"encoding/binary"
	"errors"
	"slices"
	"strconv"
	"testing"

	"github.com/nats-io/nats.go"

	"github.com/leafbus/leafbus/wire"
)

func be(ids ...uint64) []byte {
	b := make([]byte, 0, 8*len(ids))
	for _, id := range ids {
		b = binary.BigEndian.AppendUint64(b, id)
	}
	return b
}

// TestParseReply covers what the bench adds to wire.DecodeIDs (the headers, the count it
// asked for, telling order violations from other bad replies, the error keys); the body
// rules themselves are wire's tests.
func TestParseReply(t *testing.T) {
	svc503 := nats.Header{wire.ServiceErrorCodeHeader: {"503"}, wire.ServiceErrorHeader: {"starting"}}
	svcOdd := nats.Header{wire.ServiceErrorCodeHeader: {"oops"}, wire.ServiceErrorHeader: {"starting"}}
	noResp := nats.Header{"Status": {"503"}}
	tests := []struct {
		name    string
		h       nats.Header
		body    []byte
		batch   int
		enc     wire.Encoding
		want    []int64
		wantErr error
		wantKey string
	}{
		{"TextOne", nil, []byte("1001"), 1, wire.Text, []int64{1001}, nil, ""},
		{"TextBatch", nil, []byte("7\n8\n19"), 3, wire.Text, []int64{7, 8, 19}, nil, ""},
		{"TextMaxInt64", nil, []byte("9223372036854775807"), 1, wire.Text, []int64{1<<63 - 1}, nil, ""},
		{"TextLeadingZeros", nil, []byte("007"), 1, wire.Text, []int64{7}, nil, ""},
		{"BinaryBatch", nil, be(5, 6, 1<<62), 3, wire.Binary, []int64{5, 6, 1 << 62}, nil, ""},
		{"ErrServiceCode", svc503, nil, 1, wire.Text, nil, wire.ErrUnavailable, "503"},
		{"ErrServiceCodeNotANumber", svcOdd, nil, 1, wire.Text, nil, wire.ErrInternal, "500"},
		{"ErrNoResponders", noResp, nil, 1, wire.Text, nil, nats.ErrNoResponders, errKeyNoResponders},
		{"ErrTextEmpty", nil, nil, 1, wire.Text, nil, wire.ErrBadReply, errKeyBadReply},
		{"ErrTextTrailingNewline", nil, []byte("1\n2\n"), 2, wire.Text, nil, wire.ErrBadReply, errKeyBadReply},
		{"ErrTextDoubleNewline", nil, []byte("1\n\n2"), 2, wire.Text, nil, wire.ErrBadReply, errKeyBadReply},
		{"ErrTextSpace", nil, []byte("1 2"), 2, wire.Text, nil, wire.ErrBadReply, errKeyBadReply},
		{"ErrTextSign", nil, []byte("-5"), 1, wire.Text, nil, wire.ErrBadReply, errKeyBadReply},
		{"ErrTextWrongCount", nil, []byte("1\n2"), 3, wire.Text, nil, wire.ErrBadReply, errKeyBadReply},
		{"ErrTextZero", nil, []byte("0"), 1, wire.Text, nil, wire.ErrBadReply, errKeyBadReply},
		{"ErrTextAboveInt64", nil, []byte("9223372036854775808"), 1, wire.Text, nil, wire.ErrBadReply, errKeyBadReply},
		{"ErrTextHuge", nil, []byte("123456789012345678901234"), 1, wire.Text, nil, wire.ErrBadReply, errKeyBadReply},
		{"ErrTextDescending", nil, []byte("5\n4"), 2, wire.Text, nil, wire.ErrOutOfOrder, errKeyBadReply},
		{"ErrTextRepeat", nil, []byte("5\n5"), 2, wire.Text, nil, wire.ErrOutOfOrder, errKeyBadReply},
		{"ErrTextRepeatWrongCount", nil, []byte("5\n5"), 3, wire.Text, nil, wire.ErrOutOfOrder, errKeyBadReply},
		{"ErrTextRepeatAndZero", nil, []byte("5\n5\n0"), 3, wire.Text, nil, wire.ErrBadReply, errKeyBadReply},
		{"ErrTextRepeatTrailingNewline", nil, []byte("5\n5\n"), 2, wire.Text, nil, wire.ErrBadReply, errKeyBadReply},
		{"ErrBinaryShort", nil, be(1)[:7], 1, wire.Binary, nil, wire.ErrBadReply, errKeyBadReply},
		{"ErrBinaryWrongCount", nil, be(1, 2), 3, wire.Binary, nil, wire.ErrBadReply, errKeyBadReply},
		{"ErrBinaryNegative", nil, be(1 << 63), 1, wire.Binary, nil, wire.ErrBadReply, errKeyBadReply},
		{"ErrBinaryDescending", nil, be(9, 3), 2, wire.Binary, nil, wire.ErrOutOfOrder, errKeyBadReply},
		{"ErrBinaryDescendingShortTail", nil, be(9, 3)[:15], 2, wire.Binary, nil, wire.ErrBadReply, errKeyBadReply},
		{"ErrTextWhenBinaryAsked", nil, []byte("12345678"), 2, wire.Binary, nil, wire.ErrBadReply, errKeyBadReply},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			prefix := []int64{42} // earlier IDs in the buffer must survive a failed parse
			got, err := parseReply(tt.h, tt.body, tt.batch, tt.enc, prefix)
			if tt.wantErr == nil {
				if err != nil {
					t.Fatalf("parseReply(%q) error = %v, want nil", tt.body, err)
				}
			} else {
				if !errors.Is(err, tt.wantErr) {
					t.Fatalf("parseReply(%q) error = %v, want %v", tt.body, err, tt.wantErr)
				}
				if ooo := errors.Is(err, wire.ErrOutOfOrder); ooo != (tt.wantErr == wire.ErrOutOfOrder) {
					t.Errorf("parseReply(%q) error %v: errors.Is(wire.ErrOutOfOrder) = %v", tt.body, err, ooo)
				}
				if tt.wantErr == wire.ErrOutOfOrder && !errors.Is(err, wire.ErrBadReply) {
					t.Errorf("parseReply(%q) error %v: want it to match wire.ErrBadReply too", tt.body, err)
				}
				if key := errKey(err); key != tt.wantKey {
					t.Errorf("errKey(%v) = %q, want %q", err, key, tt.wantKey)
				}
			}
			if want := append([]int64{42}, tt.want...); !slices.Equal(got, want) {
				t.Fatalf("parseReply(%q) IDs = %v, want %v", tt.body, got, want)
			}
		})
	}
}

func BenchmarkParseReplyText100(b *testing.B) {
	b.ReportAllocs()
	var body []byte
	for i := range 100 {
		if i > 0 {
			body = append(body, '\n')
		}
		body = strconv.AppendInt(body, 1860000000000000000+int64(i), 10)
	}
	dst := make([]int64, 0, 100)
	for b.Loop() {
		var err error
		if dst, err = parseReply(nil, body, 100, wire.Text, dst[:0]); err != nil {
			b.Fatal(err)
		}
	}
}
