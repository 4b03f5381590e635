package main

// The protocol conformance test: every row of PROTOCOL.md's "Getting IDs", "Errors",
// "Decoding", "Discovery" and "Managing tags", checked on the wire against the real
// dispenser code path (embedded NATS on a random port).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/leafbus/leafbus/client"
	"github.com/leafbus/leafbus/dispenser"
	"github.com/leafbus/leafbus/snowflake"
	"github.com/leafbus/leafbus/wire"
)

// request sends one raw request and returns the reply.
func request(t *testing.T, nc *nats.Conn, subject, body string, header map[string]string) *nats.Msg {
	t.Helper()
	msg := nats.NewMsg(subject)
	msg.Data = []byte(body)
	for k, v := range header {
		msg.Header.Set(k, v)
	}
	reply, err := nc.RequestMsg(msg, 5*time.Second)
	if err != nil {
		t.Fatalf("request %s %q: %v", subject, body, err)
	}
	return reply
}

// wantIDs checks a reply is a text or binary list of n positive, strictly increasing
// IDs (conform's rule, checkIDsReply) and returns them.
func wantIDs(t *testing.T, reply *nats.Msg, n int, binaryEnc bool) []int64 {
	t.Helper()
	ids, err := checkIDsReply(reply, n, binaryEnc)
	if err != nil {
		t.Fatal(err)
	}
	return ids
}

// wantError checks a reply is a service error with code (conform's rule,
// checkServiceError) and a description that contains each of parts.
func wantError(t *testing.T, reply *nats.Msg, code int, parts ...string) {
	t.Helper()
	if err := checkServiceError(reply, code); err != nil {
		t.Fatal(err)
	}
	desc := reply.Header.Get(micro.ErrorHeader)
	for _, p := range parts {
		if !strings.Contains(desc, p) {
			t.Fatalf("error description %q does not contain %q", desc, p)
		}
	}
}

func TestProtocolGettingIDs(t *testing.T) {
	d := startDispenser(t, nil)
	nc := d.connect(t)
	seg := "leaf.segment." + dispenser.SampleTagName
	bin := map[string]string{"Leaf-Encoding": "binary"}

	tests := []struct {
		name    string
		subject string
		body    string
		header  map[string]string
		n       int
		binary  bool
	}{
		{"SegmentEmptyBodyOneID", seg, "", nil, 1, false},
		{"SegmentWhiteSpaceOneID", seg, " \r\n\t", nil, 1, false},
		{"SegmentCount", seg, "5", nil, 5, false},
		{"SegmentCountWhiteSpace", seg, " 7\n", nil, 7, false},
		{"SegmentLeadingZeros", seg, "0003", nil, 3, false},
		{"SegmentMaxBatch", seg, "10000", nil, 10000, false},
		{"SegmentTextHeader", seg, "2", map[string]string{"Leaf-Encoding": "text"}, 2, false},
		{"SegmentBinaryOne", seg, "", bin, 1, true},
		{"SegmentBinaryMany", seg, "1000", bin, 1000, true},
		{"SnowflakeOne", "leaf.snowflake.any", "", nil, 1, false},
		{"SnowflakeLongTag", "leaf.snowflake." + strings.Repeat("a", 128), "3", nil, 3, false},
		{"SnowflakeTagChars", "leaf.snowflake.A-z_0-9", "", nil, 1, false},
		{"SnowflakeMaxBatchBinary", "leaf.snowflake.etl", "10000", bin, 10000, true},
	}
	seen := map[string]map[int64]bool{"segment": {}, "snowflake": {}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ids := wantIDs(t, request(t, nc, tt.subject, tt.body, tt.header), tt.n, tt.binary)
			kind := strings.Split(tt.subject, ".")[1]
			for _, id := range ids {
				if seen[kind][id] {
					t.Fatalf("%s ID %d handed out twice", kind, id)
				}
				seen[kind][id] = true
			}
		})
	}
	t.Run("OneIDIsJustItsNumber", func(t *testing.T) {
		reply := request(t, nc, seg, "", nil)
		if _, err := strconv.ParseUint(string(reply.Data), 10, 63); err != nil {
			t.Fatalf("one-ID reply %q is not a bare decimal: %v", reply.Data, err)
		}
	})
	t.Run("SegmentIDsIncreaseAcrossReplies", func(t *testing.T) {
		// One dispenser, one tag: each reply continues the segment.
		var last int64
		for i := 0; i < 20; i++ {
			ids := wantIDs(t, request(t, nc, seg, "3", nil), 3, false)
			if ids[0] <= last {
				t.Fatalf("reply %d starts at %d, not after %d", i, ids[0], last)
			}
			last = ids[2]
		}
	})
}

