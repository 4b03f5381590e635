package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/leafbus/leafbus/dispenser"
	"github.com/leafbus/leafbus/wire"
)

// The figure issue 12 asks for is taken with
//
//	go test ./cmd/dispenser -run TestFuzzedRequests -v -args -fuzzed-requests 1000000
//
// make test sends fewer, so that the suite stays short.
var (
	fuzzedRequests = flag.Int("fuzzed-requests", 10_000, "how many fuzzed requests TestFuzzedRequests sends")
	fuzzSeed       = flag.Uint64("fuzz-seed", 0, "seed of TestFuzzedRequests (0: from the clock; the test logs it)")
)

// TestFuzzedRequests sends random, mostly malformed requests (subjects, tags, counts,
// encodings, headers, admin bodies, decode bodies) to the real binary from 16
// connections and checks every answer against the wire package's own parsers: a
// request they refuse is answered with a 4xx, one they accept with exactly the IDs it
// asked for (segment IDs of the sample tag never twice); never a 500, never silence,
// the process never exits, and its memory stays bounded.
func TestFuzzedRequests(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	t.Parallel()
	seed := *fuzzSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano())
	}
	t.Logf("seed %d (rerun with -fuzz-seed %d)", seed, seed)
	p := startBinary(t, t.TempDir(), "--log-level", "error")

	const conns = 16
	f := &fuzzTally{codes: map[string]int{}, seen: map[int64]bool{}}
	total := *fuzzedRequests
	warm := total / 10
	var warmRSS float64
	start := time.Now()
	var wg sync.WaitGroup
	for c := 0; c < conns; c++ {
		nc, err := nats.Connect(p.url)
		if err != nil {
			t.Fatal(err)
		}
		defer nc.Close()
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(seed, uint64(c)))
			for i := c; i < total; i += conns {
				if i == warm {
					warmRSS = rssMB(t, p.cmd.Process.Pid) // one goroutine reaches i == warm
				}
				f.check(nc, newFuzzRequest(rng))
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	endRSS := rssMB(t, p.cmd.Process.Pid)

	select {
	case err := <-p.done:
		p.done <- err
		t.Fatalf("the dispenser exited during the fuzzed requests: %v\nstderr:\n%s", err, p.stderr.String())
	default:
	}
	t.Logf("%d fuzzed requests in %v (%.0f/s): answers by code %v; %d segment IDs of %s checked unique (at most %d); RSS %.1f MB after %d requests, %.1f MB at the end",
		total, elapsed.Round(time.Millisecond), float64(total)/elapsed.Seconds(), f.codes, len(f.seen), dispenser.SampleTagName, maxSeen, warmRSS, warm, endRSS)
	for _, msg := range f.failures {
		t.Error(msg)
	}
	// Bounded: after the warm-up the dispenser holds what it will hold (segments, the
	// few fuzz tags); growth with the number of requests would be a leak.
	if warmRSS > 0 && endRSS > 2*warmRSS+64 {
		t.Errorf("RSS grew from %.1f MB after %d requests to %.1f MB after %d", warmRSS, warm, endRSS, total)
	}
}

// fuzzSubjects are the dispenser's subjects (PROTOCOL.md, through package wire).
var fuzzSubjects = wire.Subjects{Prefix: wire.DefaultPrefix}

// fuzzRequest is one random request and what the wire parsers say of it.
type fuzzRequest struct {
	msg       *nats.Msg
	served    bool  // a subject the dispenser subscribes to
	ids       bool  // an ID endpoint (segment or snowflake) on a tag that CheckTag accepts
	segment   bool  // of those, a segment request for the sample tag
	n         int   // the count ParseCount reads, when valid
	bad       error // what ParseCount, ParseEncoding or CheckTag refuse; nil: valid
	encoding  wire.Encoding
	sampleTag bool
}

// fuzzTags are the tags fuzzed admin calls may add and update: a bounded set, so that
// the dispenser's memory is bounded by design and any growth is a leak.
var fuzzTags = []string{"fuzz-a", "fuzz-b", "fuzz-c", "fuzz_d", "FUZZ-E"}

