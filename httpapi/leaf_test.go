package httpapi_test

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/leafbus/leafbus/core"
	"github.com/leafbus/leafbus/httpapi"
	"github.com/leafbus/leafbus/segment"
)

const (
	textType  = "text/plain;charset=UTF-8"
	errorType = "text/plain; charset=utf-8"
	jsonType  = "application/json;charset=UTF-8"
	formType  = "Content-Type: application/x-www-form-urlencoded"
)

// leafTags are rows of leaf_alloc that Leaf serves and v1's tag rule refused: tag i
// starts at (31+i)*1000+1.
var leafTags = []string{"com.acme.order", "order:create", "order create", "订单"}

// leafServer serves segment tags s01..s30 (sNN starts at NN*1000+1, so every row of a
// table asks its own tag and expects its own bytes), then leafTags, and snowflakes of
// worker 3. Leaf's /db page shows the store's rows.
func leafServer(tb testing.TB, loc *time.Location) string {
	tb.Helper()
	var tags []segment.Tag
	for i := 1; i <= 30; i++ {
		tags = append(tags, segment.Tag{Name: fmt.Sprintf("s%02d", i), MaxID: int64(i*1000 + 1), Step: 100})
	}
	for i, name := range leafTags {
		tags = append(tags, segment.Tag{Name: name, MaxID: int64((31+i)*1000 + 1), Step: 100})
	}
	segs, store := newSegments(tb, tags...)
	sf, _ := newSnowflakes(tb, 3)
	cfg := httpapi.DefaultConfig()
	cfg.Core = coreOf(tb, func(c *core.Config) { c.Segments, c.Snowflakes = segs, sf })
	cfg.Location = loc
	cfg.Status.Sources.SegmentTags = core.SegmentState(segs)
	cfg.Status.Rows = store
	_, addr := startServer(tb, cfg)
	return addr
}

