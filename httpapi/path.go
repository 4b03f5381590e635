package httpapi

import (
	"net/url"
	"strings"

	"github.com/leafbus/leafbus/wire"
)

// Leaf's server is Spring Boot 1.5.18 (leaf-server/pom.xml): Spring MVC 4.3 on an
// embedded Tomcat 8.5, with the defaults untouched. Its paths are mapped by
// @RequestMapping("/api/segment/get/{key}") and friends, with no method given, so a
// request path reaches them the way those defaults decide, and leafPath and leafRoute
// replay that decision:
//
//   - Spring's UrlPathHelper cuts path parameters (";jsessionid=..." up to the next
//     "/") from the raw path before decoding it.
//   - Tomcat refuses an encoded slash (%2F, either case) with 400 before Spring sees the
//     request (UDecoder.ALLOW_ENCODED_SLASH is false), and a backslash or NUL in the
//     decoded path the same way. Other %XX escapes are decoded, so /get/%6Frders asks
//     for key "orders".
//   - Tomcat normalizes the decoded path: "." segments go, ".." removes the segment
//     before it (above the root: 400), and runs of "/" count as one (Spring's
//     AntPathMatcher skips empty segments besides).
//   - useTrailingSlashMatch (true before Spring 6) lets "/api/segment/get/{key}" match
//     ".../get/orders/": key "orders".
//   - useSuffixPatternMatch (true before Spring Boot 2.0 and Spring 5.3) tries
//     "{key}.*" first, so ".../get/orders.json" is key "orders" (everything before the
//     last dot), while with a trailing slash ".../get/a.b/" keeps key "a.b". Literal
//     paths match the same way: "/decodeSnowflakeId.json", "/cache/".
//   - An empty key never matches: "/api/segment/get/" is 404.

// route is what a Leaf path maps to.
type route int

const (
	routeNone route = iota
	routeSegment
	routeSnowflake
	routeDecode
	routeCache
	routeDB
)

// leafMatch maps the escaped path of a request to a Leaf mapping and, for the ID paths,
// the key; ext is the path's file extension as Spring's content negotiation reads it
// (after the last dot of the last segment, none after a trailing slash): ".json" asks
// for JSON. A path Tomcat refuses is a 400 error.
func leafMatch(escaped string) (rt route, key, ext string, err error) {
	var buf [8]string // room for the usual paths, so that nothing escapes to the heap
	segs, trailing, err := leafPath(escaped, buf[:0])
	if err != nil {
		return routeNone, "", "", err
	}
	rt, key = leafRoute(segs, trailing)
	if n := len(segs); n > 0 && !trailing {
		if i := strings.LastIndexByte(segs[n-1], '.'); i >= 0 {
			ext = segs[n-1][i+1:]
		}
	}
	return rt, key, ext, nil
}

// leafPath turns the escaped path of a request into the segments Tomcat and Spring
// match on, appended to segs, and whether it ends with a slash; a path Tomcat refuses
// is a 400 error.
func leafPath(escaped string, segs []string) (_ []string, trailing bool, err error) {
	p := escaped
	if strings.IndexByte(p, ';') >= 0 {
		p = cutPathParams(p)
	}
	if strings.IndexByte(p, '%') >= 0 {
		if strings.Contains(p, "%2F") || strings.Contains(p, "%2f") {
			return nil, false, wire.BadRequest("path %s holds an encoded slash (%%2F), which Leaf's server refuses", wire.Quote(escaped))
		}
		if p, err = url.PathUnescape(p); err != nil {
			return nil, false, wire.BadRequest("path %s: %v", wire.Quote(escaped), err)
		}
	}
	if strings.ContainsAny(p, "\\\x00") {
		return nil, false, wire.BadRequest("path %s holds a backslash or NUL, which Leaf's server refuses", wire.Quote(escaped))
	}
	if !strings.HasPrefix(p, "/") {
		return nil, false, wire.BadRequest("path %s does not start with /", wire.Quote(escaped))
	}
	rest := p[1:]
	for rest != "" {
		var seg string
		seg, rest, trailing = strings.Cut(rest, "/")
		switch seg {
		case "":
		case ".":
			trailing = true
		case "..":
			if len(segs) == 0 {
				return nil, false, wire.BadRequest("path %s climbs above the root", wire.Quote(escaped))
			}
			segs = segs[:len(segs)-1]
			trailing = true
		default:
			segs = append(segs, seg)
		}
	}
	return segs, trailing, nil
}

// cutPathParams removes each ";..." up to the next "/", as UrlPathHelper does.
func cutPathParams(p string) string {
	var b strings.Builder
	for {
		i := strings.IndexByte(p, ';')
		if i < 0 {
			b.WriteString(p)
			return b.String()
		}
		b.WriteString(p[:i])
		p = p[i:]
		if j := strings.IndexByte(p, '/'); j >= 0 {
			p = p[j:]
		} else {
			p = ""
		}
	}
}

// leafRoute maps segments to a Leaf mapping and, for the ID paths, the key.
func leafRoute(segs []string, trailing bool) (route, string) {
	switch len(segs) {
	case 1:
		for _, m := range []struct {
			name string
			r    route
		}{{"decodeSnowflakeId", routeDecode}, {"cache", routeCache}, {"db", routeDB}} {
			if segs[0] == m.name || !trailing && strings.HasPrefix(segs[0], m.name+".") {
				return m.r, ""
			}
		}
	case 4:
		if segs[0] != "api" || segs[2] != "get" {
			break
		}
		key := segs[3]
		if !trailing {
			if i := strings.LastIndexByte(key, '.'); i >= 0 {
				key = key[:i]
			}
		}
		switch segs[1] {
		case "segment":
			return routeSegment, key
		case "snowflake":
			return routeSnowflake, key
		}
	}
	return routeNone, ""
}