func newFuzzRequest(rng *rand.Rand) fuzzRequest {
	switch r := rng.IntN(100); {
	case r < 70:
		return newFuzzIDRequest(rng)
	case r < 80:
		return fuzzRequest{msg: &nats.Msg{Subject: fuzzSubjects.Decode(), Data: fuzzNumber(rng), Header: fuzzHeader(rng)}, served: true}
	case r < 95:
		return newFuzzAdminRequest(rng)
	default:
		// Other subjects under the prefix: nobody listens (a "no responders" answer) or
		// a near miss of the dispenser's own ones.
		subjects := []string{"leaf.segment", "leaf.snowflake", "leaf.decode", "leaf.admin.tags.remove", "leaf.admin", "leaf.time.x", "leaf.segment." + fuzzTagToken(rng) + ".x"}
		return fuzzRequest{msg: &nats.Msg{Subject: subjects[rng.IntN(len(subjects))], Data: fuzzBytes(rng, 64)}}
	}
}

func newFuzzIDRequest(rng *rand.Rand) fuzzRequest {
	kind := wire.Segment
	if rng.IntN(3) == 0 {
		kind = wire.Snowflake
	}
	tag := dispenser.SampleTagName
	if rng.IntN(4) == 0 {
		tag = fuzzTagToken(rng)
	}
	body := fuzzCount(rng)
	h := fuzzHeader(rng)
	req := fuzzRequest{msg: &nats.Msg{Subject: fuzzSubjects.IDs(kind, tag), Data: body, Header: h}, served: true}
	var errTag, errCount, errEnc error
	errTag = wire.CheckTag(tag)
	req.n, errCount = wire.ParseCount(body, wire.DefaultMaxBatch)
	// NATS trims the white space around a header value in transit, so " binary" arrives
	// as "binary".
	req.encoding, errEnc = wire.ParseEncoding(strings.TrimSpace(h.Get(wire.EncodingHeader)))
	req.bad = errors.Join(errTag, errCount, errEnc)
	req.ids = errTag == nil
	req.sampleTag = tag == dispenser.SampleTagName
	req.segment = kind == wire.Segment && req.sampleTag
	return req
}

func newFuzzAdminRequest(rng *rand.Rand) fuzzRequest {
	op := []string{"add", "update", "list"}[rng.IntN(3)]
	fields := map[string]any{}
	if rng.IntN(5) > 0 {
		fields["tag"] = fuzzTags[rng.IntN(len(fuzzTags))]
		if rng.IntN(6) == 0 {
			fields["tag"] = fuzzTagToken(rng) + "\x7f" // never valid (a control character): the set of tags stays bounded
		}
	}
	values := []any{nil, true, "x", -1, 0, 1, 1000, 1 << 31, int64(1) << 62, 1.5, []int{1}, map[string]int{"a": 1}, strings.Repeat("d", 300)}
	for _, k := range []string{"step", "description", "max_id", "monotonic", "extra"} {
		if rng.IntN(2) == 0 {
			fields[k] = values[rng.IntN(len(values))]
		}
	}
	body, _ := json.Marshal(fields)
	switch rng.IntN(6) {
	case 0: // cut short
		body = body[:rng.IntN(len(body)+1)]
	case 1:
		body = fuzzBytes(rng, 256)
	}
	return fuzzRequest{msg: &nats.Msg{Subject: fuzzSubjects.AdminTags(op), Data: body, Header: fuzzHeader(rng)}, served: true}
}

// fuzzTagToken is a subject token for a tag: often valid, often not (too long, empty
// after trimming, characters the tag rule refuses), never one NATS itself refuses to
// publish (no '.', '*', '>' or white space).
func fuzzTagToken(rng *rand.Rand) string {
	const alphabet = "abcXYZ019_-!#$%&'()+,/:;<=?@[]^`{|}~é中\x7f"
	n := []int{1, 2, 8, 127, 128, 129, 300}[rng.IntN(7)]
	if rng.IntN(2) == 0 {
		n = 1 + rng.IntN(20)
	}
	runes := []rune(alphabet)
	var b strings.Builder
	for range n {
		if rng.IntN(4) > 0 {
			b.WriteRune(runes[rng.IntN(11)]) // the valid part of the alphabet
		} else {
			b.WriteRune(runes[rng.IntN(len(runes))])
		}
	}
	return b.String()
}

// fuzzCount is a request body: mostly a count, valid or not, sometimes anything.
func fuzzCount(rng *rand.Rand) []byte {
	switch rng.IntN(10) {
	case 0, 1, 2, 3:
		return nil
	case 4, 5:
		return []byte(strconv.Itoa(1 + rng.IntN(20)))
	case 6:
		return []byte(strconv.Itoa(rng.IntN(wire.DefaultMaxBatch + 2)))
	case 7:
		forms := []string{"0", "-1", "+5", " 5", "5 ", "5\n", "05", "1e3", "0x10", "10001", "99999999999999999999", "1.0", "٣", "5\x00"}
		return []byte(forms[rng.IntN(len(forms))])
	default:
		return fuzzBytes(rng, 32)
	}
}

