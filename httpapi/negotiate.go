package httpapi

import (
	"strconv"
	"strings"
)

// Leaf's ID endpoints return a String from a @RestController, and Spring MVC 4.3 picks
// the answer's media type the way AbstractMessageConverterMethodProcessor does:
//
//  1. The requested types: a path suffix ".json" (useSuffixPatternMatch with
//     favorPathExtension, Spring Boot 1.5's defaults) asks for application/json whatever
//     the Accept header says; otherwise the Accept header, and */* without one.
//  2. The producible types, for a String with Leaf's converters: text/plain and */*
//     (StringHttpMessageConverter), application/json and application/*+json (Jackson).
//  3. Each requested type meets each producible one it is compatible with; the more
//     specific of the two, with the requested quality, is a candidate.
//  4. The candidates are sorted by MediaType.sortBySpecificityAndQuality (a concrete
//     type before a wildcard one; between different types the higher quality first; the
//     order of the Accept header otherwise), and the first concrete one is the answer's
//     type; */* or application/* before any concrete one means application/octet-stream.
//
// StringHttpMessageConverter writes the same characters whichever type won, so the
// body never changes. Spring would echo any concrete type (text/html for a browser);
// the dispenser answers application/json when the winner is a JSON type (subtype json
// or +json: RestTemplate's getForObject(url, Long.class) sends "application/json,
// application/*+json") and text/plain otherwise, which is the answer for no Accept
// header, for */*, and for RestTemplate's getForObject(url, String.class)
// ("text/plain, application/json, application/*+json, */*").

// mediaRange is one parsed media range of an Accept header, or a candidate.
type mediaRange struct {
	typ, sub string
	q        float64
	params   int // parameters besides q
}

func (m mediaRange) wildType() bool { return m.typ == "*" }
func (m mediaRange) wildSub() bool  { return m.sub == "*" || strings.HasPrefix(m.sub, "*+") }
func (m mediaRange) concrete() bool { return !m.wildType() && !m.wildSub() }

// isJSON reports whether a concrete type is a JSON type: application/json, text/json,
// application/vnd.x+json.
func (m mediaRange) isJSON() bool { return m.sub == "json" || strings.HasSuffix(m.sub, "+json") }

// maxRanges bounds how many ranges of an Accept header are weighed; the rest are
// ignored (real clients send a handful). It keeps the work per request small and off
// the heap.
const maxRanges = 16

// wantsJSON reports whether the ID endpoints answer application/json: ext is the path
// suffix the mapping cut off ("" for none), accept the request's Accept headers.
func wantsJSON(ext string, accept []string) bool {
	if strings.EqualFold(ext, "json") {
		return true
	}
	var buf [maxRanges * 4]mediaRange
	cands := buf[:0]
	n := 0
	for _, h := range accept {
		for h != "" && n < maxRanges {
			var part string
			part, h, _ = strings.Cut(h, ",")
			r, ok := parseRange(part)
			if !ok {
				continue
			}
			n++
			cands = appendCandidates(cands, r)
		}
	}
	if n == 0 {
		return false // no Accept header (or none readable): */*, which gives text/plain
	}
	sortCandidates(cands)
	for _, c := range cands {
		if c.concrete() {
			return c.isJSON()
		}
		if c.wildType() && c.sub == "*" || c.typ == "application" && c.sub == "*" {
			return false // application/octet-stream
		}
	}
	return false // nothing acceptable: Spring answers 406; text/plain here
}

