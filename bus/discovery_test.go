package bus

import (
	"encoding/json"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/leafbus/leafbus/wire"
)

// TestDiscovery: the service answers the NATS service API on every scope, with micro's
// types: its endpoints in INFO, and in STATS the requests each endpoint handled, the
// errors it answered (the last one as micro words it, "code:description") and its data.
func TestDiscovery(t *testing.T) {
	_, nc, svc := startGuardedService(t)
	for _, subject := range []string{"leaf.segment.orders", "leaf.segment.orders", "leaf.segment.bad%tag", "leaf.snowflake.x"} {
		if _, err := nc.Request(subject, nil, 5*time.Second); err != nil {
			t.Fatalf("request %s: %v", subject, err)
		}
	}
	for _, scope := range []string{"", ".leaf", ".leaf." + svc.id} {
		var ping micro.Ping
		ask(t, nc, "$SRV.PING"+scope, &ping)
		if ping.Name != "leaf" || ping.ID != svc.id || ping.Type != micro.PingResponseType {
			t.Errorf("$SRV.PING%s = %+v, want leaf %s", scope, ping, svc.id)
		}
		var info micro.Info
		ask(t, nc, "$SRV.INFO"+scope, &info)
		var subjects []string
		for _, e := range info.Endpoints {
			subjects = append(subjects, e.Name+"="+e.Subject+"@"+e.QueueGroup)
		}
		want := "segment=leaf.segment.*@leaf snowflake=leaf.snowflake.*@leaf decode=leaf.decode.snowflake@leaf tags-add=leaf.admin.tags.add@leaf tags-list=leaf.admin.tags.list@leaf tags-update=leaf.admin.tags.update@leaf"
		if got := strings.Join(subjects, " "); got != want || info.Metadata["max_batch"] != "10000" || info.Type != micro.InfoResponseType {
			t.Errorf("$SRV.INFO%s endpoints %s, metadata %v; want %s and max_batch 10000", scope, got, info.Metadata, want)
		}
	}
	var stats micro.Stats
	ask(t, nc, "$SRV.STATS.leaf", &stats)
	byName := map[string]*micro.EndpointStats{}
	for _, e := range stats.Endpoints {
		byName[e.Name] = e
	}
	seg := byName["segment"]
	if seg == nil || seg.NumRequests != 3 || seg.NumErrors != 1 || !strings.HasPrefix(seg.LastError, "400:") || seg.ProcessingTime <= 0 || seg.AverageProcessingTime <= 0 {
		t.Fatalf("segment stats %+v, want 3 requests, 1 error (400:...) and processing times", seg)
	}
	var data map[string]any
	if err := json.Unmarshal(seg.Data, &data); err != nil || data["ids_issued"] != float64(2) {
		t.Errorf("segment stats data %s (%v), want ids_issued 2", seg.Data, err)
	}
	if sf := byName["snowflake"]; sf == nil || sf.NumRequests != 1 || sf.NumErrors != 0 || sf.LastError != "" {
		t.Errorf("snowflake stats %+v, want 1 request, no error", sf)
	}
	if stats.Started.IsZero() || time.Since(stats.Started) > time.Minute {
		t.Errorf("started %v, want the service's start", stats.Started)
	}
}

