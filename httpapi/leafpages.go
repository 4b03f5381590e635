package httpapi

import (
	"cmp"
	"context"
	"fmt"
	"html"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/leafbus/leafbus/core"
	"github.com/leafbus/leafbus/metrics"
)

// Leaf's monitor pages, /cache and /db (LeafMonitorController), as plain HTML tables
// with Leaf's columns, for the scrapers and bookmarks of a Leaf shop; the status page at
// / shows the same and more. Numbers are grouped by thousands ("1,001") as FreeMarker's
// default number format shows them in Leaf's templates.

const contentHTML = "text/html;charset=UTF-8"

// serveCache is Leaf's /cache: each segment tag's two buffers, as Leaf's
// SegmentBufferView shows them. A dispenser's current segment is Leaf's segment 0 (pos
// is always 0), the one loaded ahead its segment 1; value is the next ID a segment
// hands out.
func (s *Server) serveCache(w http.ResponseWriter, _ *http.Request) {
	var tags []metrics.SegmentTag
	if src := s.cfg.Status.Sources.SegmentTags; src != nil {
		tags = src()
	}
	slices.SortFunc(tags, func(a, b metrics.SegmentTag) int { return cmp.Compare(a.Tag, b.Tag) })
	b := leafPageStart("name", "init", "next", "pos", "value0", "max0", "step0", "value1", "max1", "step1")
	for _, t := range tags {
		if s.hides(t.Tag) {
			continue
		}
		b = leafRow(b, html.EscapeString(t.Tag), strconv.FormatBool(t.Current.Max > 0), strconv.FormatBool(t.NextReady), "0",
			grouped(t.Current.Value), grouped(t.Current.Max), grouped(t.Current.Step),
			grouped(t.Next.Value), grouped(t.Next.Max), grouped(t.Next.Step))
	}
	writeBody(w, contentHTML, leafPageEnd(b))
}

// serveDB is Leaf's /db: the segment store's rows (leaf_alloc with the MySQL store, the
// KV bucket's rows with the KV store), read within the status page's fetch timeout.
// update is the row's update_time in the host's zone, as Leaf shows the column.
func (s *Server) serveDB(w http.ResponseWriter, r *http.Request) {
	st := s.cfg.Status
	if st.Rows == nil {
		writeError(w, http.StatusServiceUnavailable, "the segment store's rows are not available on this dispenser")
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), st.FetchTimeout)
	defer cancel()
	rows, err := st.Rows.Tags(ctx)
	if err != nil {
		s.log.Warn("http: /db: read the segment store", "err", err)
		writeError(w, http.StatusServiceUnavailable, fmt.Sprintf("cannot read the segment store: %v", err))
		return
	}
	rows = slices.DeleteFunc(rows, func(t core.TagRow) bool { return s.hides(t.Name) })
	slices.SortFunc(rows, func(a, b core.TagRow) int { return cmp.Compare(a.Name, b.Name) })
	b := leafPageStart("tag", "max", "step", "update")
	for _, t := range rows {
		update := ""
		if !t.UpdateTime.IsZero() {
			update = t.UpdateTime.In(s.cfg.Location).Format(time.DateTime)
		}
		b = leafRow(b, html.EscapeString(t.Name), grouped(t.MaxID), grouped(t.Step), update)
	}
	writeBody(w, contentHTML, leafPageEnd(b))
}

// leafPageStart opens a page with a table whose header row names cols.
func leafPageStart(cols ...string) []byte {
	b := []byte("<!DOCTYPE html>\n<html>\n<head>\n<meta http-equiv=\"Content-Type\" content=\"text/html; charset=UTF-8\">\n<title>Leaf</title>\n</head>\n<body>\n<table class=\"table table-hover\">\n<thead>\n<tr>\n")
	for _, c := range cols {
		b = append(b, "<th>"...)
		b = append(b, c...)
		b = append(b, "</th>\n"...)
	}
	return append(b, "</tr>\n</thead>\n<tbody>\n"...)
}

// leafRow adds a row of cells, already escaped.
func leafRow(b []byte, cells ...string) []byte {
	b = append(b, "<tr>\n"...)
	for _, c := range cells {
		b = append(b, "<td>"...)
		b = append(b, c...)
		b = append(b, "</td>\n"...)
	}
	return append(b, "</tr>\n"...)
}

func leafPageEnd(b []byte) []byte {
	return append(b, "</tbody>\n</table>\n</body>\n</html>\n"...)
}

// grouped writes n with a comma between groups of three digits: 1234567 is "1,234,567".
func grouped(n int64) string {
	digits := strconv.FormatInt(n, 10)
	sign := ""
	if n < 0 {
		sign, digits = "-", digits[1:]
	}
	if len(digits) <= 3 {
		return sign + digits
	}
	b := make([]byte, 0, len(digits)+len(digits)/3+1)
	b = append(b, sign...)
	first := len(digits) % 3
	if first == 0 {
		first = 3
	}
	b = append(b, digits[:first]...)
	for i := first; i < len(digits); i += 3 {
		b = append(b, ',')
		b = append(b, digits[i:i+3]...)
	}
	return string(b)
}