// fuzzNumber is a decode body: an ID, valid or not.
func fuzzNumber(rng *rand.Rand) []byte {
	switch rng.IntN(4) {
	case 0:
		return []byte(strconv.FormatInt(rng.Int64(), 10))
	case 1:
		return []byte(strconv.FormatInt(-rng.Int64N(1<<40), 10))
	case 2:
		return []byte("9223372036854775808")
	default:
		return fuzzBytes(rng, 24)
	}
}

func fuzzBytes(rng *rand.Rand, max int) []byte {
	b := make([]byte, rng.IntN(max+1))
	for i := range b {
		b[i] = byte(rng.UintN(256))
	}
	return b
}

// fuzzHeader is nil or a header with Leaf-Encoding (valid or not) and noise. Values
// hold no CR or LF, which nats.go itself would refuse to send.
func fuzzHeader(rng *rand.Rand) nats.Header {
	if rng.IntN(3) == 0 {
		return nil
	}
	h := nats.Header{}
	encodings := []string{"text", "binary", "", "BINARY", "Binary", "json", " binary", strings.Repeat("b", 200)}
	if rng.IntN(4) > 0 {
		h.Set(wire.EncodingHeader, encodings[rng.IntN(len(encodings))])
	}
	if rng.IntN(4) == 0 {
		h.Set("X-Fuzz", strconv.Itoa(rng.Int()))
		h.Set(wire.ServiceErrorCodeHeader, "500") // a request posing as an error reply
	}
	return h
}

// maxSeen bounds the IDs checked for uniqueness, and so the test's own memory (a
// million requests hand out over a hundred million IDs).
const maxSeen = 4_000_000

// fuzzTally collects the answers of all connections.
type fuzzTally struct {
	mu       sync.Mutex
	codes    map[string]int
	seen     map[int64]bool // segment IDs of the sample tag
	failures []string
}

// check sends one request and judges its answer.
func (f *fuzzTally) check(nc *nats.Conn, req fuzzRequest) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	reply, err := nc.RequestMsgWithContext(ctx, req.msg)
	code, problem := judgeFuzzAnswer(req, reply, err)
	var ids []int64
	if problem == "" && code == "200" && req.segment {
		ids, _ = wire.DecodeIDs(nil, reply.Data, req.encoding)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.codes[code]++
	for _, id := range ids {
		if len(f.seen) >= maxSeen {
			break
		}
		if f.seen[id] {
			problem = fmt.Sprintf("segment ID %d handed out twice", id)
		}
		f.seen[id] = true
	}
	if problem != "" && len(f.failures) < 20 {
		f.failures = append(f.failures, fmt.Sprintf("%s: subject %q body %q header %v", problem, req.msg.Subject, req.msg.Data, req.msg.Header))
	}
}

// judgeFuzzAnswer names the answer's code ("200", "400", ..., "no-responders") and what
// is wrong with it, if anything.
func judgeFuzzAnswer(req fuzzRequest, reply *nats.Msg, err error) (code, problem string) {
	switch {
	case errors.Is(err, nats.ErrNoResponders):
		if req.served {
			return "no-responders", "no responders on a subject the dispenser serves"
		}
		return "no-responders", ""
	case err != nil:
		return "unanswered", fmt.Sprintf("no answer: %v", err)
	}
	code = reply.Header.Get(wire.ServiceErrorCodeHeader)
	if code == "" {
		code = "200"
	}
	switch {
	case strings.HasPrefix(code, "5") && code != "503":
		return code, fmt.Sprintf("answered %s %q", code, reply.Header.Get(wire.ServiceErrorHeader))
	case !req.ids:
		return code, ""
	case req.bad != nil && code == "200":
		return code, fmt.Sprintf("answered with IDs, but the wire parsers refuse the request: %v", req.bad)
	case req.bad == nil && strings.HasPrefix(code, "4") && code != "404":
		return code, fmt.Sprintf("answered %s %q to a request the wire parsers accept", code, reply.Header.Get(wire.ServiceErrorHeader))
	case req.sampleTag && req.bad == nil && code != "200":
		return code, fmt.Sprintf("sample tag answered %s %q", code, reply.Header.Get(wire.ServiceErrorHeader))
	case code == "200":
		ids, err := wire.DecodeIDs(nil, reply.Data, req.encoding)
		if err != nil || len(ids) != req.n {
			return code, fmt.Sprintf("reply holds %d IDs (%v), want %d", len(ids), err, req.n)
		}
	}
	return code, ""
}
