package main

// `dispenser conform`: docs/PROTOCOL.md's testable rules as a command, for anyone who
// runs another implementation, a proxy or a fork to point at a deployment. The rules are
// the table conformRules; each checks raw replies (bytes and headers), so what it
// judges is the server, not what a lenient client would accept.

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/leafbus/leafbus/wire"
)

const conformUsage = `Usage: dispenser conform [flags]

Checks a running deployment (these dispensers, another implementation, a proxy, a fork)
against the testable rules of docs/PROTOCOL.md and prints one line per rule: PASS <rule>,
or FAIL <rule>: what it got and wanted, and the section of PROTOCOL.md. Exits 1 when a
rule fails. It adds one scratch tag (--tag, default conform-<random>, printed first) and
changes no other tag; delete the scratch tag from the segment store afterwards if you
like. Give it an operator's NATS user: it asks the admin and $SRV subjects too.

Flags:
`

// conformQuiet is how long a rule waits for an answer that must not come (a second
// answer to one request, an answer to a refused reply subject).
const conformQuiet = time.Second

// conformRule is one testable rule of PROTOCOL.md: its name, the section (anchor) that
// states it, and its check, which returns why the deployment breaks it.
type conformRule struct {
	name    string
	section string
	check   func(c *conformer, ctx context.Context) error
}

// conformRules are checked in order: the $SRV rules first (max_batch and the layout come
// from there), the admin rules before the rules that ask for the scratch tag's IDs.
var conformRules = []conformRule{
	{"srv-ping", "discovery-and-statistics", (*conformer).checkPing},
	{"srv-info", "discovery-and-statistics", (*conformer).checkInfo},
	{"srv-info-by-id", "discovery-and-statistics", (*conformer).checkInfoByID},
	{"srv-stats", "discovery-and-statistics", (*conformer).checkStats},
	{"one-id-text", "getting-ids", (*conformer).checkOneID},
	{"count-text", "getting-ids", (*conformer).checkCountText},
	{"count-white-space", "getting-ids", (*conformer).checkCountWhiteSpace},
	{"binary", "getting-ids", (*conformer).checkBinary},
	{"max-batch", "getting-ids", (*conformer).checkMaxBatch},
	{"reply-order", "getting-ids", (*conformer).checkReplyOrder},
	{"count-refused", "getting-ids", (*conformer).checkCountRefused},
	{"encoding-refused", "getting-ids", (*conformer).checkEncodingRefused},
	{"one-answer-queue-group", "getting-ids", (*conformer).checkOneAnswer},
	{"error-headers", "errors", (*conformer).checkErrorHeaders},
	{"no-responders", "errors", (*conformer).checkNoResponders},
	{"tag-encoding", "tags-on-subjects-and-in-kv-keys", (*conformer).checkTagEncoding},
	{"tag-refused", "tags-on-subjects-and-in-kv-keys", (*conformer).checkTagRefused},
	{"reply-subjects", "reply-subjects", (*conformer).checkReplySubjects},
	{"decode", "decoding-a-snowflake-id", (*conformer).checkDecode},
	{"decode-refused", "decoding-a-snowflake-id", (*conformer).checkDecodeRefused},
	{"admin-add-refused", "managing-tags", (*conformer).checkAddRefused},
	{"admin-add", "managing-tags", (*conformer).checkAdd},
	{"admin-add-exists", "errors", (*conformer).checkAddExists},
	{"segment-ids", "getting-ids", (*conformer).checkSegmentIDs},
	{"segment-not-found", "errors", (*conformer).checkSegmentNotFound},
	{"admin-update", "managing-tags", (*conformer).checkUpdate},
	{"admin-update-refused", "managing-tags", (*conformer).checkUpdateRefused},
	{"admin-list", "managing-tags", (*conformer).checkList},
}

// conformer holds the connection and what the rules learn from the deployment.
type conformer struct {
	nc      *nats.Conn
	subj    wire.Subjects
	tag     string        // the scratch tag
	timeout time.Duration // for each answer
	quiet   time.Duration // for each answer that must not come

	maxBatch int          // from $SRV.INFO metadata; 0 until srv-info passed
	info     *micro.Info  // $SRV.INFO's answer
	added    bool         // the scratch tag was added
	tagInfo  wire.TagInfo // the scratch tag as the add answered it
}