// TestLeafRequestShapes replays the requests Leaf's clients send, in the shapes Leaf's
// Spring Boot 1.5 server (Tomcat 8.5, Spring MVC 4.3 defaults) accepts, and checks the
// answers byte for byte.
func TestLeafRequestShapes(t *testing.T) {
	addr := leafServer(t, time.UTC)
	for _, c := range []struct {
		name, method, target string
		headers              []string
		body                 string
		status               int
		want                 string
	}{
		{"OK", "GET", "/api/segment/get/s01", nil, "", 200, "1001"},
		{"TrailingSlash", "GET", "/api/segment/get/s02/", nil, "", 200, "2001"},
		{"SuffixPattern", "GET", "/api/segment/get/s03.json", nil, "", 200, "3001"},
		{"SuffixCutAtLastDot", "GET", "/api/segment/get/s04.tar.gz", nil, "", 404, "segment: tag \"s04.tar\": tag not found\n"},
		{"TrailingSlashKeepsTheDot", "GET", "/api/segment/get/s05.json/", nil, "", 404, "segment: tag \"s05.json\": tag not found\n"},
		{"DottedTag", "GET", "/api/segment/get/com.acme.order/", nil, "", 200, "31001"},
		{"DottedTagCutWithoutSlash", "GET", "/api/segment/get/com.acme.order", nil, "", 404, "segment: tag \"com.acme\": tag not found\n"},
		{"DottedTagWithSuffix", "GET", "/api/segment/get/com.acme.order.json", nil, "", 200, "31002"},
		{"ColonTag", "GET", "/api/segment/get/order:create", nil, "", 200, "32001"},
		{"ColonTagEncoded", "GET", "/api/segment/get/order%3Acreate", nil, "", 200, "32002"},
		{"SpaceTag", "GET", "/api/segment/get/order%20create", nil, "", 200, "33001"},
		{"ChineseTag", "GET", "/api/segment/get/%E8%AE%A2%E5%8D%95", nil, "", 200, "34001"},
		{"EncodedLetter", "GET", "/api/segment/get/%7306", nil, "", 200, "6001"},
		{"EncodedSlash", "GET", "/api/segment/get/s07%2Fx", nil, "", 400, "path \"/api/segment/get/s07%2Fx\" holds an encoded slash (%2F), which Leaf's server refuses\n"},
		{"EncodedSlashLowerCase", "GET", "/api/segment/get/s07%2fx", nil, "", 400, "path \"/api/segment/get/s07%2fx\" holds an encoded slash (%2F), which Leaf's server refuses\n"},
		{"PathParameter", "GET", "/api/segment/get/s08;jsessionid=0A1B", nil, "", 200, "8001"},
		{"DoubleSlashes", "GET", "//api//segment/get/s09", nil, "", 200, "9001"},
		{"DotSegments", "GET", "/api/snowflake/../segment/get/./s10", nil, "", 200, "10001"},
		{"AboveTheRoot", "GET", "/../api/segment/get/s10", nil, "", 400, "path \"/../api/segment/get/s10\" climbs above the root\n"},
		{"EmptyKey", "GET", "/api/segment/get/", nil, "", 404, "no such path: /api/segment/get/\n"},
		{"ExtraSegment", "GET", "/api/segment/get/s11/x", nil, "", 404, "no such path: /api/segment/get/s11/x\n"},
		{"ErrTagNotFound", "GET", "/api/segment/get/nosuch", nil, "", 404, "segment: tag \"nosuch\": tag not found\n"},
		{"PunctuationTag", "GET", "/api/segment/get/bad!tag", nil, "", 404, "segment: tag \"bad!tag\": tag not found\n"},
		{"BadTag", "GET", "/api/segment/get/bad%01tag", nil, "", 400, "tag \"bad\\x01tag\" holds the control character U+0001\n"},
		{"BadTagUTF8", "GET", "/api/segment/get/bad%FFtag", nil, "", 400, "tag \"bad\\xfftag\" is not valid UTF-8\n"},
		{"HEAD", "HEAD", "/api/segment/get/s12", nil, "", 200, ""},
		{"POST", "POST", "/api/segment/get/s13", nil, "", 200, "13001"},
		{"PUT", "PUT", "/api/segment/get/s14", nil, "", 200, "14001"},
		{"DELETE", "DELETE", "/api/segment/get/s15", nil, "", 200, "15001"},
		{"TRACE", "TRACE", "/api/segment/get/s16", nil, "", 405, "method TRACE not allowed\n"},
		{"Count", "GET", "/api/segment/get/s17?count=3", nil, "", 200, "17001\n17002\n17003"},
		{"CountInAPOSTForm", "POST", "/api/segment/get/s18", []string{formType}, "count=2", 200, "18001\n18002"},
		{"CountLeadingZeros", "GET", "/api/segment/get/s19?count=002", nil, "", 200, "19001\n19002"},
		{"CountEmpty", "GET", "/api/segment/get/s20?count=", nil, "", 200, "20001"},
		{"CountMax", "GET", "/api/segment/get/s21/?count=10000", nil, "", 200, ""}, // checked below
		{"CountZero", "GET", "/api/segment/get/s22?count=0", nil, "", 400, "count \"0\" is not a whole number between 1 and 10000\n"},
		{"CountTooMany", "GET", "/api/segment/get/s22?count=10001", nil, "", 400, "count \"10001\" is not a whole number between 1 and 10000\n"},
		{"CountNotANumber", "GET", "/api/segment/get/s22?count=abc", nil, "", 400, "count \"abc\" is not a whole number between 1 and 10000\n"},
		{"CountNegative", "GET", "/api/segment/get/s22?count=-1", nil, "", 400, "count \"-1\" is not a whole number between 1 and 10000\n"},
		{"CountTwice", "GET", "/api/segment/get/s22?count=1&count=2", nil, "", 400, "count \"1,2\" is not a whole number between 1 and 10000\n"},
		{"UnknownPath", "GET", "/api/other/get/s01", nil, "", 404, "no such path: /api/other/get/s01\n"},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := raw(t, addr, c.method, c.target, c.headers, c.body)
			if got.status != c.status {
				t.Fatalf("%s %s: status %d (%q), want %d", c.method, c.target, got.status, got.body, c.status)
			}
			if c.name == "CountMax" {
				checkRun(t, got.body, 21001, 10000)
				return
			}
			if got.body != c.want {
				t.Errorf("%s %s: body %q, want %q", c.method, c.target, got.body, c.want)
			}
			switch {
			case c.status == 200 && strings.HasSuffix(c.target, ".json"):
				checkHeader(t, got, "Content-Type", jsonType) // Spring's path extension
			case c.status == 200:
				checkHeader(t, got, "Content-Type", textType)
			default:
				checkHeader(t, got, "Content-Type", errorType)
			}
		})
	}
}

// checkRun checks body is n consecutive IDs from first, one per line, no trailing newline.
func checkRun(t *testing.T, body string, first int64, n int) {
	t.Helper()
	want := make([]byte, 0, n*6)
	for i := range n {
		if i > 0 {
			want = append(want, '\n')
		}
		want = strconv.AppendInt(want, first+int64(i), 10)
	}
	if body != string(want) {
		t.Errorf("body of %d bytes is not the %d IDs from %d one per line (first bytes %q)", len(body), n, first, body[:min(len(body), 40)])
	}
}

func checkHeader(t *testing.T, a answer, name, want string) {
	t.Helper()
	if got := a.header.Get(name); got != want {
		t.Errorf("%s: %q, want %q", name, got, want)
	}
}