func TestProtocolErrors(t *testing.T) {
	d := startDispenser(t, nil)
	nc := d.connect(t)
	seg := "leaf.segment." + dispenser.SampleTagName
	tests := []struct {
		name    string
		subject string
		body    string
		header  map[string]string
		code    int
		parts   []string
	}{
		{"CountLetters", seg, "abc", nil, 400, []string{`count "abc" is not a whole number between 1 and 10000`}},
		{"CountZero", seg, "0", nil, 400, []string{`count "0"`}},
		{"CountOverMax", seg, "10001", nil, 400, []string{`count "10001"`, "10000"}},
		{"CountNegative", seg, "-1", nil, 400, []string{`count "-1"`}},
		{"CountSign", seg, "+1", nil, 400, []string{`count "+1"`}},
		{"CountDecimal", seg, "2.0", nil, 400, []string{`count "2.0"`}},
		{"CountSnowflake", "leaf.snowflake.x", "1e3", nil, 400, []string{`count "1e3"`}},
		{"TagTooLong", "leaf.segment." + strings.Repeat("a", 129), "", nil, 400, []string{"tag"}},
		{"TagBadChar", "leaf.segment.bad$tag", "", nil, 400, []string{"bad$tag"}},
		{"SnowflakeTagBadChar", "leaf.snowflake.a+b", "", nil, 400, []string{"a+b"}},
		{"EncodingUnknown", seg, "", map[string]string{"Leaf-Encoding": "json"}, 400, []string{`"json"`}},
		{"EncodingCase", seg, "", map[string]string{"Leaf-Encoding": "Binary"}, 400, []string{`"Binary"`}},
		{"TagNotFound", "leaf.segment.no-such-tag", "", nil, 404, []string{"no-such-tag"}},
		{"TagNotFoundBatch", "leaf.segment.no-such-tag", "10", nil, 404, []string{"no-such-tag"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			wantError(t, request(t, nc, tt.subject, tt.body, tt.header), tt.code, tt.parts...)
		})
	}
	t.Run("NoResponders", func(t *testing.T) {
		_, err := nc.Request("other.segment."+dispenser.SampleTagName, nil, 2*time.Second)
		if !errors.Is(err, nats.ErrNoResponders) {
			t.Fatalf("request with no dispenser: %v, want nats.ErrNoResponders", err)
		}
	})
}

// TestProtocolUnavailable steps the dispenser's (injected) clock back by more than it
// waits out: snowflake requests get 503 naming the offset, segment requests still work,
// and once the clock has passed the last timestamp issued, snowflake serves again.
func TestProtocolUnavailable(t *testing.T) {
	clock := snowflake.NewFakeClock(time.Now())
	d := startDispenser(t, func(c *testConfig) { c.Clock = clock })
	nc := d.connect(t)
	before := wantIDs(t, request(t, nc, "leaf.snowflake.x", "", nil), 1, false)[0]

	clock.Add(-10 * time.Second)
	reply := request(t, nc, "leaf.snowflake.x", "", nil)
	wantError(t, reply, 503, "backwards")
	if desc := reply.Header.Get(micro.ErrorHeader); !strings.Contains(desc, "10s") && !strings.Contains(desc, "10000ms") {
		t.Fatalf("503 description %q does not name the 10s offset", desc)
	}
	wantIDs(t, request(t, nc, "leaf.segment."+dispenser.SampleTagName, "", nil), 1, false)

	// The stats show the offset and the refusals.
	var stats micro.Stats
	if err := json.Unmarshal(request(t, nc, "$SRV.STATS.leaf", "", nil).Data, &stats); err != nil {
		t.Fatal(err)
	}
	var gen struct {
		Source struct {
			Generator struct {
				Refused       uint64 `json:"refused"`
				ClockOffsetMs int64  `json:"clock_offset_ms"`
			} `json:"generator"`
		} `json:"source"`
	}
	for _, e := range stats.Endpoints {
		if e.Name == "snowflake" {
			if err := json.Unmarshal(e.Data, &gen); err != nil {
				t.Fatalf("snowflake stats data %s: %v", e.Data, err)
			}
		}
	}
	if g := gen.Source.Generator; g.Refused < 1 || g.ClockOffsetMs < 9000 {
		t.Fatalf("snowflake stats refused %d, clock_offset_ms %d; want >= 1 and about 10000", g.Refused, g.ClockOffsetMs)
	}

	clock.Add(10*time.Second + 5*time.Millisecond)
	after := wantIDs(t, request(t, nc, "leaf.snowflake.x", "", nil), 1, false)[0]
	if after <= before {
		t.Fatalf("snowflake ID after recovery %d is not above %d", after, before)
	}
}

