package wire

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
			got, err := ParseCount([]byte(tt.body), 10000)
			if tt.wantErr == "" {
				if err != nil || got != tt.want {
					t.Fatalf("ParseCount(%q) = %d, %v; want %d, nil", tt.body, got, err, tt.want)
				}
				return
			}
			if !errors.Is(err, ErrBadRequest) || !strings.Contains(err.Error(), tt.wantErr) {
				t.Fatalf("ParseCount(%q) = %d, %v; want ErrBadRequest containing %q", tt.body, got, err, tt.wantErr)
			}
			if code := ClassCode(err); code != 400 {
				t.Fatalf("ClassCode(ParseCount(%q) error) = %d, want 400", tt.body, code)
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
		got, err := ParseEncoding(tt.header)
		if tt.wantErr {
			if !errors.Is(err, ErrBadRequest) || !strings.Contains(err.Error(), "encoding") {
				t.Errorf("ParseEncoding(%q) error = %v, want ErrBadRequest naming the encoding", tt.header, err)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("ParseEncoding(%q) = %v, %v; want %v", tt.header, got, err, tt.want)
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
		got, err := ParseID([]byte(tt.body))
		if tt.wantErr {
			if !errors.Is(err, ErrBadRequest) {
				t.Errorf("ParseID(%q) = %d, %v; want ErrBadRequest", tt.body, got, err)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("ParseID(%q) = %d, %v; want %d", tt.body, got, err, tt.want)
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
			back, err := DecodeIDs(nil, []byte(got), tt.enc)
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
	}{
		{"Empty", "", Text},
		{"TrailingNewline", "1\n2\n", Text},
		{"EmptyField", "1\n\n2", Text},
		{"NotANumber", "1\nx", Text},
		{"Plus", "+1", Text},
		{"Space", "1 ", Text},
		{"NotIncreasing", "2\n2", Text},
		{"Decreasing", "3\n2", Text},
		{"Zero", "0", Text},
		{"OverInt64", "9223372036854775808", Text},
		{"Huge", "99999999999999999999999", Text},
		{"BinaryEmpty", "", Binary},
		{"BinaryShort", "\x00\x00\x01", Binary},
		{"BinaryNegative", "\xff\xff\xff\xff\xff\xff\xff\xff", Binary},
		{"BinaryZero", "\x00\x00\x00\x00\x00\x00\x00\x00", Binary},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := DecodeIDs([]int64{42}, []byte(tt.body), tt.enc)
			if !errors.Is(err, ErrBadReply) {
				t.Fatalf("DecodeIDs(%q, %v) = %v, %v; want ErrBadReply", tt.body, tt.enc, got, err)
			}
			if (tt.name == "NotIncreasing" || tt.name == "Decreasing") != errors.Is(err, ErrOutOfOrder) {
				t.Fatalf("DecodeIDs(%q) = %v: ErrOutOfOrder exactly for well-formed IDs out of order", tt.body, err)
			}
			if len(got) != 1 || got[0] != 42 {
				t.Fatalf("DecodeIDs(%q) left dst %v, want it as it was ([42])", tt.body, got)
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
		err := ReplyError(strconv.Itoa(tt.code), "why")
		if !errors.Is(err, tt.want) {
			t.Errorf("ReplyError(%d) = %v, want errors.Is %v", tt.code, err, tt.want)
		}
		for _, other := range tests {
			if other.code != tt.code && errors.Is(err, other.want) {
				t.Errorf("ReplyError(%d) also matches %v", tt.code, other.want)
			}
		}
	}
	if err := ReplyError("", ""); err != nil {
		t.Errorf("replyError without a code = %v, want nil", err)
	}
}

func TestNameRules(t *testing.T) {
	long := func(n int) string { return strings.Repeat("a", n) }
	tests := []struct {
		name  string
		check func(string) error
		in    string
		ok    bool
	}{
		{"TagOK", CheckTag, "orders-2_B", true},
		{"TagMax", CheckTag, long(MaxTagLen), true},
		{"TagTooLong", CheckTag, long(MaxTagLen + 1), false},
		{"TagEmpty", CheckTag, "", false},
		{"TagDot", CheckTag, "com.acme.order", true},
		{"TagWildcard", CheckTag, "*", true},
		{"TagColonSpace", CheckTag, "order:create now", true},
		{"TagUnicode", CheckTag, "订单", true},
		{"TagUnicodeMax", CheckTag, strings.Repeat("订", MaxTagLen), true},
		{"TagUnicodeTooLong", CheckTag, strings.Repeat("订", MaxTagLen+1), false},
		{"TagNewline", CheckTag, "a\nb", false},
		{"TagNUL", CheckTag, "a\x00", false},
		{"TagDEL", CheckTag, "a\x7f", false},
		{"TagC1", CheckTag, "a\u0085", false},
		{"TagBadUTF8", CheckTag, "a\xff", false},
		{"TagReplacementChar", CheckTag, "a\uFFFD", true},
		{"PrefixOK", CheckPrefix, "leaf", true},
		{"PrefixMax", CheckPrefix, long(MaxPrefixLen), true},
		{"PrefixTooLong", CheckPrefix, long(MaxPrefixLen + 1), false},
		{"PrefixDot", CheckPrefix, "leaf.prod", false},
		{"PrefixEmpty", CheckPrefix, "", false},
		{"NodeOK", CheckNodeID, "host-1_a", true},
		{"NodeMax", CheckNodeID, long(MaxNodeIDLen), true},
		{"NodeTooLong", CheckNodeID, long(MaxNodeIDLen + 1), false},
		{"NodeSpace", CheckNodeID, "a b", false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.check(tt.in); (err == nil) != tt.ok {
				t.Fatalf("check(%q) = %v, want ok=%v", tt.in, err, tt.ok)
			}
		})
	}
	if err := CheckTag("a\tb"); !errors.Is(err, ErrBadRequest) {
		t.Errorf("CheckTag(a\\tb) = %v, want ErrBadRequest (a 400 on the wire)", err)
	}
}

func TestReplyAllowed(t *testing.T) {
	s := Subjects{Prefix: "leaf"}
	tests := []struct {
		reply string
		want  bool
	}{
		{"_INBOX.abc.def", true},
		{"_R_.xyz.1", true},
		{"leafy.inbox", true},
		{"my.inbox.1", true},
		{"", false},
		{"$JS.API.STREAM.PURGE.KV_leaf_leases", false},
		{"$JS.API.STREAM.DELETE.KV_leaf_segments", false},
		{"$KV.leaf_segments.orders", false},
		{"$SYS.REQ.SERVER.PING", false},
		{"$SRV.PING", false},
		{"$O.bucket.C.x", false},
		{"$JSC.anything", false},
		{"leaf", false},
		{"leaf.segment.orders", false},
		{"leaf.pool.segment.orders", false},
		{"leaf.admin.tags.add", false},
		{"leaf.time", false},
	}
	for _, tt := range tests {
		if got := s.ReplyAllowed(tt.reply); got != tt.want {
			t.Errorf("ReplyAllowed(%q) = %v, want %v", tt.reply, got, tt.want)
		}
	}
}

func TestSubjects(t *testing.T) {
	s, err := NewSubjects("leaf")
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range []struct{ got, want string }{
		{s.IDs(Segment, "orders"), "leaf.segment.orders"},
		{s.IDs(Snowflake, "any"), "leaf.snowflake.any"},
		{s.IDsWildcard(Segment), "leaf.segment.*"},
		{s.Decode(), "leaf.decode.snowflake"},
		{s.AdminTags("add"), "leaf.admin.tags.add"},
		{s.Time(), "leaf.time"},
		{s.IDs(Segment, "com.acme.order"), "leaf.segment.com%2Eacme%2Eorder"},
		{s.IDs(Segment, "订单"), "leaf.segment.%E8%AE%A2%E5%8D%95"},
		{s.Pool(Snowflake, "etl"), "leaf.pool.snowflake.etl"},
		{s.Pool(Segment, "order:create"), "leaf.pool.segment.order%3Acreate"},
		{s.PoolStream(), "LEAF_POOL"},
		{PoolConsumer(Segment, "etl"), "segment_etl"},
		{PoolConsumer(Segment, "a b"), "segment_a%20b"},
		{s.Bucket("forever"), "leaf_forever"},
	} {
		if tt.got != tt.want {
			t.Errorf("got %q, want %q", tt.got, tt.want)
		}
	}
	if _, err := NewSubjects("a.b"); err == nil {
		t.Error("NewSubjects(a.b) = nil error, want one")
	}
}