// TestHEADIssuesLikeGET: Leaf's servlet runs the handler for HEAD and drops the body,
// so HEAD takes an ID (a harmless gap) and says how long the body would have been.
func TestHEADIssuesLikeGET(t *testing.T) {
	addr := leafServer(t, time.UTC)
	head := raw(t, addr, "HEAD", "/api/segment/get/s01", nil, "")
	if head.status != 200 || head.body != "" || head.header.Get("Content-Length") != "4" {
		t.Fatalf("HEAD: status %d, body %q, Content-Length %q, want 200, no body, 4", head.status, head.body, head.header.Get("Content-Length"))
	}
	if got := raw(t, addr, "GET", "/api/segment/get/s01", nil, ""); got.body != "1002" {
		t.Errorf("GET after HEAD: %q, want 1002 (HEAD took 1001)", got.body)
	}
}

// TestOPTIONSTakesNoID: Spring 4.3 answers OPTIONS itself; no ID is taken.
func TestOPTIONSTakesNoID(t *testing.T) {
	addr := leafServer(t, time.UTC)
	opt := raw(t, addr, "OPTIONS", "/api/segment/get/s01", nil, "")
	if opt.status != 200 || opt.body != "" || opt.header.Get("Allow") != "GET,HEAD,POST,PUT,PATCH,DELETE,OPTIONS" {
		t.Fatalf("OPTIONS: status %d, body %q, Allow %q", opt.status, opt.body, opt.header.Get("Allow"))
	}
	if got := raw(t, addr, "GET", "/api/segment/get/s01", nil, ""); got.body != "1001" {
		t.Errorf("GET after OPTIONS: %q, want 1001", got.body)
	}
}

// TestSnowflakeShapes asks in order, so the sequence numbers are known: the clock
// stands still and sequences are dense.
func TestSnowflakeShapes(t *testing.T) {
	addr := leafServer(t, time.UTC)
	id := func(seq int64) string { return strconv.FormatInt(sfID(3, seq), 10) }
	for _, c := range []struct {
		method, target string
		status         int
		want           string
	}{
		{"GET", "/api/snowflake/get/anything", 200, id(0)},
		{"GET", "/api/snowflake/get/orders/", 200, id(1)},
		{"POST", "/api/snowflake/get/orders.json", 200, id(2)},
		{"GET", "/api/snowflake/get/orders?count=3", 200, id(3) + "\n" + id(4) + "\n" + id(5)},
		{"GET", "/api/snowflake/get/x?count=0", 400, "count \"0\" is not a whole number between 1 and 10000\n"},
		// Leaf ignores the key: no key is a reason to refuse a snowflake ID.
		{"GET", "/api/snowflake/get/biz:order", 200, id(6)},
		{"GET", "/api/snowflake/get/com.acme.order/", 200, id(7)},
		{"GET", "/api/snowflake/get/bad%20tag", 200, id(8)},
		{"GET", "/api/snowflake/get/bad%01tag", 200, id(9)},
		{"GET", "/api/snowflake/get/" + strings.Repeat("k", 8000), 200, id(10)},
		{"GET", "/api/snowflake/get/x", 200, id(11)},
	} {
		got := raw(t, addr, c.method, c.target, nil, "")
		if got.status != c.status || got.body != c.want {
			t.Errorf("%s %s: %d %q, want %d %q", c.method, c.target, got.status, got.body, c.status, c.want)
		}
	}
}

// leafExample is the ID of the example in Leaf's LeafMonitorController: worker 39,
// sequence 3448, at 1567733700834 (2019-09-06 09:35:00.834 in China Standard Time).
var leafExample = strconv.FormatInt((1567733700834-1288834974657)<<22|39<<12|3448, 10)

