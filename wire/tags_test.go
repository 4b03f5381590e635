package wire

import (
	"errors"
	"strings"
	"testing"
)

func TestTagEncodings(t *testing.T) {
	tests := []struct {
		name, tag, token, key string
	}{
		{"Plain", "orders", "orders", "orders"},
		{"PlainAllChars", "Az09_-", "Az09_-", "Az09_-"},
		{"Dotted", "com.acme.order", "com%2Eacme%2Eorder", "com=2Eacme=2Eorder"},
		{"Colon", "order:create", "order%3Acreate", "order=3Acreate"},
		{"Space", "order create", "order%20create", "order=20create"},
		{"Chinese", "订单", "%E8%AE%A2%E5%8D%95", "=E8=AE=A2=E5=8D=95"},
		{"Escapes", "%=", "%25%3D", "=25=3D"},
		{"Wildcards", "*>", "%2A%3E", "=2A=3E"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := TagToken(tt.tag); got != tt.token {
				t.Errorf("TagToken(%q) = %q, want %q", tt.tag, got, tt.token)
			}
			if got := TagKey(tt.tag); got != tt.key {
				t.Errorf("TagKey(%q) = %q, want %q", tt.tag, got, tt.key)
			}
			if got, err := ParseTagToken(tt.token); err != nil || got != tt.tag {
				t.Errorf("ParseTagToken(%q) = %q, %v, want %q", tt.token, got, err, tt.tag)
			}
			if got, err := ParseTagKey(tt.key); err != nil || got != tt.tag {
				t.Errorf("ParseTagKey(%q) = %q, %v, want %q", tt.key, got, err, tt.tag)
			}
		})
	}
}

func TestParseTagTokenRefuses(t *testing.T) {
	tests := []struct {
		name, token, wantMsg string
	}{
		{"Empty", "", "1 to 128"},
		{"LowerHex", "a%2ea", "upper-case hex"},
		{"CutShort", "a%2", "cut short"},
		{"CutShortEnd", "a%", "cut short"},
		{"EscapedPlain", "%61", "stands as it is"},
		{"KeyEscapeInToken", "a=2Eb", `send "a%3D2Eb"`},
		{"RawUnicode", "订单", `send "%E8%AE%A2%E5%8D%95"`},
		{"RawColon", "a:b", `send "a%3Ab"`},
		{"EscapedControl", "a%0Ab", "control character"},
		{"EscapedBadUTF8", "a%FF", "not valid UTF-8"},
		{"TooLong", strings.Repeat("a", MaxTagLen+1), "1 to 128"},
		{"TooLongEncoded", strings.Repeat("%E8%AE%A2", MaxTagLen+1), "more than 128"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseTagToken(tt.token)
			if !errors.Is(err, ErrBadRequest) || got != "" {
				t.Fatalf("ParseTagToken(%q) = %q, %v, want a 400", tt.token, got, err)
			}
			if !strings.Contains(err.Error(), tt.wantMsg) {
				t.Errorf("ParseTagToken(%q) error %q does not say %q", tt.token, err, tt.wantMsg)
			}
		})
	}
	if _, err := ParseTagKey("a%2Eb"); !errors.Is(err, ErrBadRequest) {
		t.Errorf("ParseTagKey(a%%2Eb) = %v: the token's escape is no KV key's", err)
	}
}

// A plain tag, protocol v1's only kind, costs the request path nothing.
func TestPlainTagsAllocateNothing(t *testing.T) {
	allocs := testing.AllocsPerRun(100, func() {
		if TagToken("orders") != "orders" || TagKey("orders") != "orders" {
			t.Fatal("a plain tag changed")
		}
		if tag, err := ParseTagToken("orders"); err != nil || tag != "orders" {
			t.Fatal(err)
		}
		if CheckTag("com.acme.订单") != nil {
			t.Fatal("a valid tag refused")
		}
	})
	if allocs != 0 {
		t.Errorf("%v allocations per plain tag, want 0", allocs)
	}
}

func FuzzTagEncodings(f *testing.F) {
	for _, s := range []string{"orders", "com.acme.order", "order:create", "a b", "订单", "%", "=", "%2E", "a\x00", "\xff"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		// Every valid tag round-trips through both encodings into safe characters.
		if CheckTag(s) == nil {
			token, key := TagToken(s), TagKey(s)
			if strings.ContainsAny(token, ".*> \t\r\n=") || strings.ContainsAny(key, ".*> \t\r\n%") || !isASCII(token) || !isASCII(key) {
				t.Fatalf("tag %q encodes to token %q, key %q: unsafe", s, token, key)
			}
			if got, err := ParseTagToken(token); err != nil || got != s {
				t.Fatalf("ParseTagToken(TagToken(%q)) = %q, %v", s, got, err)
			}
			if got, err := ParseTagKey(key); err != nil || got != s {
				t.Fatalf("ParseTagKey(TagKey(%q)) = %q, %v", s, got, err)
			}
		}
		// Every token accepted is the one encoding of its tag: no second subject.
		if tag, err := ParseTagToken(s); err == nil {
			if TagToken(tag) != s {
				t.Fatalf("token %q decodes to %q, whose token is %q", s, tag, TagToken(tag))
			}
		} else if !errors.Is(err, ErrBadRequest) || len(err.Error()) > 600 {
			t.Fatalf("ParseTagToken(%q) error %v: want a short 400", s, err)
		}
		if tag, err := ParseTagKey(s); err == nil && TagKey(tag) != s {
			t.Fatalf("key %q decodes to %q, whose key is %q", s, tag, TagKey(tag))
		}
	})
}