func TestProtocolDecode(t *testing.T) {
	d := startDispenser(t, func(c *testConfig) {
		c.WorkerRegistry = "static"
		c.WorkerID = 3
	})
	nc := d.connect(t)
	before := time.Now().UnixMilli()
	id := wantIDs(t, request(t, nc, "leaf.snowflake.x", "", nil), 1, false)[0]
	reply := request(t, nc, "leaf.decode.snowflake", " "+strconv.FormatInt(id, 10)+"\n", nil)
	var got map[string]any
	if err := json.Unmarshal(reply.Data, &got); err != nil {
		t.Fatalf("decode reply %q: %v", reply.Data, err)
	}
	keys := []string{"id", "timestamp", "time", "worker_id", "sequence"}
	if len(got) != len(keys) {
		t.Fatalf("decode reply %s has keys %v, want %v", reply.Data, got, keys)
	}
	var dec wire.DecodedID
	if err := json.Unmarshal(reply.Data, &dec); err != nil {
		t.Fatal(err)
	}
	if dec.ID != strconv.FormatInt(id, 10) {
		t.Errorf("id = %q, want the string %d", dec.ID, id)
	}
	if dec.WorkerID != 3 {
		t.Errorf("worker_id = %d, want 3", dec.WorkerID)
	}
	if dec.Timestamp < before-1000 || dec.Timestamp > time.Now().UnixMilli()+1500 {
		t.Errorf("timestamp = %d, want about now (%d) in Unix ms", dec.Timestamp, before)
	}
	wantTime := time.UnixMilli(dec.Timestamp).UTC().Format("2006-01-02T15:04:05.000Z")
	if dec.Time != wantTime {
		t.Errorf("time = %q, want %q", dec.Time, wantTime)
	}
	if dec.Sequence < 0 || dec.Sequence > 4095 {
		t.Errorf("sequence = %d, want 0..4095", dec.Sequence)
	}

	for _, bad := range []string{"", "0", "-1", "abc", "9223372036854775808", "1.5", "+7"} {
		t.Run("Bad"+bad, func(t *testing.T) {
			wantError(t, request(t, nc, "leaf.decode.snowflake", bad, nil), 400, "ID")
		})
	}
}

func TestProtocolDiscovery(t *testing.T) {
	d := startDispenser(t, nil)
	nc := d.connect(t)

	ping := request(t, nc, "$SRV.PING.leaf", "", nil)
	var p micro.Ping
	if err := json.Unmarshal(ping.Data, &p); err != nil || p.Name != "leaf" {
		t.Fatalf("$SRV.PING.leaf = %s (%v), want the service leaf", ping.Data, err)
	}

	infoMsg := request(t, nc, "$SRV.INFO.leaf", "", nil)
	var info micro.Info
	if err := json.Unmarshal(infoMsg.Data, &info); err != nil {
		t.Fatalf("$SRV.INFO.leaf = %s: %v", infoMsg.Data, err)
	}
	if info.Name != "leaf" || info.Metadata["max_batch"] != "10000" {
		t.Fatalf("info name %q, metadata %v; want leaf with max_batch 10000", info.Name, info.Metadata)
	}
	subjects := map[string]bool{}
	for _, e := range info.Endpoints {
		subjects[e.Subject] = true
		if e.QueueGroup != "leaf" {
			t.Errorf("endpoint %s queue group %q, want leaf", e.Subject, e.QueueGroup)
		}
	}
	for _, s := range []string{"leaf.segment.*", "leaf.snowflake.*", "leaf.decode.snowflake", "leaf.admin.tags.add", "leaf.admin.tags.list", "leaf.admin.tags.update"} {
		if !subjects[s] {
			t.Errorf("$SRV.INFO has no endpoint on %s (has %v)", s, subjects)
		}
	}

	request(t, nc, "leaf.segment."+dispenser.SampleTagName, "", nil)
	statsMsg := request(t, nc, "$SRV.STATS.leaf", "", nil)
	var stats micro.Stats
	if err := json.Unmarshal(statsMsg.Data, &stats); err != nil {
		t.Fatalf("$SRV.STATS.leaf = %s: %v", statsMsg.Data, err)
	}
	for _, e := range stats.Endpoints {
		if e.Subject == "leaf.segment.*" && e.NumRequests < 1 {
			t.Errorf("segment endpoint stats count %d requests, want >= 1", e.NumRequests)
		}
		if e.Subject == "leaf.snowflake.*" && !strings.Contains(string(e.Data), "refused") {
			t.Errorf("snowflake endpoint stats data %s does not show refused requests", e.Data)
		}
	}

	// The ready line tells a newcomer how to ask for an ID.
	want := fmt.Sprintf(`nats --server %s req leaf.segment.leaf-segment-test ""`, d.ClientURL())
	if out := d.stdout.String(); !strings.Contains(out, want) {
		t.Errorf("start-up output %q does not contain %q", out, want)
	}
}