// TestDecodeSnowflakeId checks Leaf's JSON byte for byte: every value a string, the
// time in the process's zone (Leaf: the JVM's default zone), the keys in the order
// Jackson writes Leaf's HashMap; for any value of snowflakeId a 200, decoded as Leaf's
// Long.parseLong and shifts decode it, or Leaf's errorMsg.
func TestDecodeSnowflakeId(t *testing.T) {
	cst := time.FixedZone("CST", 8*3600)
	addrCST, addrUTC := leafServer(t, cst), leafServer(t, time.UTC)
	ours := strconv.FormatInt(sfID(3, 17), 10)
	const oursJSON = `{"workerId":"3","sequenceId":"17","timestamp":"1763792400123(2025-11-22 06:20:00.123)"}`
	const errorMsg = `{"errorMsg":"snowflake Id反解析发生异常!"}`
	for _, c := range []struct {
		name, addr, method, target string
		headers                    []string
		body                       string
		status                     int
		want                       string
	}{
		{"LeafsOwnExample", addrCST, "GET", "/decodeSnowflakeId?snowflakeId=" + leafExample, nil, "", 200,
			`{"workerId":"39","sequenceId":"3448","timestamp":"1567733700834(2019-09-06 09:35:00.834)"}`},
		{"UTC", addrUTC, "GET", "/decodeSnowflakeId?snowflakeId=" + ours, nil, "", 200, oursJSON},
		{"Suffix", addrUTC, "GET", "/decodeSnowflakeId.json?snowflakeId=" + ours, nil, "", 200, oursJSON},
		{"TrailingSlash", addrUTC, "GET", "/decodeSnowflakeId/?snowflakeId=" + ours, nil, "", 200, oursJSON},
		{"POSTForm", addrUTC, "POST", "/decodeSnowflakeId", []string{formType}, "snowflakeId=" + ours, 200, oursJSON},
		{"AcceptText", addrUTC, "GET", "/decodeSnowflakeId?snowflakeId=" + ours, []string{"Accept: text/plain"}, "", 200, oursJSON},
		{"Missing", addrUTC, "GET", "/decodeSnowflakeId", nil, "", 400, "required parameter 'snowflakeId' is not present\n"},
		{"Zero", addrUTC, "GET", "/decodeSnowflakeId?snowflakeId=0", nil, "", 200,
			`{"workerId":"0","sequenceId":"0","timestamp":"1288834974657(2010-11-04 01:42:54.657)"}`},
		{"Small", addrUTC, "GET", "/decodeSnowflakeId?snowflakeId=123", nil, "", 200,
			`{"workerId":"0","sequenceId":"123","timestamp":"1288834974657(2010-11-04 01:42:54.657)"}`},
		{"MinusOne", addrUTC, "GET", "/decodeSnowflakeId?snowflakeId=-1", nil, "", 200,
			`{"workerId":"1023","sequenceId":"4095","timestamp":"1288834974656(2010-11-04 01:42:54.656)"}`},
		{"MinLong", addrUTC, "GET", "/decodeSnowflakeId?snowflakeId=-9223372036854775808", nil, "", 200,
			`{"workerId":"0","sequenceId":"0","timestamp":"-910188280895(1941-02-27 09:55:19.105)"}`},
		{"PlusSign", addrUTC, "GET", "/decodeSnowflakeId?snowflakeId=%2B123", nil, "", 200,
			`{"workerId":"0","sequenceId":"123","timestamp":"1288834974657(2010-11-04 01:42:54.657)"}`},
		{"ArabicIndicDigits", addrUTC, "GET", "/decodeSnowflakeId?snowflakeId=%D9%A1%D9%A2%D9%A3", nil, "", 200,
			`{"workerId":"0","sequenceId":"123","timestamp":"1288834974657(2010-11-04 01:42:54.657)"}`},
		{"FullwidthDigits", addrUTC, "GET", "/decodeSnowflakeId?snowflakeId=%EF%BC%91%EF%BC%92%EF%BC%93", nil, "", 200,
			`{"workerId":"0","sequenceId":"123","timestamp":"1288834974657(2010-11-04 01:42:54.657)"}`},
		{"ErrorMsg/NotANumber", addrUTC, "GET", "/decodeSnowflakeId?snowflakeId=abc", nil, "", 200, errorMsg},
		{"ErrorMsg/Empty", addrUTC, "GET", "/decodeSnowflakeId?snowflakeId=", nil, "", 200, errorMsg},
		{"ErrorMsg/Space", addrUTC, "GET", "/decodeSnowflakeId?snowflakeId=+123", nil, "", 200, errorMsg},
		{"ErrorMsg/OnlySign", addrUTC, "GET", "/decodeSnowflakeId?snowflakeId=-", nil, "", 200, errorMsg},
		{"ErrorMsg/TooBig", addrUTC, "GET", "/decodeSnowflakeId?snowflakeId=9223372036854775808", nil, "", 200, errorMsg},
		{"ErrorMsg/TooSmall", addrUTC, "GET", "/decodeSnowflakeId?snowflakeId=-9223372036854775809", nil, "", 200, errorMsg},
		{"ErrorMsg/Decimal", addrUTC, "GET", "/decodeSnowflakeId?snowflakeId=1.5", nil, "", 200, errorMsg},
		{"ErrorMsg/Twice", addrUTC, "GET", "/decodeSnowflakeId?snowflakeId=1&snowflakeId=2", nil, "", 200, errorMsg},
		{"ErrorMsg/SupplementaryDigit", addrUTC, "GET", "/decodeSnowflakeId?snowflakeId=%F0%9D%9F%8F", nil, "", 200, errorMsg},
	} {
		t.Run(c.name, func(t *testing.T) {
			got := raw(t, c.addr, c.method, c.target, c.headers, c.body)
			if got.status != c.status || got.body != c.want {
				t.Fatalf("%s %s: %d %q, want %d %q", c.method, c.target, got.status, got.body, c.status, c.want)
			}
			if c.status == http.StatusOK {
				checkHeader(t, got, "Content-Type", jsonType)
			}
		})
	}
}