// runConform is `dispenser conform`.
func runConform(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("dispenser conform", conformUsage, stderr)
	var cf clientFlags
	cf.register(fs)
	tag := fs.String("tag", "", "the scratch tag the admin rules add and change, one that does not exist yet (default conform-<random>)")
	if err := parseSubcommand(fs, args, os.Getenv); err != nil {
		return err
	}
	if fs.NArg() != 0 {
		return &usageError{fmt.Errorf("conform: takes no arguments, got %q", fs.Args())}
	}
	if *tag == "" {
		var b [6]byte
		_, _ = rand.Read(b[:]) // crypto/rand never fails on Linux
		*tag = "conform-" + hex.EncodeToString(b[:])
	}
	if err := wire.CheckTag(*tag); err != nil {
		return &usageError{fmt.Errorf("--tag: %w", err)}
	}
	nc, _, err := cf.connect()
	if err != nil {
		return err
	}
	defer nc.Close()
	c := &conformer{nc: nc, subj: wire.Subjects{Prefix: cf.prefix}, tag: *tag, timeout: cf.timeout, quiet: conformQuiet}
	if failed := c.run(ctx, stdout); failed > 0 {
		return fmt.Errorf("conform: %d of %d rules failed", failed, len(conformRules))
	}
	return nil
}

// run checks every rule, prints a line for each, and returns how many failed.
func (c *conformer) run(ctx context.Context, out io.Writer) (failed int) {
	fmt.Fprintf(out, "scratch tag %s\n", c.tag)
	for _, r := range conformRules {
		if err := r.check(c, ctx); err != nil {
			failed++
			fmt.Fprintf(out, "FAIL %s: %v (PROTOCOL.md#%s)\n", r.name, err, r.section)
			continue
		}
		fmt.Fprintf(out, "PASS %s\n", r.name)
	}
	return failed
}

// request sends one request, with an Leaf-Encoding header when enc is not "", and
// returns the raw reply.
func (c *conformer) request(ctx context.Context, subject, body, enc string) (*nats.Msg, error) {
	m := nats.NewMsg(subject)
	m.Data = []byte(body)
	if enc != "" {
		m.Header.Set(wire.EncodingHeader, enc)
	}
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	reply, err := c.nc.RequestMsgWithContext(ctx, m)
	if err != nil {
		return nil, fmt.Errorf("%s %q: %w", subject, body, err)
	}
	return reply, nil
}

// ids asks subject for the IDs of body and checks the reply holds n of them, well
// encoded in enc ("" or "text": text) and strictly increasing.
func (c *conformer) ids(ctx context.Context, subject, body, enc string, n int) ([]int64, error) {
	reply, err := c.request(ctx, subject, body, enc)
	if err != nil {
		return nil, err
	}
	ids, err := checkIDsReply(reply, n, enc == "binary")
	if err != nil {
		return nil, fmt.Errorf("%s %q: %w", subject, body, err)
	}
	return ids, nil
}

// checkIDsReply checks a reply is n IDs and nothing else: no error headers; as text,
// positive decimals separated by single \n without a trailing one, at most 20 bytes an
// ID; as binary, 8n bytes of big-endian positive int64s; strictly increasing.
func checkIDsReply(reply *nats.Msg, n int, binaryEnc bool) ([]int64, error) {
	if code := reply.Header.Get(wire.ServiceErrorCodeHeader); code != "" {
		return nil, fmt.Errorf("got error %s %q, want %d IDs", code, reply.Header.Get(wire.ServiceErrorHeader), n)
	}
	var ids []int64
	if binaryEnc {
		if len(reply.Data) != 8*n {
			return nil, fmt.Errorf("binary reply of %d bytes, want %d (%d IDs)", len(reply.Data), 8*n, n)
		}
		for i := 0; i < len(reply.Data); i += 8 {
			v := binary.BigEndian.Uint64(reply.Data[i:])
			if v > math.MaxInt64 {
				return nil, fmt.Errorf("binary ID %d at %d does not fit a signed 64-bit integer", v, i/8)
			}
			ids = append(ids, int64(v))
		}
	} else {
		if len(reply.Data) > wire.MaxTextID*n {
			return nil, fmt.Errorf("text reply of %d bytes, want at most 20 a ID (%d)", len(reply.Data), wire.MaxTextID*n)
		}
		if !textIDs.Match(reply.Data) {
			return nil, fmt.Errorf("text reply %s is not decimals separated by single \\n (no trailing newline)", clip(reply.Data))
		}
		for f := range strings.SplitSeq(string(reply.Data), "\n") {
			id, err := strconv.ParseInt(f, 10, 64)
			if err != nil {
				return nil, fmt.Errorf("text ID %q does not fit a signed 64-bit integer", f)
			}
			ids = append(ids, id)
		}
	}
	if len(ids) != n {
		return nil, fmt.Errorf("got %d IDs, want %d", len(ids), n)
	}
	for i, id := range ids {
		if id < 1 {
			return nil, fmt.Errorf("ID %d at %d is not positive", id, i)
		}
		if i > 0 && id <= ids[i-1] {
			return nil, fmt.Errorf("IDs not strictly increasing within the reply: %d after %d at %d", id, ids[i-1], i)
		}
	}
	return ids, nil
}

var textIDs = regexp.MustCompile(`^[0-9]+(\n[0-9]+)*$`)