func TestProtocolManagingTags(t *testing.T) {
	d := startDispenser(t, nil)
	nc := d.connect(t)
	decodeTag := func(t *testing.T, reply *nats.Msg) map[string]any {
		t.Helper()
		if code := reply.Header.Get(micro.ErrorCodeHeader); code != "" {
			t.Fatalf("reply is error %s: %s", code, reply.Header.Get(micro.ErrorHeader))
		}
		var m map[string]any
		if err := json.Unmarshal(reply.Data, &m); err != nil {
			t.Fatalf("tag reply %q: %v", reply.Data, err)
		}
		for _, k := range []string{"tag", "max_id", "max_id_str", "step", "description", "update_time"} {
			if _, ok := m[k]; !ok {
				t.Fatalf("tag reply %s has no %q", reply.Data, k)
			}
		}
		if _, err := time.Parse(time.RFC3339, m["update_time"].(string)); err != nil {
			t.Fatalf("update_time %q is not RFC 3339: %v", m["update_time"], err)
		}
		return m
	}

	added := decodeTag(t, request(t, nc, "leaf.admin.tags.add", `{"tag":"orders","step":1000,"max_id":1,"description":"order IDs"}`, nil))
	if added["tag"] != "orders" || added["step"] != 1000.0 || added["max_id_str"] != "1" || added["description"] != "order IDs" {
		t.Fatalf("added tag = %v", added)
	}
	// A tag added a moment ago is served at once, starting at its max_id.
	ids := wantIDs(t, request(t, nc, "leaf.segment.orders", "3", nil), 3, false)
	if ids[0] != 1 {
		t.Fatalf("first IDs of a new tag = %v, want to start at 1", ids)
	}
	big := decodeTag(t, request(t, nc, "leaf.admin.tags.add", `{"tag":"big","step":10,"max_id":9007199254740993}`, nil))
	if big["max_id_str"] != "9007199254740993" {
		t.Fatalf("max_id_str = %v, want the exact 9007199254740993", big["max_id_str"])
	}
	defaulted := decodeTag(t, request(t, nc, "leaf.admin.tags.add", `{"tag":"plain","step":5}`, nil))
	if defaulted["max_id_str"] != "1" {
		t.Fatalf("max_id without max_id = %v, want 1", defaulted["max_id_str"])
	}

	for _, tt := range []struct {
		name, subject, body string
		code                int
	}{
		{"AddExists", "leaf.admin.tags.add", `{"tag":"orders","step":1000}`, 409},
		{"AddNoStep", "leaf.admin.tags.add", `{"tag":"x1"}`, 400},
		{"AddStepZero", "leaf.admin.tags.add", `{"tag":"x2","step":0}`, 400},
		{"AddStepTooBig", "leaf.admin.tags.add", `{"tag":"x3","step":10000001}`, 400},
		{"AddBadName", "leaf.admin.tags.add", `{"tag":"a\u0001b","step":10}`, 400},
		{"AddEmptyName", "leaf.admin.tags.add", `{"tag":"","step":10}`, 400},
		{"AddNotJSON", "leaf.admin.tags.add", `tag=orders`, 400},
		{"AddEmpty", "leaf.admin.tags.add", ``, 400},
		{"AddUnknownField", "leaf.admin.tags.add", `{"tag":"x4","stpe":10}`, 400},
		{"AddMaxIDZero", "leaf.admin.tags.add", `{"tag":"x5","step":10,"max_id":0}`, 400},
		{"UpdateMissing", "leaf.admin.tags.update", `{"tag":"nope","step":10}`, 404},
		{"UpdateNothing", "leaf.admin.tags.update", `{"tag":"orders"}`, 400},
		{"UpdateBadStep", "leaf.admin.tags.update", `{"tag":"orders","step":-1}`, 400},
	} {
		t.Run(tt.name, func(t *testing.T) {
			wantError(t, request(t, nc, tt.subject, tt.body, nil), tt.code)
		})
	}

	updated := decodeTag(t, request(t, nc, "leaf.admin.tags.update", `{"tag":"orders","step":5000}`, nil))
	if updated["step"] != 5000.0 || updated["description"] != "order IDs" {
		t.Fatalf("updated tag = %v, want step 5000 and the description kept", updated)
	}
	updated = decodeTag(t, request(t, nc, "leaf.admin.tags.update", `{"tag":"orders","description":"orders v2"}`, nil))
	if updated["step"] != 5000.0 || updated["description"] != "orders v2" {
		t.Fatalf("updated tag = %v, want step 5000 and the new description", updated)
	}

	list := request(t, nc, "leaf.admin.tags.list", "", nil)
	var tags []wire.TagInfo
	if err := json.Unmarshal(list.Data, &tags); err != nil {
		t.Fatalf("list = %q: %v", list.Data, err)
	}
	var names []string
	for _, tg := range tags {
		names = append(names, tg.Tag)
	}
	want := []string{"big", dispenser.SampleTagName, "orders", "plain"}
	if strings.Join(names, ",") != strings.Join(want, ",") {
		t.Fatalf("listed tags %v, want sorted %v", names, want)
	}
}

