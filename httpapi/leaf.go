package httpapi

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
	"unicode"

	"github.com/leafbus/leafbus/core"
	"github.com/leafbus/leafbus/metrics"
	"github.com/leafbus/leafbus/wire"
)

// Core is what the HTTP face needs of package core's *Core: the same routing, waits and
// error table as the NATS face, through Get (Take, then Wait when it must).
type Core interface {
	MaxBatch() int
	WaitMax() time.Duration
	Get(ctx context.Context, r core.Request, dst []int64) core.Answer
	Layout() core.Layout
}

var _ Core = (*core.Core)(nil)

// Content types as Leaf's Spring Boot sends them.
const (
	contentText = "text/plain;charset=UTF-8"
	contentJSON = "application/json;charset=UTF-8"
)

// maxFormBytes bounds a POST body read for form parameters (Leaf's @RequestParam reads
// them from the body too).
const maxFormBytes = 64 << 10

// leaf serves every path that is not this project's own: Leaf's mappings, which answer
// any method like GET (HEAD without the body), as @RequestMapping with no method does.
func (s *Server) leaf(w http.ResponseWriter, r *http.Request) {
	rt, key, ext, err := leafMatch(r.URL.EscapedPath())
	if err != nil {
		code, desc := core.CodeOf(err)
		writeError(w, code, desc)
		return
	}
	if rt == routeNone {
		writeError(w, http.StatusNotFound, "no such path: "+oneLine(r.URL.Path))
		return
	}
	if page := rt == routeCache || rt == routeDB; (page && !s.servesPages()) || (!page && !s.servesIDs()) {
		s.notHere(w, r)
		return
	}
	switch r.Method {
	case http.MethodGet, http.MethodHead, http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete:
	case http.MethodOptions:
		// Spring 4.3 answers OPTIONS itself for a mapping with no method.
		w.Header().Set("Allow", "GET,HEAD,POST,PUT,PATCH,DELETE,OPTIONS")
		w.WriteHeader(http.StatusOK)
		return
	default:
		writeError(w, http.StatusMethodNotAllowed, fmt.Sprintf("method %s not allowed", oneLine(r.Method)))
		return
	}
	switch rt {
	case routeSegment:
		s.serveIDs(w, r, wire.Segment, key, ext)
	case routeSnowflake:
		s.serveIDs(w, r, wire.Snowflake, key, ext)
	case routeDecode:
		s.serveDecode(w, r)
	case routeCache:
		s.serveCache(w, r)
	case routeDB:
		s.serveDB(w, r)
	}
}

// serveIDs answers one ID as plain decimal, or ?count=N IDs one per line, with no
// trailing newline: the NATS text reply, by the same rules. The content type is Spring's
// choice (negotiate.go): application/json for an Accept naming a JSON type or a .json
// suffix, text/plain otherwise; the body is the same.
func (s *Server) serveIDs(w http.ResponseWriter, r *http.Request, kind wire.Kind, tag, ext string) {
	start := s.mono()
	n, err := s.writeIDs(w, r, kind, tag, ext)
	code := http.StatusOK
	if err != nil {
		var desc string
		code, desc = core.CodeOf(err)
		if code == http.StatusInternalServerError {
			s.log.Error("http: request failed", "kind", kind.String(), "tag", wire.Quote(tag), "err", err)
		}
		if errors.Is(err, core.ErrOverloaded) && s.cfg.Metrics != nil {
			s.cfg.Metrics.Rejected(metrics.HTTP)
		}
		writeError(w, code, desc)
		n = 0
	}
	s.observe(kind.String(), code, start, n)
}

// writeIDs writes the IDs and returns how many, or the error to answer instead.
func (s *Server) writeIDs(w http.ResponseWriter, r *http.Request, kind wire.Kind, tag, ext string) (int, error) {
	if err := wire.CheckTag(tag); err != nil {
		if kind == wire.Segment {
			return 0, err
		}
		// Leaf's snowflake IDs ignore the key, so no key is a reason to refuse one. A
		// valid tag still finds its snowflake pool; any other key (it is bounded by the
		// request line's size and never stored) finds none.
		tag = ""
	}
	count, _, err := param(w, r, "count")
	if err != nil {
		return 0, err
	}
	n, err := wire.ParseCount([]byte(count), s.cfg.Core.MaxBatch())
	if err != nil {
		return 0, err
	}
	ids := s.getIDs(n)
	defer s.ids.Put(ids)
	a := s.cfg.Core.Get(r.Context(), core.Request{Kind: kind, Tag: tag, Count: n, Encoding: wire.Text}, *ids)
	defer a.Release()
	if a.Err != nil {
		return 0, a.Err
	}
	ctype := contentText
	if wantsJSON(ext, r.Header["Accept"]) {
		ctype = contentJSON
	}
	if a.Reply != nil {
		writeBody(w, ctype, a.Reply)
		return n, nil
	}
	bp := s.getBuf(n * wire.MaxTextID)
	b := wire.AppendIDs((*bp)[:0], a.IDs, wire.Text)
	writeBody(w, ctype, b)
	*bp = b
	s.bufs.Put(bp)
	return n, nil
}