// checkServiceError checks a reply is the service error code: no body, the code in
// Nats-Service-Error-Code and a reason in Nats-Service-Error.
func checkServiceError(reply *nats.Msg, code int) error {
	got := reply.Header.Get(wire.ServiceErrorCodeHeader)
	if got != strconv.Itoa(code) {
		if got == "" {
			return fmt.Errorf("got a reply without %s (body %s), want error %d", wire.ServiceErrorCodeHeader, clip(reply.Data), code)
		}
		return fmt.Errorf("got error %s %q, want %d", got, reply.Header.Get(wire.ServiceErrorHeader), code)
	}
	if reply.Header.Get(wire.ServiceErrorHeader) == "" {
		return fmt.Errorf("error %d without a reason in %s", code, wire.ServiceErrorHeader)
	}
	if len(reply.Data) != 0 {
		return fmt.Errorf("error %d with a body %s, want none", code, clip(reply.Data))
	}
	return nil
}

// wantError asks subject with body (and encoding enc) and checks the answer is error code.
func (c *conformer) wantError(ctx context.Context, subject, body, enc string, code int) error {
	reply, err := c.request(ctx, subject, body, enc)
	if err != nil {
		return err
	}
	if err := checkServiceError(reply, code); err != nil {
		return fmt.Errorf("%s %q: %w", subject, body, err)
	}
	return nil
}

// clip quotes at most 80 bytes of b for a message.
func clip(b []byte) string {
	if len(b) > 80 {
		return strconv.Quote(string(b[:80])) + "..."
	}
	return strconv.Quote(string(b))
}

func (c *conformer) snowflake() string { return c.subj.IDs(wire.Snowflake, "conform") }
func (c *conformer) segment() string   { return c.subj.IDs(wire.Segment, c.tag) }

// needMaxBatch is max_batch, or why a rule that needs it cannot run.
func (c *conformer) needMaxBatch() (int, error) {
	if c.maxBatch == 0 {
		return 0, errors.New("needs max_batch from $SRV.INFO (srv-info failed)")
	}
	return c.maxBatch, nil
}

func (c *conformer) needTag() error {
	if !c.added {
		return fmt.Errorf("needs the scratch tag %s (admin-add failed)", c.tag)
	}
	return nil
}

// srvRequest asks a $SRV verb of the service (id "" for every instance) and decodes the
// JSON answer into v.
func (c *conformer) srvRequest(ctx context.Context, verb micro.Verb, id string, v any) error {
	subject, err := micro.ControlSubject(verb, c.subj.Service(), id)
	if err != nil {
		return err
	}
	reply, err := c.request(ctx, subject, "", "")
	if err != nil {
		return err
	}
	if err := json.Unmarshal(reply.Data, v); err != nil {
		return fmt.Errorf("%s: answer %s is not its JSON: %v", subject, clip(reply.Data), err)
	}
	return nil
}

// checkIdentity checks the service identity every $SRV answer carries.
func (c *conformer) checkIdentity(verb micro.Verb, id micro.ServiceIdentity, typ, wantType string) error {
	switch {
	case typ != wantType:
		return fmt.Errorf("$SRV.%s type %q, want %q", verb, typ, wantType)
	case id.Name != c.subj.Service():
		return fmt.Errorf("$SRV.%s name %q, want the prefix %q", verb, id.Name, c.subj.Service())
	case id.ID == "":
		return fmt.Errorf("$SRV.%s without an instance id", verb)
	case !semver.MatchString(id.Version):
		return fmt.Errorf("$SRV.%s version %q, want a semantic version (PROTOCOL.md: $SRV)", verb, id.Version)
	}
	if _, err := metaMaxBatch(id.Metadata); err != nil {
		return fmt.Errorf("$SRV.%s metadata: %w", verb, err)
	}
	return nil
}

// semver is a semantic version 2.0.0, as micro requires of a service's version.
var semver = regexp.MustCompile(`^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)(-[0-9A-Za-z-]+(\.[0-9A-Za-z-]+)*)?(\+[0-9A-Za-z-]+(\.[0-9A-Za-z-]+)*)?$`)