// TestDiscoveryMatchesMicro: the JSON of PING, INFO and STATS has the fields, in the
// order, that a nats.go/micro service of the same shape answers with, so tools that
// read micro services read the dispenser alike.
func TestDiscoveryMatchesMicro(t *testing.T) {
	ns, nc, _ := startGuardedService(t)
	refConn := ns.Connect(t)
	ref, err := micro.AddService(refConn, micro.Config{
		Name: "ref", Version: "1.0.0", QueueGroup: "ref", Metadata: map[string]string{"max_batch": "1"},
		StatsHandler: func(*micro.Endpoint) any { return map[string]int{"x": 1} },
	})
	if err != nil {
		t.Fatal(err)
	}
	defer ref.Stop()
	if err := ref.AddEndpoint("segment", micro.HandlerFunc(func(micro.Request) {}), micro.WithEndpointSubject("ref.segment.*")); err != nil {
		t.Fatal(err)
	}
	// micro subscribes without waiting for the server: a round trip on its connection
	// makes sure the server has every subscription before another connection asks.
	if err := refConn.Flush(); err != nil {
		t.Fatal(err)
	}
	for _, verb := range []string{"PING", "INFO", "STATS"} {
		var ours, theirs map[string]json.RawMessage
		ask(t, nc, "$SRV."+verb+".leaf", &ours)
		ask(t, nc, "$SRV."+verb+".ref", &theirs)
		if got, want := slices.Sorted(maps.Keys(ours)), slices.Sorted(maps.Keys(theirs)); !slices.Equal(got, want) {
			t.Errorf("$SRV.%s fields %v, micro's %v", verb, got, want)
		}
		if verb == "PING" {
			continue
		}
		var ourEPs, theirEPs []map[string]json.RawMessage
		if err := json.Unmarshal(ours["endpoints"], &ourEPs); err != nil || len(ourEPs) == 0 {
			t.Fatalf("$SRV.%s endpoints %s: %v", verb, ours["endpoints"], err)
		}
		if err := json.Unmarshal(theirs["endpoints"], &theirEPs); err != nil || len(theirEPs) != 1 {
			t.Fatalf("micro $SRV.%s endpoints %s: %v", verb, theirs["endpoints"], err)
		}
		if got, want := slices.Sorted(maps.Keys(ourEPs[0])), slices.Sorted(maps.Keys(theirEPs[0])); !slices.Equal(got, want) {
			t.Errorf("$SRV.%s endpoint fields %v, micro's %v", verb, got, want)
		}
	}
}

// TestDiscoveryRefusesForeignReplies: a control request whose reply subject a
// dispenser must not publish to gets no answer there.
func TestDiscoveryRefusesForeignReplies(t *testing.T) {
	ns, nc, _ := startGuardedService(t)
	witness := ns.Connect(t)
	leaked, err := witness.SubscribeSync("$KV.leaf_segments.orders")
	if err == nil {
		err = witness.Flush()
	}
	if err != nil {
		t.Fatal(err)
	}
	for _, verb := range []string{"PING", "INFO", "STATS"} {
		if err := nc.PublishRequest("$SRV."+verb+".leaf", "$KV.leaf_segments.orders", nil); err != nil {
			t.Fatal(err)
		}
	}
	// Each verb is its own subscription: once each has answered a request sent after the
	// foreign ones, it has handled those too.
	var ping micro.Ping
	var info micro.Info
	var stats micro.Stats
	ask(t, nc, "$SRV.PING.leaf", &ping)
	ask(t, nc, "$SRV.INFO.leaf", &info)
	ask(t, nc, "$SRV.STATS.leaf", &stats)
	if m, err := leaked.NextMsg(100 * time.Millisecond); err == nil {
		t.Fatalf("a $SRV answer reached %s: %s", m.Subject, m.Data)
	}
	// Dropped and counted (PROTOCOL.md "Reply subjects"), shown with every endpoint.
	var data struct {
		Refused uint64 `json:"refused_control_replies"`
	}
	ask(t, nc, "$SRV.STATS.leaf", &stats)
	if err := json.Unmarshal(stats.Endpoints[0].Data, &data); err != nil || data.Refused != 3 {
		t.Errorf("refused_control_replies = %d (%v) in %s, want 3", data.Refused, err, stats.Endpoints[0].Data)
	}
}

// ask requests subject and decodes the JSON answer into v.
func ask(tb testing.TB, nc *nats.Conn, subject string, v any) {
	tb.Helper()
	m, err := nc.Request(subject, nil, 5*time.Second)
	if err != nil {
		tb.Fatalf("%s: %v", subject, err)
	}
	if code := m.Header.Get(wire.ServiceErrorCodeHeader); code != "" {
		tb.Fatalf("%s: error %s %s", subject, code, m.Header.Get(wire.ServiceErrorHeader))
	}
	if err := json.Unmarshal(m.Data, v); err != nil {
		tb.Fatalf("%s answered %s: %v", subject, m.Data, err)
	}
}