// serveDecode answers Leaf's /decodeSnowflakeId JSON (LeafMonitorController): for any
// value of snowflakeId, 200 and a JSON object. A value Java's Long.parseLong reads is
// taken apart with Leaf's arithmetic on a signed long, so zero and negative numbers are
// decoded too; any other value gets Leaf's {"errorMsg":...}. Only a missing parameter is
// an error (400, as Spring answers a missing required @RequestParam).
func (s *Server) serveDecode(w http.ResponseWriter, r *http.Request) {
	start := s.mono()
	body, err := s.decode(w, r)
	code := http.StatusOK
	if err != nil {
		var desc string
		code, desc = core.CodeOf(err)
		writeError(w, code, desc)
	} else {
		writeBody(w, contentJSON, body)
	}
	s.observe(metrics.KindDecode, code, start, 0)
}

func (s *Server) decode(w http.ResponseWriter, r *http.Request) ([]byte, error) {
	v, present, err := param(w, r, "snowflakeId")
	if err != nil {
		return nil, err
	}
	if !present {
		return nil, wire.BadRequest("required parameter 'snowflakeId' is not present")
	}
	id, ok := parseJavaLong(v)
	if !ok {
		return []byte(leafDecodeError), nil
	}
	d := s.cfg.Core.Layout().Split(id)
	return leafDecodeJSON(d.Timestamp, d.WorkerID, d.Sequence, s.cfg.Location), nil
}

// leafDecodeError is Leaf's answer to a snowflakeId that is not a long, verbatim.
const leafDecodeError = `{"errorMsg":"snowflake Id反解析发生异常!"}`

// leafDecodeJSON is Leaf's answer: every value a JSON string, the time local to loc.
// Leaf builds it in a java.util.HashMap, which Jackson writes in the map's bucket order:
// workerId, sequenceId, timestamp (their String.hashCode spread over 16 buckets: 2, 13
// and 15).
func leafDecodeJSON(ms, worker, seq int64, loc *time.Location) []byte {
	b := make([]byte, 0, 112)
	b = append(b, `{"workerId":"`...)
	b = strconv.AppendInt(b, worker, 10)
	b = append(b, `","sequenceId":"`...)
	b = strconv.AppendInt(b, seq, 10)
	b = append(b, `","timestamp":"`...)
	b = strconv.AppendInt(b, ms, 10)
	b = append(b, '(')
	b = time.UnixMilli(ms).In(loc).AppendFormat(b, "2006-01-02 15:04:05.000")
	return append(b, `)"}`...)
}

// parseJavaLong is Java's Long.parseLong(s): an optional sign, then decimal digits (any
// Unicode decimal digit in the Basic Multilingual Plane, as Character.digit reads them:
// "١٢٣" is 123), within a signed 64-bit integer; nothing else, not even white space.
func parseJavaLong(s string) (int64, bool) {
	neg := false
	if s != "" && (s[0] == '-' || s[0] == '+') {
		neg, s = s[0] == '-', s[1:]
	}
	if s == "" {
		return 0, false
	}
	// Accumulate negatively, as Java does, so that the most negative long fits.
	const minInt64 = -1 << 63
	var n int64
	for _, r := range s {
		d := decimalDigit(r)
		if d < 0 || n < minInt64/10 || n*10 < minInt64+int64(d) {
			return 0, false
		}
		n = n*10 - int64(d)
	}
	if neg {
		return n, true
	}
	if n == minInt64 {
		return 0, false
	}
	return -n, true
}

