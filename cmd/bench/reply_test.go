package main

import (
	"encoding/binary"
	"errors"
	"slices"
	"strconv"
	"testing"

	"github.com/nats-io/nats.go"
)

func be(ids ...uint64) []byte {
	b := make([]byte, 0, 8*len(ids))
	for _, id := range ids {
		b = binary.BigEndian.AppendUint64(b, id)
	}
	return b
}

func TestParseReply(t *testing.T) {
	svc503 := nats.Header{"Nats-Service-Error-Code": {"503"}, "Nats-Service-Error": {"starting"}}
	noResp := nats.Header{"Status": {"503"}}
	tests := []struct {
		name    string
		h       nats.Header
		body    []byte
		batch   int
		binary  bool
		want    []uint64
		wantErr error
		wantKey string
	}{
		{"TextOne", nil, []byte("1001"), 1, false, []uint64{1001}, nil, ""},
		{"TextBatch", nil, []byte("7\n8\n19"), 3, false, []uint64{7, 8, 19}, nil, ""},
		{"TextMaxInt64", nil, []byte("9223372036854775807"), 1, false, []uint64{1<<63 - 1}, nil, ""},
		{"TextLeadingZeros", nil, []byte("007"), 1, false, []uint64{7}, nil, ""},
		{"BinaryBatch", nil, be(5, 6, 1<<62), 3, true, []uint64{5, 6, 1 << 62}, nil, ""},
		{"ErrServiceCode", svc503, nil, 1, false, nil, &ServiceError{}, "503"},
		{"ErrNoResponders", noResp, nil, 1, false, nil, ErrNoResponders, errKeyNoResponders},
		{"ErrTextEmpty", nil, nil, 1, false, nil, ErrBadReply, errKeyBadReply},
		{"ErrTextTrailingNewline", nil, []byte("1\n2\n"), 2, false, nil, ErrBadReply, errKeyBadReply},
		{"ErrTextDoubleNewline", nil, []byte("1\n\n2"), 2, false, nil, ErrBadReply, errKeyBadReply},
		{"ErrTextSpace", nil, []byte("1 2"), 2, false, nil, ErrBadReply, errKeyBadReply},
		{"ErrTextSign", nil, []byte("-5"), 1, false, nil, ErrBadReply, errKeyBadReply},
		{"ErrTextWrongCount", nil, []byte("1\n2"), 3, false, nil, ErrBadReply, errKeyBadReply},
		{"ErrTextZero", nil, []byte("0"), 1, false, nil, ErrBadReply, errKeyBadReply},
		{"ErrTextAboveInt64", nil, []byte("9223372036854775808"), 1, false, nil, ErrBadReply, errKeyBadReply},
		{"ErrTextHuge", nil, []byte("123456789012345678901234"), 1, false, nil, ErrBadReply, errKeyBadReply},
		{"ErrTextDescending", nil, []byte("5\n4"), 2, false, nil, ErrOutOfOrder, errKeyBadReply},
		{"ErrTextRepeat", nil, []byte("5\n5"), 2, false, nil, ErrOutOfOrder, errKeyBadReply},
		{"ErrBinaryShort", nil, be(1)[:7], 1, true, nil, ErrBadReply, errKeyBadReply},
		{"ErrBinaryWrongCount", nil, be(1, 2), 3, true, nil, ErrBadReply, errKeyBadReply},
		{"ErrBinaryNegative", nil, be(1 << 63), 1, true, nil, ErrBadReply, errKeyBadReply},
		{"ErrBinaryDescending", nil, be(9, 3), 2, true, nil, ErrOutOfOrder, errKeyBadReply},
		{"ErrTextWhenBinaryAsked", nil, []byte("12345678"), 2, true, nil, ErrBadReply, errKeyBadReply},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			prefix := []uint64{42} // earlier IDs in the buffer must survive a failed parse
			got, err := parseReply(tt.h, tt.body, tt.batch, tt.binary, prefix)
			switch want := tt.wantErr.(type) {
			case nil:
				if err != nil {
					t.Fatalf("parseReply(%q) error = %v, want nil", tt.body, err)
				}
			case *ServiceError:
				var se *ServiceError
				if !errors.As(err, &se) || se.Code != "503" || se.Description != "starting" {
					t.Fatalf("parseReply(%q) error = %v, want ServiceError 503 starting", tt.body, err)
				}
			default:
				if !errors.Is(err, want) {
					t.Fatalf("parseReply(%q) error = %v, want %v", tt.body, err, want)
				}
			}
			if err != nil {
				if key := errKey(err); key != tt.wantKey {
					t.Errorf("errKey(%v) = %q, want %q", err, key, tt.wantKey)
				}
			}
			if want := append([]uint64{42}, tt.want...); !slices.Equal(got, want) {
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
		body = strconv.AppendUint(body, 1860000000000000000+uint64(i), 10)
	}
	dst := make([]uint64, 0, 100)
	for b.Loop() {
		var err error
		if dst, err = parseReply(nil, body, 100, false, dst[:0]); err != nil {
			b.Fatal(err)
		}
	}
}
