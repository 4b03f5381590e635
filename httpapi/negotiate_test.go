package httpapi_test

import (
	"strings"
	"testing"
	"time"
)

// TestContentNegotiation: the ID endpoints answer the type Spring MVC 4.3 would pick
// for Leaf's String result, by Accept and the path's suffix, reduced to JSON or text:
// application/json when a JSON type wins, text/plain otherwise; the body is the same
// digits either way. Each row says what Spring picks.
func TestContentNegotiation(t *testing.T) {
	addr := leafServer(t, time.UTC)
	for _, c := range []struct {
		name, path string
		accept     []string
		want       string
	}{
		{"NoAccept", "/api/segment/get/s01", nil, textType},
		{"Any", "/api/segment/get/s01", []string{"*/*"}, textType},
		{"JSON", "/api/segment/get/s01", []string{"application/json"}, jsonType},
		{"JSONUpperCase", "/api/segment/get/s01", []string{"Application/JSON"}, jsonType},
		// RestTemplate.getForObject(url, Long.class): Jackson's types.
		{"RestTemplateLong", "/api/segment/get/s01", []string{"application/json, application/*+json"}, jsonType},
		// RestTemplate.getForObject(url, String.class): String's converter first.
		{"RestTemplateString", "/api/segment/get/s01", []string{"text/plain, application/json, application/*+json, */*"}, textType},
		{"JSONThenAny", "/api/segment/get/s01", []string{"application/json, */*"}, jsonType},
		{"AnyThenJSON", "/api/segment/get/s01", []string{"*/*, application/json"}, textType}, // */* meets text/plain first; types differ, so order decides
		{"TextPreferredByQuality", "/api/segment/get/s01", []string{"application/json;q=0.5, text/plain"}, textType},
		{"JSONPreferredByQuality", "/api/segment/get/s01", []string{"text/plain;q=0.2, application/json;q=0.9"}, jsonType},
		{"TwoHeaders", "/api/segment/get/s01", []string{"application/json;q=0.1", "text/plain;q=0.5"}, textType},
		{"VendorJSON", "/api/segment/get/s01", []string{"application/vnd.leaf+json"}, jsonType},
		{"OnlyWildcardJSON", "/api/segment/get/s01", []string{"application/*+json"}, textType}, // no concrete type: octet-stream in Spring
		{"ApplicationWildcard", "/api/segment/get/s01", []string{"application/*"}, jsonType},
		{"Browser", "/api/segment/get/s01", []string{"text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"}, textType},
		{"BadRange", "/api/segment/get/s01", []string{"json"}, textType},
		{"BadQuality", "/api/segment/get/s01", []string{"application/json;q=2"}, textType},
		{"SuffixJSON", "/api/segment/get/s01.json", nil, jsonType},
		{"SuffixJSONOverAccept", "/api/segment/get/s01.json", []string{"text/plain"}, jsonType},
		{"SuffixOtherLeavesAccept", "/api/segment/get/com.acme.order.txt", []string{"application/json"}, jsonType},
		{"TrailingSlashNoSuffix", "/api/segment/get/s01.json/", nil, textType},
		{"Snowflake", "/api/snowflake/get/any", []string{"application/json"}, jsonType},
	} {
		t.Run(c.name, func(t *testing.T) {
			var headers []string
			for _, a := range c.accept {
				headers = append(headers, "Accept: "+a)
			}
			got := raw(t, addr, "GET", c.path, headers, "")
			if got.status != 200 && got.status != 404 {
				t.Fatalf("GET %s: %d %q", c.path, got.status, got.body)
			}
			if got.status == 200 {
				checkHeader(t, got, "Content-Type", c.want)
				if strings.TrimLeft(got.body, "0123456789") != "" {
					t.Errorf("GET %s: body %q, want the digits alone", c.path, got.body)
				}
			}
		})
	}
}

// TestLeafMonitorPages: /cache and /db answer 200 with Leaf's tables (not a redirect),
// for any method, as Leaf's @RequestMapping; names are HTML-escaped and numbers grouped
// by thousands as Leaf's FreeMarker templates show them.
func TestLeafMonitorPages(t *testing.T) {
	addr := leafServer(t, time.UTC)
	if got := raw(t, addr, "GET", "/api/segment/get/s01", nil, ""); got.body != "1001" {
		t.Fatalf("first ID of s01: %q", got.body)
	}
	for _, c := range []struct {
		method, path string
		want         []string
	}{
		{"GET", "/cache", []string{"<th>name</th>", "<th>init</th>", "<th>step1</th>",
			"<tr>\n<td>s01</td>\n<td>true</td>\n<td>", "<td>1,002</td>\n<td>1,101</td>\n<td>100</td>"}},
		{"POST", "/cache/", []string{"<th>value0</th>"}},
		{"GET", "/cache.html", []string{"<th>max1</th>"}},
		{"GET", "/db", []string{"<th>tag</th>", "<th>max</th>", "<th>step</th>", "<th>update</th>",
			"<tr>\n<td>s01</td>\n<td>1,101</td>\n<td>100</td>", "<td>s30</td>\n<td>30,001</td>",
			"<td>com.acme.order</td>", "<td>order:create</td>", "<td>订单</td>"}},
		{"HEAD", "/db/", nil},
	} {
		got := raw(t, addr, c.method, c.path, nil, "")
		if got.status != 200 {
			t.Fatalf("%s %s: %d %q, want 200", c.method, c.path, got.status, got.body)
		}
		checkHeader(t, got, "Content-Type", "text/html;charset=UTF-8")
		for _, w := range c.want {
			if !strings.Contains(got.body, w) {
				t.Errorf("%s %s: no %q in\n%s", c.method, c.path, w, got.body)
			}
		}
	}
}