// metaMaxBatch reads max_batch from metadata: a count from 1 to 1,000,000.
func metaMaxBatch(meta map[string]string) (int, error) {
	s, ok := meta[wire.MetaMaxBatch]
	if !ok {
		return 0, fmt.Errorf("no %s", wire.MetaMaxBatch)
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 || n > wire.MaxBatchLimit {
		return 0, fmt.Errorf("%s %q, want a count from 1 to %d", wire.MetaMaxBatch, s, wire.MaxBatchLimit)
	}
	return n, nil
}

func (c *conformer) checkPing(ctx context.Context) error {
	var p micro.Ping
	if err := c.srvRequest(ctx, micro.PingVerb, "", &p); err != nil {
		return err
	}
	return c.checkIdentity(micro.PingVerb, p.ServiceIdentity, p.Type, micro.PingResponseType)
}

// conformEndpoints are the endpoints PROTOCOL.md names, by name, with their subjects.
func (c *conformer) conformEndpoints() map[string]string {
	return map[string]string{
		"segment":     c.subj.IDsWildcard(wire.Segment),
		"snowflake":   c.subj.IDsWildcard(wire.Snowflake),
		"decode":      c.subj.Decode(),
		"tags-add":    c.subj.AdminTags("add"),
		"tags-list":   c.subj.AdminTags("list"),
		"tags-update": c.subj.AdminTags("update"),
	}
}

func (c *conformer) checkInfo(ctx context.Context) error {
	var info micro.Info
	if err := c.srvRequest(ctx, micro.InfoVerb, "", &info); err != nil {
		return err
	}
	if err := c.checkIdentity(micro.InfoVerb, info.ServiceIdentity, info.Type, micro.InfoResponseType); err != nil {
		return err
	}
	if info.Description == "" {
		return errors.New("$SRV.INFO without a description")
	}
	want := c.conformEndpoints()
	seen := map[string]bool{}
	for _, e := range info.Endpoints {
		subject, ok := want[e.Name]
		if !ok {
			continue // more endpoints may come: readers ignore what they do not know
		}
		seen[e.Name] = true
		if e.Subject != subject {
			return fmt.Errorf("$SRV.INFO endpoint %s on %q, want %q", e.Name, e.Subject, subject)
		}
		if e.QueueGroup != c.subj.QueueGroup() {
			return fmt.Errorf("$SRV.INFO endpoint %s in queue group %q, want %q", e.Name, e.QueueGroup, c.subj.QueueGroup())
		}
	}
	for name := range want {
		if !seen[name] {
			return fmt.Errorf("$SRV.INFO lists no endpoint %s (on %s)", name, want[name])
		}
	}
	meta := info.Metadata
	if err := wire.CheckNodeID(meta[wire.MetaNodeID]); err != nil {
		return fmt.Errorf("$SRV.INFO metadata %s: %w", wire.MetaNodeID, err)
	}
	nums := map[string]int{}
	for _, k := range []string{wire.MetaWorkerID, wire.MetaWorkerIDMin, wire.MetaWorkerIDMax} {
		n, err := strconv.Atoi(meta[k])
		if err != nil || n < 0 {
			return fmt.Errorf("$SRV.INFO metadata %s %q, want a worker ID", k, meta[k])
		}
		nums[k] = n
	}
	if nums[wire.MetaWorkerID] < nums[wire.MetaWorkerIDMin] || nums[wire.MetaWorkerID] > nums[wire.MetaWorkerIDMax] {
		return fmt.Errorf("$SRV.INFO metadata worker_id %d outside worker_id_min..worker_id_max %d..%d", nums[wire.MetaWorkerID], nums[wire.MetaWorkerIDMin], nums[wire.MetaWorkerIDMax])
	}
	layouts := map[string][2]string{"leaf": {"1024", "4096"}, "js53": {"32", "128"}}
	layout := meta[wire.MetaSnowflakeLayout]
	if layout == "" {
		layout = "leaf" // PROTOCOL.md: a dispenser that publishes none runs leaf
	} else if w, ok := layouts[layout]; !ok {
		return fmt.Errorf("$SRV.INFO metadata %s %q, want leaf or js53", wire.MetaSnowflakeLayout, layout)
	} else if meta[wire.MetaSnowflakeWorkers] != w[0] || meta[wire.MetaSnowflakePerMs] != w[1] {
		return fmt.Errorf("$SRV.INFO metadata for layout %s: %s %q and %s %q, want %s and %s", layout,
			wire.MetaSnowflakeWorkers, meta[wire.MetaSnowflakeWorkers], wire.MetaSnowflakePerMs, meta[wire.MetaSnowflakePerMs], w[0], w[1])
	}
	if workers, _ := strconv.Atoi(layouts[layout][0]); nums[wire.MetaWorkerIDMax] >= workers {
		return fmt.Errorf("$SRV.INFO metadata worker_id_max %d beyond layout %s's %d worker IDs", nums[wire.MetaWorkerIDMax], layout, workers)
	}
	c.maxBatch, _ = metaMaxBatch(meta)
	c.info = &info
	return nil
}

func (c *conformer) checkInfoByID(ctx context.Context) error {
	if c.info == nil {
		return errors.New("needs $SRV.INFO (srv-info failed)")
	}
	var info micro.Info
	if err := c.srvRequest(ctx, micro.InfoVerb, c.info.ID, &info); err != nil {
		return err
	}
	if info.ID != c.info.ID || info.Name != c.info.Name {
		return fmt.Errorf("$SRV.INFO.%s.%s answered by %s %s", c.info.Name, c.info.ID, info.Name, info.ID)
	}
	if got, want := info.Metadata[wire.MetaMaxBatch], c.info.Metadata[wire.MetaMaxBatch]; got != want {
		return fmt.Errorf("max_batch %q by id, %q in $SRV.INFO", got, want)
	}
	return nil
}

func (c *conformer) checkStats(ctx context.Context) error {
	var st micro.Stats
	if err := c.srvRequest(ctx, micro.StatsVerb, "", &st); err != nil {
		return err
	}
	if err := c.checkIdentity(micro.StatsVerb, st.ServiceIdentity, st.Type, micro.StatsResponseType); err != nil {
		return err
	}
	want := c.conformEndpoints()
	for _, e := range st.Endpoints {
		if subject, ok := want[e.Name]; ok && e.Subject == subject && e.QueueGroup == c.subj.QueueGroup() {
			delete(want, e.Name)
		}
	}
	if len(want) > 0 {
		return fmt.Errorf("$SRV.STATS lacks the endpoints %q (on their subjects, in queue group %q)", slices.Sorted(maps.Keys(want)), c.subj.QueueGroup())
	}
	return nil
}

func (c *conformer) checkOneID(ctx context.Context) error {
	for _, enc := range []string{"", "text"} {
		if _, err := c.ids(ctx, c.snowflake(), "", enc, 1); err != nil {
			return err
		}
	}
	return nil
}

func (c *conformer) checkCountText(ctx context.Context) error {
	_, err := c.ids(ctx, c.snowflake(), "5", "", 5)
	return err
}

func (c *conformer) checkCountWhiteSpace(ctx context.Context) error {
	for body, n := range map[string]int{" 7\n": 7, "\t3\r\n": 3, " \r\n\t\v\f": 1, "0003": 3, "\v2\f": 2} {
		if _, err := c.ids(ctx, c.snowflake(), body, "", n); err != nil {
			return err
		}
	}
	return nil
}

func (c *conformer) checkBinary(ctx context.Context) error {
	for body, n := range map[string]int{"": 1, "1000": 1000} {
		if _, err := c.ids(ctx, c.snowflake(), body, "binary", n); err != nil {
			return err
		}
	}
	return nil
}

func (c *conformer) checkMaxBatch(ctx context.Context) error {
	max, err := c.needMaxBatch()
	if err != nil {
		return err
	}
	for _, enc := range []string{"", "binary"} {
		if _, err := c.ids(ctx, c.snowflake(), strconv.Itoa(max), enc, max); err != nil {
			return err
		}
	}
	return c.wantError(ctx, c.snowflake(), strconv.Itoa(max+1), "", 400)
}

// checkReplyOrder asks batches in both encodings, several times: every reply strictly
// increases (a reply that does not is named by ids).
func (c *conformer) checkReplyOrder(ctx context.Context) error {
	n := 100
	if c.maxBatch > 0 {
		n = min(n, c.maxBatch)
	}
	for range 3 {
		for _, enc := range []string{"", "binary"} {
			if _, err := c.ids(ctx, c.snowflake(), strconv.Itoa(n), enc, n); err != nil {
				return err
			}
		}
	}
	return nil
}

func (c *conformer) checkCountRefused(ctx context.Context) error {
	for _, body := range []string{"abc", "0", "-1", "+1", "2.0", "1e3", "1 2", "0x10", "99999999999999999999"} {
		if err := c.wantError(ctx, c.snowflake(), body, "", 400); err != nil {
			return err
		}
	}
	return nil
}

func (c *conformer) checkEncodingRefused(ctx context.Context) error {
	for _, enc := range []string{"json", "Binary", "TEXT"} {
		if err := c.wantError(ctx, c.snowflake(), "", enc, 400); err != nil {
			return fmt.Errorf("%s %s: %w", wire.EncodingHeader, enc, err)
		}
	}
	return nil
}

// checkOneAnswer: one request to an ID subject and one to decode (both at once, so
// that one quiet wait serves both) are each answered exactly once: every dispenser
// subscribes in the queue group.
func (c *conformer) checkOneAnswer(ctx context.Context) error {
	inbox := c.nc.NewInbox()
	ch := make(chan *nats.Msg, 64)
	sub, err := c.nc.ChanSubscribe(inbox+".*", ch)
	if err != nil {
		return err
	}
	defer sub.Unsubscribe() //nolint:errcheck // closing anyway
	subjects := map[string]string{inbox + ".ids": c.snowflake(), inbox + ".decode": c.subj.Decode()}
	for reply, subject := range subjects {
		if err := c.nc.PublishRequest(subject, reply, []byte("1")); err != nil {
			return err
		}
	}
	answers := map[string]int{}
	timer := time.NewTimer(c.timeout)
	defer timer.Stop()
	for {
		select {
		case m := <-ch:
			answers[m.Subject]++
			if len(answers) == len(subjects) {
				timer.Reset(c.quiet) // both answered: wait for a second answer
			}
			continue
		case <-timer.C:
		case <-ctx.Done():
			return ctx.Err()
		}
		break
	}
	for reply, subject := range subjects {
		if answers[reply] != 1 {
			return fmt.Errorf("%s: %d answers to one request, want exactly 1 (every dispenser in queue group %q)", subject, answers[reply], c.subj.QueueGroup())
		}
	}
	return nil
}

func (c *conformer) checkErrorHeaders(ctx context.Context) error {
	return c.wantError(ctx, c.snowflake(), "abc", "", 400)
}

func (c *conformer) checkNoResponders(ctx context.Context) error {
	// Under decode, which an operator may ask (deploy/nats-roles.conf), but no subject of it.
	subject := c.subj.Decode() + "-conform-nobody-" + strconv.FormatInt(time.Now().UnixNano(), 36)
	_, err := c.request(ctx, subject, "", "")
	if !errors.Is(err, nats.ErrNoResponders) {
		return fmt.Errorf("a subject nobody serves: got %v, want NATS's no responders status at once", err)
	}
	return nil
}

// checkTagEncoding: tokens that are exactly the encoding of a tag are served (snowflake
// accepts any valid tag's token), and the segment subject decodes them too (an unknown
// tag is 404, not 400).
func (c *conformer) checkTagEncoding(ctx context.Context) error {
	for _, tag := range []string{"orders", "com.acme.order", "order:create", "a b", "订单", "%", strings.Repeat("t", 128)} {
		token := wire.TagToken(tag)
		if _, err := c.ids(ctx, c.subj.Prefix+".snowflake."+token, "", "", 1); err != nil {
			return fmt.Errorf("tag %q as %s: %w", tag, token, err)
		}
	}
	absent := c.tag + ".absent"
	if err := c.wantError(ctx, c.subj.Prefix+".segment."+wire.TagToken(absent), "", "", 404); err != nil {
		return fmt.Errorf("tag %q that does not exist: %w", absent, err)
	}
	return nil
}

// checkTagRefused: a token that is not exactly the encoding of a valid tag is 400; the
// tag unencoded is told the token to send.
func (c *conformer) checkTagRefused(ctx context.Context) error {
	for _, token := range []string{"%6Frders", "a%2eb", "a%2", "a%ZZ", "a+b", "bad$tag", "%00", "a%7F", "%C3", strings.Repeat("t", 129)} {
		for _, kind := range []wire.Kind{wire.Snowflake, wire.Segment} {
			if err := c.wantError(ctx, c.subj.Prefix+"."+kind.String()+"."+token, "", "", 400); err != nil {
				return err
			}
		}
	}
	reply, err := c.request(ctx, c.subj.Prefix+".snowflake.订单", "", "")
	if err != nil {
		return err
	}
	if err := checkServiceError(reply, 400); err != nil {
		return fmt.Errorf("the tag 订单 unencoded: %w", err)
	}
	if want := `send "%E8%AE%A2%E5%8D%95"`; !strings.Contains(reply.Header.Get(wire.ServiceErrorHeader), want) {
		return fmt.Errorf("the tag 订单 unencoded: reason %q does not say %s", reply.Header.Get(wire.ServiceErrorHeader), want)
	}
	return nil
}

// checkReplySubjects: a request whose reply subject lies under the prefix or starts
// with $ is dropped unanswered, while the same request to an inbox is answered.
func (c *conformer) checkReplySubjects(ctx context.Context) error {
	suffix := strconv.FormatInt(time.Now().UnixNano(), 36)
	ch := make(chan *nats.Msg, 8)
	for _, reply := range []string{c.subj.Prefix + ".conform-reply." + suffix, "$CONFORM." + suffix} {
		sub, err := c.nc.ChanSubscribe(reply, ch)
		if err != nil {
			return err
		}
		defer sub.Unsubscribe() //nolint:errcheck // closing anyway
		if err := c.nc.Flush(); err != nil {
			return err
		}
		if err := c.nc.LastError(); errors.Is(err, nats.ErrPermissionViolation) && strings.Contains(err.Error(), reply) {
			return fmt.Errorf("cannot check: this NATS user may not subscribe to %s (%v); run conform as a user that may", reply, err)
		}
		if err := c.nc.PublishRequest(c.snowflake(), reply, nil); err != nil {
			return err
		}
	}
	// The same request to an inbox, after them: once that is answered, they had their
	// turn.
	if _, err := c.ids(ctx, c.snowflake(), "", "", 1); err != nil {
		return err
	}
	select {
	case m := <-ch:
		return fmt.Errorf("answered to the reply subject %s (body %s), want it dropped", m.Subject, clip(m.Data))
	case <-time.After(c.quiet):
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (c *conformer) checkDecode(ctx context.Context) error {
	ids, err := c.ids(ctx, c.snowflake(), "", "", 1)
	if err != nil {
		return err
	}
	id := ids[0]
	reply, err := c.request(ctx, c.subj.Decode(), " "+strconv.FormatInt(id, 10)+"\n", "")
	if err != nil {
		return err
	}
	if code := reply.Header.Get(wire.ServiceErrorCodeHeader); code != "" {
		return fmt.Errorf("decode %d: error %s %q", id, code, reply.Header.Get(wire.ServiceErrorHeader))
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(reply.Data, &fields); err != nil {
		return fmt.Errorf("decode %d: answer %s is not a JSON object", id, clip(reply.Data))
	}
	for _, k := range []string{"id", "timestamp", "time", "worker_id", "sequence"} {
		if _, ok := fields[k]; !ok {
			return fmt.Errorf("decode %d: answer %s has no %q", id, clip(reply.Data), k)
		}
	}
	var d wire.DecodedID
	if err := json.Unmarshal(reply.Data, &d); err != nil {
		return fmt.Errorf("decode %d: answer %s: %v", id, clip(reply.Data), err)
	}
	if d.ID != strconv.FormatInt(id, 10) {
		return fmt.Errorf("decode %d: id %q, want the ID as a string", id, d.ID)
	}
	if want := time.UnixMilli(d.Timestamp).UTC().Format("2006-01-02T15:04:05.000Z"); d.Time != want {
		return fmt.Errorf("decode %d: time %q, want the timestamp %d as %q", id, d.Time, d.Timestamp, want)
	}
	if skew := time.Since(time.UnixMilli(d.Timestamp)); skew > time.Hour || skew < -time.Hour {
		return fmt.Errorf("decode %d: timestamp %s, an hour or more from this host's clock (%s): is the epoch added back?", id, d.Time, time.Now().UTC().Format(time.RFC3339))
	}
	if d.WorkerID < 0 || d.Sequence < 0 {
		return fmt.Errorf("decode %d: worker_id %d, sequence %d", id, d.WorkerID, d.Sequence)
	}
	return nil
}

func (c *conformer) checkDecodeRefused(ctx context.Context) error {
	for _, body := range []string{"", "0", "-1", "abc", "9223372036854775808", "1.5", "+7"} {
		if err := c.wantError(ctx, c.subj.Decode(), body, "", 400); err != nil {
			return err
		}
	}
	return nil
}

// tagReply checks an admin answer is a tag as JSON, with every field PROTOCOL.md
// names, and returns it.
func tagReply(reply *nats.Msg) (wire.TagInfo, error) {
	var t wire.TagInfo
	if code := reply.Header.Get(wire.ServiceErrorCodeHeader); code != "" {
		return t, fmt.Errorf("got error %s %q, want the tag", code, reply.Header.Get(wire.ServiceErrorHeader))
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(reply.Data, &fields); err != nil {
		return t, fmt.Errorf("answer %s is not a JSON object", clip(reply.Data))
	}
	for _, k := range []string{"tag", "max_id", "max_id_str", "step", "description", "update_time", "monotonic", "opaque", "bits"} {
		if _, ok := fields[k]; !ok {
			return t, fmt.Errorf("answer %s has no %q", clip(reply.Data), k)
		}
	}
	if err := json.Unmarshal(reply.Data, &t); err != nil {
		return t, fmt.Errorf("answer %s: %v", clip(reply.Data), err)
	}
	if t.MaxIDStr != strconv.FormatInt(t.MaxID, 10) {
		return t, fmt.Errorf("max_id_str %q is not max_id %d", t.MaxIDStr, t.MaxID)
	}
	if t.UpdateTime != "" {
		if _, err := time.Parse(time.RFC3339, t.UpdateTime); err != nil || !strings.HasSuffix(t.UpdateTime, "Z") {
			return t, fmt.Errorf("update_time %q is not RFC 3339 in UTC", t.UpdateTime)
		}
	}
	return t, nil
}

func (c *conformer) admin(ctx context.Context, op, body string) (wire.TagInfo, error) {
	reply, err := c.request(ctx, c.subj.AdminTags(op), body, "")
	if err != nil {
		return wire.TagInfo{}, err
	}
	t, err := tagReply(reply)
	if err != nil {
		return t, fmt.Errorf("%s %s: %w", c.subj.AdminTags(op), body, err)
	}
	return t, nil
}

// jsonString is s as a JSON string.
func jsonString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// checkAddRefused runs before the scratch tag exists: every body is 400, so none adds
// it (if one did, admin-add fails with 409).
func (c *conformer) checkAddRefused(ctx context.Context) error {
	t := jsonString(c.tag)
	for _, body := range []string{
		`{"tag":` + t + `}`,
		`{"tag":` + t + `,"step":0}`,
		`{"tag":` + t + `,"step":10000001}`,
		`{"tag":` + t + `,"stpe":10}`,
		`{"tag":` + t + `,"step":10,"max_id":0}`,
		`{"tag":` + t + `,"step":10} {"tag":` + t + `,"step":10}`,
		`{"tag":` + jsonString(c.tag+"\u0001") + `,"step":10}`,
		`{"tag":"","step":10}`,
		`tag=` + c.tag,
		``,
	} {
		if err := c.wantError(ctx, c.subj.AdminTags("add"), body, "", 400); err != nil {
			return err
		}
	}
	return nil
}

func (c *conformer) checkAdd(ctx context.Context) error {
	t, err := c.admin(ctx, "add", `{"tag":`+jsonString(c.tag)+`,"step":1000,"description":"leafbus conform"}`)
	if err != nil {
		return err
	}
	c.added = true
	c.tagInfo = t
	if t.Tag != c.tag || t.Step != 1000 || t.MaxID != 1 || t.Description != "leafbus conform" || t.Monotonic || t.Opaque || t.Bits != 63 {
		return fmt.Errorf("added tag %+v, want tag %q, step 1000, max_id 1 (the default), the description, not monotonic, not opaque, bits 63", t, c.tag)
	}
	return nil
}

func (c *conformer) checkAddExists(ctx context.Context) error {
	if err := c.needTag(); err != nil {
		return err
	}
	return c.wantError(ctx, c.subj.AdminTags("add"), `{"tag":`+jsonString(c.tag)+`,"step":10}`, "", 409)
}

// checkSegmentIDs: the scratch tag is served at once, in both encodings, no ID twice.
func (c *conformer) checkSegmentIDs(ctx context.Context) error {
	if err := c.needTag(); err != nil {
		return err
	}
	seen := map[int64]bool{}
	for i, enc := range []string{"", "binary", "", "binary"} {
		ids, err := c.ids(ctx, c.segment(), strconv.Itoa(3+i), enc, 3+i)
		if err != nil {
			return err
		}
		for _, id := range ids {
			if seen[id] {
				return fmt.Errorf("ID %d of %s handed out twice", id, c.tag)
			}
			seen[id] = true
		}
	}
	return nil
}

func (c *conformer) checkSegmentNotFound(ctx context.Context) error {
	for _, body := range []string{"", "10"} {
		if err := c.wantError(ctx, c.subj.IDs(wire.Segment, c.tag+"-absent"), body, "", 404); err != nil {
			return err
		}
	}
	return nil
}

func (c *conformer) checkUpdate(ctx context.Context) error {
	if err := c.needTag(); err != nil {
		return err
	}
	t, err := c.admin(ctx, "update", `{"tag":`+jsonString(c.tag)+`,"step":5000}`)
	if err != nil {
		return err
	}
	if t.Tag != c.tag || t.Step != 5000 || t.Description != "leafbus conform" {
		return fmt.Errorf("updated tag %+v, want step 5000 and the description kept", t)
	}
	t, err = c.admin(ctx, "update", `{"tag":`+jsonString(c.tag)+`,"description":"leafbus conform 2"}`)
	if err != nil {
		return err
	}
	if t.Step != 5000 || t.Description != "leafbus conform 2" {
		return fmt.Errorf("updated tag %+v, want step 5000 kept and the new description", t)
	}
	c.tagInfo = t
	return nil
}

func (c *conformer) checkUpdateRefused(ctx context.Context) error {
	if err := c.needTag(); err != nil {
		return err
	}
	t := jsonString(c.tag)
	for _, body := range []string{
		`{"tag":` + t + `}`,
		`{"tag":` + t + `,"step":-1}`,
		`{"tag":` + t + `,"stpe":10}`,
		`{"tag":` + t + `,"max_id":1}`, // below max_id: segments were taken
	} {
		if err := c.wantError(ctx, c.subj.AdminTags("update"), body, "", 400); err != nil {
			return err
		}
	}
	return c.wantError(ctx, c.subj.AdminTags("update"), `{"tag":`+jsonString(c.tag+"-absent")+`,"step":10}`, "", 404)
}

func (c *conformer) checkList(ctx context.Context) error {
	if err := c.needTag(); err != nil {
		return err
	}
	reply, err := c.request(ctx, c.subj.AdminTags("list"), "", "")
	if err != nil {
		return err
	}
	if code := reply.Header.Get(wire.ServiceErrorCodeHeader); code != "" {
		return fmt.Errorf("error %s %q, want the tags", code, reply.Header.Get(wire.ServiceErrorHeader))
	}
	var tags []json.RawMessage
	if err := json.Unmarshal(reply.Data, &tags); err != nil {
		return fmt.Errorf("answer %s is not a JSON array", clip(reply.Data))
	}
	var names []string
	found := false
	for _, raw := range tags {
		t, err := tagReply(&nats.Msg{Data: raw, Header: nats.Header{}})
		if err != nil {
			return fmt.Errorf("listed tag: %w", err)
		}
		names = append(names, t.Tag)
		if t.Tag == c.tag {
			found = true
			if t.Step != c.tagInfo.Step || t.Description != c.tagInfo.Description {
				return fmt.Errorf("listed %s with step %d, description %q; want %d, %q as updated", c.tag, t.Step, t.Description, c.tagInfo.Step, c.tagInfo.Description)
			}
		}
	}
	if !found {
		return fmt.Errorf("the list of %d tags lacks %s", len(names), c.tag)
	}
	if !slices.IsSortedFunc(names, func(a, b string) int { return bytes.Compare([]byte(a), []byte(b)) }) {
		return errors.New("the tags are not sorted bytewise")
	}
	return nil
}
