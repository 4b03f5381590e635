package bus

import (
	"errors"
	"strconv"
	"strings"
	"testing"
)

func TestParseCount(t *testing.T) {
	tests := []struct {
		name    string
		body    string
		want    int
		wantErr string // part of the message; "" for no error
	}{
		{"Empty", "", 1, ""},
		{"WhiteSpaceOnly", " \t\r\n", 1, ""},
		{"One", "1", 1, ""},
		{"Max", "10000", 10000, ""},
		{"LeadingZeros", "0007", 7, ""},
		{"AroundWhiteSpace", "\n 42 \r\n", 42, ""},
		{"Zero", "0", 0, `count "0" is not a whole number between 1 and 10000`},
		{"ZerosOnly", "000", 0, `count "000"`},
		{"OverMax", "10001", 0, `count "10001"`},
		{"Huge", "99999999999999999999999999", 0, `count "99999999999999999999999999"`},
		{"Negative", "-1", 0, `count "-1"`},
		{"Plus", "+5", 0, `count "+5"`},
		{"Decimal", "1.0", 0, `count "1.0"`},
		{"Letters", "abc", 0, `count "abc" is not a whole number between 1 and 10000`},
		{"InnerSpace", "1 2", 0, `count "1 2"`},
		{"Hex", "0x10", 0, `count "0x10"`},
		{"Exponent", "1e3", 0, `count "1e3"`},
		{"ControlChars", "\x00", 0, `count "\x00"`},
		{"LongBodyCut", strings.Repeat("x", 500), 0, `x"... is not`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseCount([]byte(tt.body), 10000)
			if tt.wantErr == "" {
				if err != nil || got != tt.want {
					t.Fatalf("parseCount(%q) = %d, %v; want %d, nil", tt.body, got, err, tt.want)
				}
				return
			}
			if !errors.Is(err, ErrBadRequest) || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("parseCount(%q) = %d, %v; want ErrBadRequest containing %q", tt.body, got, err, tt.wantErr)
			}
			if code, _ := codeOf(err); code != 400 {
				t.Fatalf("codeOf(parseCount(%q) error) = %d, want 400", tt.body, code)
			}
		})
	}
}

func TestParseEncoding(t *testing.T) {
	tests := []struct {
		header  string
		want    Encoding
		wantErr bool
	}{
		{"", Text, false},
		{"text", Text, false},
		{"binary", Binary, false},
		{"Binary", 0, true},
		{"json", 0, true},
		{" binary", 0, true},
	}
	for _, tt := range tests {
		got, err := parseEncoding(tt.header)
		if tt.wantErr {
			if !errors.Is(err, ErrBadRequest) || !strings.Contains(err.Error(), "encoding") {
				t.Errorf("parseEncoding(%q) error = %v, want ErrBadRequest naming the encoding", tt.header, err)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("parseEncoding(%q) = %v, %v; want %v", tt.header, got, err, tt.want)
		}
	}
}

func TestParseID(t *testing.T) {
	tests := []struct {
		body    string
		want    int64
		wantErr bool
	}{
		{"1", 1, false},
		{" 1860000000000000000\n", 1860000000000000000, false},
		{"9223372036854775807", 9223372036854775807, false},
		{"9223372036854775808", 0, true},
		{"0", 0, true},
		{"-5", 0, true},
		{"+5", 0, true},
		{"", 0, true},
		{"12a", 0, true},
	}
	for _, tt := range tests {
		got, err := parseID([]byte(tt.body))
		if tt.wantErr {
			if !errors.Is(err, ErrBadRequest) {
				t.Errorf("parseID(%q) = %d, %v; want ErrBadRequest", tt.body, got, err)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("parseID(%q) = %d, %v; want %d", tt.body, got, err, tt.want)
		}
	}
}

func TestAppendIDs(t *testing.T) {
	tests := []struct {
		name string
		ids  []int64
		enc  Encoding
		want string
	}{
		{"TextOne", []int64{1001}, Text, "1001"},
		{"TextMany", []int64{1, 2, 9223372036854775807}, Text, "1\n2\n9223372036854775807"},
		{"BinaryOne", []int64{1}, Binary, "\x00\x00\x00\x00\x00\x00\x00\x01"},
		{"BinaryTwo", []int64{0x0102030405060708, 0x7fffffffffffffff}, Binary, "\x01\x02\x03\x04\x05\x06\x07\x08\x7f\xff\xff\xff\xff\xff\xff\xff"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := string(AppendIDs(nil, tt.ids, tt.enc))
			if got != tt.want {
				t.Fatalf("AppendIDs(%v, %v) = %q, want %q", tt.ids, tt.enc, got, tt.want)
			}
			back, err := decodeIDs([]byte(got), tt.enc, len(tt.ids), nil)
			if err != nil || len(back) != len(tt.ids) {
				t.Fatalf("decodeIDs(%q) = %v, %v; want %v", got, back, err, tt.ids)
			}
			for i := range back {
				if back[i] != tt.ids[i] {
					t.Fatalf("decodeIDs(%q)[%d] = %d, want %d", got, i, back[i], tt.ids[i])
				}
			}
		})
	}
}

func TestDecodeIDsRefusesBadReplies(t *testing.T) {
	tests := []struct {
		name string
		body string
		enc  Encoding
		n    int
	}{
		{"TrailingNewline", "1\n2\n", Text, 2},
		{"WrongCount", "1\n2", Text, 3},
		{"NotANumber", "1\nx", Text, 2},
		{"NotIncreasing", "2\n2", Text, 2},
		{"Decreasing", "3\n2", Text, 2},
		{"Zero", "0", Text, 1},
		{"BinaryShort", "\x00\x00\x01", Binary, 1},
		{"BinaryNegative", "\xff\xff\xff\xff\xff\xff\xff\xff", Binary, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got, err := decodeIDs([]byte(tt.body), tt.enc, tt.n, nil); err == nil {
				t.Fatalf("decodeIDs(%q, %v, %d) = %v, want an error", tt.body, tt.enc, tt.n, got)
			}
		})
	}
}

func TestErrorMatchesItsClass(t *testing.T) {
	tests := []struct {
		code int
		want error
	}{
		{400, ErrBadRequest},
		{404, ErrNotFound},
		{409, ErrConflict},
		{503, ErrUnavailable},
		{500, ErrInternal},
	}
	for _, tt := range tests {
		err := replyError(strconv.Itoa(tt.code), "why")
		if !errors.Is(err, tt.want) {
			t.Errorf("replyError(%d) = %v, want errors.Is %v", tt.code, err, tt.want)
		}
		for _, other := range tests {
			if other.code != tt.code && errors.Is(err, other.want) {
				t.Errorf("replyError(%d) also matches %v", tt.code, other.want)
			}
		}
	}
	if err := replyError("", ""); err != nil {
		t.Errorf("replyError without a code = %v, want nil", err)
	}
}
