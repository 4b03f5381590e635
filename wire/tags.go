package wire

import "strings"

// A tag is text (CheckTag), but it travels where only a few characters may stand: as
// one token of a NATS subject (leaf.segment.<token>, leaf.pool.segment.<token>, a pool's
// consumer and message IDs) and as a JetStream KV key. Both encodings leave A-Z a-z 0-9
// _ - alone, so every tag of protocol v1 is its own token and its own key, and write
// every other byte of the tag's UTF-8 as an escape of two upper-case hex digits (RFC 3986
// percent-encoding of the bytes outside that set):
//
//	tag             subject token             KV key
//	orders          orders                    orders
//	com.acme.order  com%2Eacme%2Eorder        com=2Eacme=2Eorder
//	order:create    order%3Acreate            order=3Acreate
//	订单            %E8%AE%A2%E5%8D%95        =E8=AE=A2=E5=8D=95
//
// The token escapes with '%'; the KV key, whose characters are A-Z a-z 0-9 _ - / = .,
// with '='. Each tag has exactly one token and one key: decoding refuses anything
// else (a lower-case hex digit, an escaped byte that needs no escape, a byte that
// needed one), so that one tag is never two subjects, which a NATS permission on one of
// them would not cover, nor two keys, which would be two rows.

// Escape characters of the two encodings.
const (
	tokenEscape = '%'
	keyEscape   = '='
)

// TagToken is tag as one subject token, in the encoding above. A plain tag (IsPlainTag)
// is returned as it is, without an allocation.
func TagToken(tag string) string { return encodeTag(tag, tokenEscape) }

// ParseTagToken is the tag a subject token names: the token decoded and checked with
// CheckTag. A token that is not exactly TagToken of a valid tag is a 400 that names the
// token to send instead, when there is one. A plain token is returned as it is, without
// an allocation.
func ParseTagToken(token string) (string, error) {
	return decodeTag(token, tokenEscape, "subject token")
}

// TagKey is tag as a JetStream KV key, in the encoding above: TagToken with '=' for '%'.
func TagKey(tag string) string { return encodeTag(tag, keyEscape) }

// ParseTagKey is the tag a KV key names, as ParseTagToken does for a token.
func ParseTagKey(key string) (string, error) { return decodeTag(key, keyEscape, "KV key") }

const hexDigits = "0123456789ABCDEF"

func encodeTag(tag string, esc byte) string {
	n := 0
	for i := 0; i < len(tag); i++ {
		if !isPlainByte(tag[i]) {
			n++
		}
	}
	if n == 0 {
		return tag
	}
	var b strings.Builder
	b.Grow(len(tag) + 2*n)
	for i := 0; i < len(tag); i++ {
		c := tag[i]
		if isPlainByte(c) {
			b.WriteByte(c)
			continue
		}
		b.WriteByte(esc)
		b.WriteByte(hexDigits[c>>4])
		b.WriteByte(hexDigits[c&15])
	}
	return b.String()
}

func decodeTag(s string, esc byte, what string) (string, error) {
	if IsPlainTag(s) {
		if err := CheckTag(s); err != nil {
			return "", err
		}
		return s, nil
	}
	b := make([]byte, 0, len(s))
	for i := 0; i < len(s); i++ {
		c := s[i]
		if isPlainByte(c) {
			b = append(b, c)
			continue
		}
		if c != esc {
			return "", badEncoding(s, esc, what, i, "a character outside A-Z a-z 0-9 _ - and not an escape")
		}
		if i+2 >= len(s) {
			return "", badEncoding(s, esc, what, i, "an escape cut short")
		}
		hi, lo := unhex(s[i+1]), unhex(s[i+2])
		if hi < 0 || lo < 0 {
			return "", badEncoding(s, esc, what, i, "an escape without two upper-case hex digits")
		}
		d := byte(hi<<4 | lo)
		if isPlainByte(d) {
			return "", badEncoding(s, esc, what, i, "an escaped character that stands as it is")
		}
		b = append(b, d)
		i += 2
	}
	tag := string(b)
	if err := CheckTag(tag); err != nil {
		return "", BadRequest("%s %s: %v", what, Quote(s), err)
	}
	return tag, nil
}

// badEncoding is the 400 of a token or key that is not the encoding of a tag. When it
// is a valid tag as it stands (a client that sent the text unencoded), the message
// names the token to send instead.
func badEncoding(s string, esc byte, what string, at int, why string) error {
	if CheckTag(s) == nil {
		return BadRequest("%s %s is not in the tag encoding (%s at byte %d): send %s", what, Quote(s), why, at, Quote(encodeTag(s, esc)))
	}
	return BadRequest("%s %s is not in the tag encoding: %s at byte %d", what, Quote(s), why, at)
}

// unhex is the value of an upper-case hex digit, -1 for anything else.
func unhex(c byte) int {
	switch {
	case c >= '0' && c <= '9':
		return int(c - '0')
	case c >= 'A' && c <= 'F':
		return int(c-'A') + 10
	}
	return -1
}