// TestClientTypedErrors checks client.Client against the same dispenser: IDs, batches,
// decode, admin, and errors as typed sentinels.
func TestClientTypedErrors(t *testing.T) {
	d := startDispenser(t, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, enc := range []wire.Encoding{wire.Text, wire.Binary} {
		c := d.client(t, client.WithEncoding(enc))
		id, err := c.Segment(ctx, dispenser.SampleTagName)
		if err != nil || id < 1 {
			t.Fatalf("%v Segment = %d, %v", enc, id, err)
		}
		ids, err := c.SnowflakeN(ctx, "x", 100)
		if err != nil || len(ids) != 100 {
			t.Fatalf("%v SnowflakeN = %d IDs, %v", enc, len(ids), err)
		}
		if _, err := c.Segment(ctx, "missing"); !errors.Is(err, wire.ErrNotFound) {
			t.Fatalf("%v Segment(missing) = %v, want ErrNotFound", enc, err)
		}
		if _, err := c.SegmentN(ctx, dispenser.SampleTagName, 10001); !errors.Is(err, wire.ErrBadRequest) {
			t.Fatalf("%v SegmentN(10001) = %v, want ErrBadRequest", enc, err)
		}
		if _, err := c.Segment(ctx, "bad tag"); err == nil {
			t.Fatalf("%v Segment(bad tag) succeeded", enc)
		}
	}
	c := d.client(t)
	step := int64(10)
	if _, err := c.AddTag(ctx, wire.AddTagRequest{Tag: dispenser.SampleTagName, Step: &step}); !errors.Is(err, wire.ErrConflict) {
		t.Fatalf("AddTag(existing) = %v, want ErrConflict", err)
	}
	if _, err := c.UpdateTag(ctx, wire.UpdateTagRequest{Tag: "missing", Step: &step}); !errors.Is(err, wire.ErrNotFound) {
		t.Fatalf("UpdateTag(missing) = %v, want ErrNotFound", err)
	}
	id, err := c.Snowflake(ctx, "x")
	if err != nil {
		t.Fatal(err)
	}
	dec, err := c.Decode(ctx, id)
	if err != nil || dec.ID != strconv.FormatInt(id, 10) {
		t.Fatalf("Decode(%d) = %+v, %v", id, dec, err)
	}
}
