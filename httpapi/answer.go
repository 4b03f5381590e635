package httpapi

import (
	"fmt"
	"net/http"
	"strconv"

	"github.com/leafbus/leafbus/metrics"
)

// Writing answers. A request counts among those in progress (MaxInFlight) while it is
// being answered, not while its answer travels: the room is given back when the
// answer's header is written, so clients that read slowly, or not at all, cannot fill
// it. What a slow reader still holds is its answer, until the write completes or
// WriteTimeout ends it: an answer of up to smallAnswer bytes sits in its connection's
// own buffer (which the connection has anyway), and larger ones (batches of over 204
// IDs, the status page, /cache, /db) share MaxAnswerBytes; beyond it such an answer is
// replaced by a 503 at once. /metrics is bounded by its own handler (two scrapes at a
// time).

// smallAnswer is the largest answer written without a share of MaxAnswerBytes: it fits
// in net/http's 4 KB write buffer, which each connection holds anyway.
const smallAnswer = 4 << 10

// answerWriter is the http.ResponseWriter of a request in progress: it gives the
// request's room back at its header, and takes a share of MaxAnswerBytes for a large
// answer (by its Content-Length) or replaces it with a 503. The same pointer goes back
// to the server's pool.
type answerWriter struct {
	http.ResponseWriter
	s        *Server
	counted  bool  // the request still counts in s.inFlight
	reserved int64 // bytes of s.answers this answer holds
	header   bool  // WriteHeader was called
	refused  bool  // the answer was replaced by a 503: its body is dropped
}

// answerWriter returns w's writer for a request that counts in s.inFlight.
func (s *Server) answerWriter(w http.ResponseWriter) *answerWriter {
	aw, _ := s.writers.Get().(*answerWriter)
	if aw == nil {
		aw = &answerWriter{s: s}
	}
	aw.ResponseWriter, aw.counted, aw.reserved, aw.header, aw.refused = w, true, 0, false, false
	return aw
}

// done ends a request: it gives back its room if the handler wrote nothing, and its
// share of the budget (its answer has been handed to the connection by now).
func (s *Server) done(aw *answerWriter) {
	aw.release()
	if aw.reserved > 0 {
		s.answers.Add(-aw.reserved)
	}
	aw.ResponseWriter = nil
	s.writers.Put(aw)
}

func (aw *answerWriter) release() {
	if aw.counted {
		aw.counted = false
		aw.s.inFlight.Add(-1)
	}
}

// Unwrap lets http.ResponseController reach the connection.
func (aw *answerWriter) Unwrap() http.ResponseWriter { return aw.ResponseWriter }

func (aw *answerWriter) WriteHeader(code int) {
	if aw.header {
		aw.ResponseWriter.WriteHeader(code) // net/http logs the superfluous call
		return
	}
	aw.header = true
	aw.release()
	if n := contentLength(aw.Header()); n > smallAnswer {
		if total := aw.s.answers.Add(n); total > int64(aw.s.cfg.MaxAnswerBytes) {
			aw.s.answers.Add(-n)
			aw.refuse(n)
			return
		}
		aw.reserved = n
	}
	aw.ResponseWriter.WriteHeader(code)
}

func (aw *answerWriter) Write(b []byte) (int, error) {
	if !aw.header {
		aw.WriteHeader(http.StatusOK)
	}
	if aw.refused {
		return len(b), nil
	}
	return aw.ResponseWriter.Write(b)
}

// refuse answers 503 instead of an answer of n bytes.
func (aw *answerWriter) refuse(n int64) {
	aw.refused = true
	h := aw.Header()
	for k := range h {
		delete(h, k)
	}
	if m := aw.s.cfg.Metrics; m != nil {
		m.Rejected(metrics.HTTP)
	}
	writeError(aw.ResponseWriter, http.StatusServiceUnavailable, fmt.Sprintf(
		"unavailable: an answer of %d bytes beyond the %d bytes of large answers already being written to clients; ask for fewer IDs, or again shortly",
		n, aw.s.cfg.MaxAnswerBytes))
}

// contentLength is the Content-Length set in h, 0 when none (or unreadable). Lengths of
// up to three digits are small without parsing.
func contentLength(h http.Header) int64 {
	v := h["Content-Length"]
	if len(v) == 0 || len(v[0]) < 4 {
		return 0
	}
	n, err := strconv.ParseInt(v[0], 10, 64)
	if err != nil {
		return 0
	}
	return n
}