// decimalDigit is Character.digit(r, 10): the value of a decimal digit (Unicode category
// Nd) of the Basic Multilingual Plane, -1 for anything else. Java reads a string by its
// UTF-16 units, so a digit outside the plane (a surrogate pair) is no digit. Every block
// of Nd digits runs from its zero to its nine.
func decimalDigit(r rune) int {
	if '0' <= r && r <= '9' {
		return int(r - '0')
	}
	if r > 0xFFFF || !unicode.IsDigit(r) {
		return -1
	}
	zero := r
	for zero > 0 && unicode.IsDigit(zero-1) {
		zero--
	}
	return int(r-zero) % 10
}

// param reads a request parameter as Spring's @RequestParam String does: from the query
// and, for a POST form, the body; several values are joined with commas (which then
// fail to parse, as in Leaf). present is false when the parameter is absent.
func param(w http.ResponseWriter, r *http.Request, name string) (v string, present bool, err error) {
	var values []string
	if r.URL.RawQuery != "" {
		values = r.URL.Query()[name]
	}
	if r.Method == http.MethodPost && strings.HasPrefix(r.Header.Get("Content-Type"), "application/x-www-form-urlencoded") {
		r.Body = http.MaxBytesReader(w, r.Body, maxFormBytes)
		if err := r.ParseForm(); err != nil {
			return "", false, wire.BadRequest("form body: %v", err)
		}
		values = append(values, r.PostForm[name]...)
	}
	if len(values) == 0 {
		return "", false, nil
	}
	return strings.Join(values, ","), true, nil
}

// observe tells the metrics about one answer of kind, started at start (s.mono).
func (s *Server) observe(kind string, code int, start time.Duration, n int) {
	if s.cfg.Metrics != nil {
		s.cfg.Metrics.Observe(metrics.HTTP, kind, code, (s.mono() - start).Seconds(), n)
	}
}

// mono is the time since the server was made, on the monotonic clock alone: one clock
// read where time.Now takes two (the wall clock too), and requests are timed twice.
func (s *Server) mono() time.Duration { return time.Since(s.epoch) }

// getIDs returns a slice of n IDs from the pool. The same pointer goes back to the pool
// (s.ids.Put): a new pointer to the slice would be an allocation per request.
func (s *Server) getIDs(n int) *[]int64 {
	if p, ok := s.ids.Get().(*[]int64); ok && cap(*p) >= n {
		*p = (*p)[:n]
		return p
	}
	ids := make([]int64, n, max(n, 16))
	return &ids
}

func (s *Server) getBuf(n int) *[]byte {
	if p, ok := s.bufs.Get().(*[]byte); ok && cap(*p) >= n {
		return p
	}
	b := make([]byte, 0, max(n, 64))
	return &b
}

// Header values shared by every answer (net/http only reads them), so that setting
// them allocates nothing.
var (
	textHeader = []string{contentText}
	jsonHeader = []string{contentJSON}
	// lengths are the Content-Length values of bodies up to one snowflake ID (19 digits).
	lengths = [...][]string{{"0"}, {"1"}, {"2"}, {"3"}, {"4"}, {"5"}, {"6"}, {"7"}, {"8"}, {"9"},
		{"10"}, {"11"}, {"12"}, {"13"}, {"14"}, {"15"}, {"16"}, {"17"}, {"18"}, {"19"}, {"20"}}
)

// writeBody answers 200 with b; HEAD gets the same headers and no body.
func writeBody(w http.ResponseWriter, contentType string, b []byte) {
	h := w.Header()
	switch contentType {
	case contentText:
		h["Content-Type"] = textHeader
	case contentJSON:
		h["Content-Type"] = jsonHeader
	default:
		h.Set("Content-Type", contentType)
	}
	if len(b) < len(lengths) {
		h["Content-Length"] = lengths[len(b)]
	} else {
		h["Content-Length"] = []string{strconv.Itoa(len(b))}
	}
	w.WriteHeader(http.StatusOK)
	w.Write(b) //nolint:errcheck // the client went away: nothing to tell
}

// writeError answers code with one line of plain text saying why.
func writeError(w http.ResponseWriter, code int, msg string) {
	http.Error(w, oneLine(msg), code)
}

// oneLine keeps a message on one line, whatever a wrapped error or a client put in it.
func oneLine(s string) string {
	if strings.ContainsAny(s, "\r\n") {
		s = strings.NewReplacer("\r\n", "; ", "\n", "; ", "\r", "; ").Replace(s)
	}
	return s
}