// parseRange reads "type/subtype;q=0.5;x=y". A range Spring would refuse to parse (no
// slash, an empty part, "*/json", a bad q) is left out.
func parseRange(s string) (mediaRange, bool) {
	s, params, _ := strings.Cut(s, ";")
	s = strings.TrimSpace(s)
	if s == "*" {
		s = "*/*" // as MimeTypeUtils reads a lone "*"
	}
	typ, sub, ok := strings.Cut(s, "/")
	if !ok || typ == "" || sub == "" || typ == "*" && sub != "*" {
		return mediaRange{}, false
	}
	r := mediaRange{typ: lowerASCII(typ), sub: lowerASCII(sub), q: 1}
	for params != "" {
		var p string
		p, params, _ = strings.Cut(params, ";")
		k, v, _ := strings.Cut(p, "=")
		if !strings.EqualFold(strings.TrimSpace(k), "q") {
			r.params++
			continue
		}
		q, err := strconv.ParseFloat(strings.TrimSpace(v), 64)
		if err != nil || q < 0 || q > 1 {
			return mediaRange{}, false
		}
		r.q = q
	}
	return r, true
}

// lowerASCII lower-cases s, without an allocation when it already is (as it nearly
// always is).
func lowerASCII(s string) string {
	for i := 0; i < len(s); i++ {
		if 'A' <= s[i] && s[i] <= 'Z' {
			return strings.ToLower(s)
		}
	}
	return s
}

// producible are the types Leaf's converters can write a String as, in Spring's order.
var producible = [...]mediaRange{
	{typ: "text", sub: "plain", q: 1},
	{typ: "*", sub: "*", q: 1},
	{typ: "application", sub: "json", q: 1},
	{typ: "application", sub: "*+json", q: 1},
}

// appendCandidates adds what requested r makes of each producible type it is
// compatible with: the more specific of the two, with r's quality.
func appendCandidates(dst []mediaRange, r mediaRange) []mediaRange {
	for _, p := range producible {
		if !compatible(r, p) {
			continue
		}
		p.q = r.q
		if specificity(r, p) <= 0 {
			dst = append(dst, r)
		} else {
			dst = append(dst, p)
		}
	}
	return dst
}

// compatible is MimeType.isCompatibleWith.
func compatible(a, b mediaRange) bool {
	if a.wildType() || b.wildType() {
		return true
	}
	if a.typ != b.typ {
		return false
	}
	if a.sub == b.sub {
		return true
	}
	if a.wildSub() || b.wildSub() {
		ai, bi := strings.IndexByte(a.sub, '+'), strings.IndexByte(b.sub, '+')
		switch {
		case ai < 0 && bi < 0:
			return true
		case ai >= 0 && bi >= 0:
			aSuffix, bSuffix := a.sub[ai+1:], b.sub[bi+1:]
			return aSuffix == bSuffix && (a.sub[:ai] == "*" || b.sub[:bi] == "*")
		}
	}
	return false
}

// specificity is MediaType.SPECIFICITY_COMPARATOR: negative when a is the more specific
// (sorts first), 0 when it cannot tell.
func specificity(a, b mediaRange) int {
	switch {
	case a.wildType() && !b.wildType():
		return 1
	case b.wildType() && !a.wildType():
		return -1
	case a.typ != b.typ:
		return 0
	case a.wildSub() && !b.wildSub():
		return 1
	case b.wildSub() && !a.wildSub():
		return -1
	case a.sub != b.sub:
		return 0
	case a.q != b.q:
		return byQuality(a, b)
	}
	return b.params - a.params
}

// byQuality is MediaType.QUALITY_VALUE_COMPARATOR: the higher quality first.
func byQuality(a, b mediaRange) int {
	switch {
	case a.q > b.q:
		return -1
	case a.q < b.q:
		return 1
	}
	return 0
}

// sortCandidates is sortBySpecificityAndQuality: a stable sort by specificity, then
// quality. An insertion sort: the list is short, and it must not allocate.
func sortCandidates(c []mediaRange) {
	for i := 1; i < len(c); i++ {
		for j := i; j > 0 && before(c[j], c[j-1]); j-- {
			c[j], c[j-1] = c[j-1], c[j]
		}
	}
}

func before(a, b mediaRange) bool {
	if s := specificity(a, b); s != 0 {
		return s < 0
	}
	return byQuality(a, b) < 0
}
