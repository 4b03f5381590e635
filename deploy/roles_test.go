package deploy

import (
	"bytes"
	"context"
	"encoding/json"
	"maps"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"

	"github.com/leafbus/leafbus/client"
	"github.com/leafbus/leafbus/deployment"
	"github.com/leafbus/leafbus/pools"
	"github.com/leafbus/leafbus/segment"
	"github.com/leafbus/leafbus/snowflake"
	"github.com/leafbus/leafbus/wire"
	"github.com/leafbus/leafbus/workerid"
)

// The names the dispenser uses with the default prefix (PROTOCOL.md), which the
// configuration spells out.
const (
	segmentsBucket = "leaf_segments"
	leasesBucket   = "leaf_leases"
	poolStream     = "LEAF_POOL"
	poolSpec       = "segment:orders:5:3" // a pool of 3 batches of 5 segment IDs of tag orders
)

// standIn is the dispenser's service as far as NATS can tell: a micro service named
// leaf in queue group leaf with the dispenser's endpoints, on the service user's
// connection. Every request it answers reports the reply subject it was handed.
type standIn struct {
	svc     micro.Service
	handled chan string
	next    atomic.Int64
}

func startStandIn(t *testing.T, c *roleConn) *standIn {
	t.Helper()
	s := &standIn{handled: make(chan string, 64)}
	s.next.Store(1000)
	svc, err := micro.AddService(c.Conn, micro.Config{
		Name:        "leaf",
		Version:     "1.0.0",
		Description: "stand-in for the dispenser's service",
		QueueGroup:  "leaf",
	})
	if err != nil {
		t.Fatalf("micro service as %s: %v", c.user, err)
	}
	t.Cleanup(func() { _ = svc.Stop() })
	ids := func(req micro.Request) { s.answer(req, strconv.FormatInt(s.next.Add(1), 10)) }
	for _, e := range []struct {
		name, subject string
		handler       micro.HandlerFunc
	}{
		{"segment", "leaf.segment.*", ids},
		{"snowflake", "leaf.snowflake.*", ids},
		{"decode", "leaf.decode.snowflake", func(req micro.Request) { s.answer(req, `{"id":"1","worker_id":0}`) }},
		{"tags-add", "leaf.admin.tags.add", func(req micro.Request) { s.answer(req, `{}`) }},
		{"tags-list", "leaf.admin.tags.list", func(req micro.Request) { s.answer(req, `[{"tag":"orders"}]`) }},
		{"tags-update", "leaf.admin.tags.update", func(req micro.Request) { s.answer(req, `{}`) }},
	} {
		if err := svc.AddEndpoint(e.name, e.handler, micro.WithEndpointSubject(e.subject)); err != nil {
			t.Fatalf("endpoint %s as %s: %v", e.subject, c.user, err)
		}
	}
	// The subscriptions are in once the server has answered a round trip; a refused one
	// would show as an asynchronous error by then.
	c.drain()
	if err := c.FlushTimeout(violationWait); err != nil {
		t.Fatalf("flush as %s: %v", c.user, err)
	}
	select {
	case err := <-c.errs:
		t.Fatalf("the service user may not register the service: %v", err)
	default:
	}
	s.svc = svc
	return s
}

func (s *standIn) answer(req micro.Request, body string) {
	reply := req.Reply()
	_ = req.Respond([]byte(body))
	s.handled <- reply
}

// expectHandled waits for n requests to have been answered and checks that each one's
// reply subject was one the server made up for a caller in another account.
func (s *standIn) expectHandled(t *testing.T, n int) {
	t.Helper()
	timer := time.NewTimer(violationWait)
	defer timer.Stop()
	for i := 0; i < n; i++ {
		select {
		case reply := <-s.handled:
			if !strings.HasPrefix(reply, "_R_.") {
				t.Errorf("the service was handed reply subject %q, want one under _R_.", reply)
			}
		case <-timer.C:
			t.Fatalf("the service answered %d of %d requests within %v", i, n, violationWait)
		}
	}
}

// counterSource hands out increasing IDs to the pool feeder.
type counterSource struct{ next atomic.Int64 }

func (c *counterSource) Fill(_ context.Context, _ string, dst []int64) error {
	for i := range dst {
		dst[i] = c.next.Add(1)
	}
	return nil
}

// TestRolesConfigHoldsNoPassword: every user's password is a reference to the
// environment variable NATS_<USER>_PASSWORD, so the shipped file cannot be started with
// a password anyone could read in the repository, and a server started without one of
// them refuses, naming the variable.
func TestRolesConfigHoldsNoPassword(t *testing.T) {
	data, err := os.ReadFile(rolesConf)
	if err != nil {
		t.Fatal(err)
	}
	userLine := regexp.MustCompile(`^\s*user:\s*(\S+)\s*$`)
	passwordLine := regexp.MustCompile(`^\s*password:\s*(.*?)\s*$`)
	users := map[string]string{} // user -> the password's value as written
	var user string
	for line := range strings.SplitSeq(string(data), "\n") {
		if m := userLine.FindStringSubmatch(line); m != nil {
			user = m[1]
		}
		if m := passwordLine.FindStringSubmatch(line); m != nil {
			users[user] = m[1]
		}
	}
	want := []string{"client-a", "client-b", "dispenser", "dispenser-service", "etl", "operator"}
	if got := slices.Sorted(maps.Keys(users)); !slices.Equal(got, want) {
		t.Errorf("%s has password lines for users %q, want %q", rolesConf, got, want)
	}
	for user, pw := range users {
		if v := "$" + passwordVar(user); pw != v {
			t.Errorf("user %s: password %q, want %s: passwords come from the environment, never from the file", user, pw, v)
		}
	}

	_, passwords := parseRolesConf(t)
	if len(passwords) != len(want) {
		t.Errorf("%s has %d users, want %d (%q)", rolesConf, len(passwords), len(want), want)
	}
	for user, pw := range passwords {
		if pw != os.Getenv(passwordVar(user)) {
			t.Errorf("user %s: password %q, want the value of %s", user, pw, passwordVar(user))
		}
	}

	missing := passwordVar("operator")
	os.Unsetenv(missing) // parseRolesConf's t.Setenv restores it at cleanup
	_, err = server.ProcessConfigFile(rolesConf)
	if err == nil || !strings.Contains(err.Error(), missing) {
		t.Errorf("%s without %s in the environment: %v, want an error naming the variable", rolesConf, missing, err)
	}
}

// passwordVar is the environment variable the roles file reads user's password from.
func passwordVar(user string) string {
	return "NATS_" + strings.ToUpper(strings.ReplaceAll(user, "-", "_")) + "_PASSWORD"
}

// TestRoles starts a nats-server from the shipped file and plays every role: first what
// each may do, then what each may not, and last the confused-deputy replies.
func TestRoles(t *testing.T) {
	rs := startRolesServer(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	logger := testLog(t)

	disp := rs.connect(t, "dispenser")
	js, err := jetstream.New(disp.Conn)
	if err != nil {
		t.Fatal(err)
	}
	svcConn := rs.connect(t, "dispenser-service")
	clientA := rs.connect(t, "client-a", nats.CustomInboxPrefix("_INBOX_client-a"))
	clientB := rs.connect(t, "client-b", nats.CustomInboxPrefix("_INBOX_client-b"))
	etl := rs.connect(t, "etl")
	op := rs.connect(t, "operator")
	spec, err := pools.ParseSpec(poolSpec)
	if err != nil {
		t.Fatal(err)
	}

	// The dispenser's JetStream side, by the project's own code.
	var leaseKey string
	if !t.Run("dispenser/kv", func(t *testing.T) {
		now := time.Now().UnixMilli()
		forever, err := workerid.OpenForever(ctx, js, workerid.ForeverBucket("leaf"), 1)
		if err != nil {
			t.Fatalf("open forever bucket: %v", err)
		}
		if err := forever.Put(ctx, "node-1", workerid.Record{WorkerID: 0, Timestamp: now}); err != nil {
			t.Fatalf("heartbeat: %v", err)
		}
		if r, err := forever.Get(ctx, "node-1"); err != nil || r.Timestamp != now {
			t.Fatalf("read heartbeat: %+v, %v", r, err)
		}

		regCfg := workerid.DefaultKVRegistryConfig()
		regCfg.NodeID, regCfg.Logger = "node-1", logger
		reg, err := workerid.OpenKVRegistry(ctx, js, regCfg)
		if err != nil {
			t.Fatalf("open the worker-ID registry: %v", err)
		}
		released, err := reg.Acquire(ctx)
		if err != nil {
			t.Fatalf("lease a worker ID: %v", err)
		}
		if err := released.Renew(ctx, now); err != nil {
			t.Fatalf("renew the lease: %v", err)
		}
		if err := released.Release(ctx, now); err != nil {
			t.Fatalf("release the lease: %v", err)
		}
		held, err := reg.Acquire(ctx) // kept, for the operator to read and nobody to delete
		if err != nil {
			t.Fatalf("lease a worker ID again: %v", err)
		}
		leaseKey = strconv.FormatInt(held.WorkerID(), 10)

		store, err := segment.OpenKVStore(ctx, js, segmentsBucket, 1)
		if err != nil {
			t.Fatalf("open the segments bucket: %v", err)
		}
		if _, err := store.AddTag(ctx, segment.Tag{Name: "orders", Step: 1000, Description: "order IDs"}); err != nil {
			t.Fatalf("add tag: %v", err)
		}
		if _, err := store.Take(ctx, "orders", 1000); err != nil {
			t.Fatalf("take a segment: %v", err)
		}
		tags, err := store.Tags(ctx) // a watcher: an ordered consumer on the bucket
		if err != nil || len(tags) != 1 || tags[0].Name != "orders" {
			t.Fatalf("list tags: %+v, %v", tags, err)
		}

		// The monotonic-tag buckets (PROTOCOL.md): create, write, read, list.
		for _, bucket := range []string{"leaf_tagopts", "leaf_leaders"} {
			kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: bucket})
			if err != nil {
				t.Fatalf("create %s: %v", bucket, err)
			}
			if _, err := kv.Put(ctx, "orders", []byte(`{"monotonic":true}`)); err != nil {
				t.Fatalf("put into %s: %v", bucket, err)
			}
			if _, err := kv.Get(ctx, "orders"); err != nil {
				t.Fatalf("get from %s: %v", bucket, err)
			}
			if keys, err := kv.Keys(ctx); err != nil || len(keys) != 1 {
				t.Fatalf("keys of %s: %v, %v", bucket, keys, err)
			}
		}

		// The deployment record (PROTOCOL.md): the first start writes it, the next ones
		// read it.
		records, err := deployment.Open(ctx, js, "leaf", 1)
		if err != nil {
			t.Fatalf("open the deployment record's bucket: %v", err)
		}
		own := deployment.Own{
			Store:    wire.DeployedStore{Kind: "kv", Identity: store.Identity()},
			Registry: wire.DeployedRegistry{Kind: "kv", Identity: reg.Identity(), WorkerIDMax: 1023},
			Layout:   wire.DeployedLayout{Epoch: 1288834974657, TimeBits: 41, WorkerBits: 10, SequenceBits: 12},
		}
		for _, want := range []deployment.Outcome{deployment.Created, deployment.Checked} {
			if _, got, err := deployment.Check(ctx, records, own, "node-1", time.Now()); err != nil || got != want {
				t.Fatalf("deployment check: %v, %v; want %v", got, err, want)
			}
		}
		if err := deployment.SetMonotonic(ctx, records, "orders", true, "node-1", time.Now()); err != nil {
			t.Fatalf("mark a tag in the deployment record: %v", err)
		}
	}) {
		t.FailNow()
	}

	if !t.Run("dispenser/pool", func(t *testing.T) {
		stream, err := pools.NewStream(pools.StreamConfig{
			JetStream: js, Prefix: "leaf", Specs: []pools.Spec{spec}, Segments: &counterSource{}, Logger: logger,
		})
		if err != nil {
			t.Fatal(err)
		}
		runCtx, stop := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- stream.Run(runCtx) }()
		defer func() {
			stop()
			select {
			case <-done:
			case <-time.After(violationWait):
				t.Errorf("the pool feeder did not stop within %v", violationWait)
			}
		}()
		// Full means the stream, the consumer and Depth checked publishes all went through.
		deadline := time.Now().Add(30 * time.Second)
		for {
			if n := poolCount(ctx, js, "leaf.pool.segment.orders"); n == spec.Depth {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the pool feeder did not fill %d batches within 30s", spec.Depth)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}) {
		t.FailNow()
	}

	if !t.Run("dispenser/time", func(t *testing.T) {
		tr, err := workerid.NewTimeResponder(disp.Conn, "leaf", "node-1", snowflake.SystemClock(), logger)
		if err != nil {
			t.Fatal(err)
		}
		if err := tr.Start(); err != nil {
			t.Fatal(err)
		}
		defer tr.Stop()
		peer := rs.connect(t, "dispenser") // another dispenser starting up asks the time
		m, err := peer.Request(workerid.TimeSubject("leaf"), nil, violationWait)
		if err != nil {
			t.Fatalf("ask leaf.time: %v", err)
		}
		if m.Header.Get(wire.NodeIDHeader) != "node-1" {
			t.Fatalf("leaf.time answered by %q, want node-1", m.Header.Get(wire.NodeIDHeader))
		}
	}) {
		t.FailNow()
	}

	svc := startStandIn(t, svcConn)

	if !t.Run("client/ids", func(t *testing.T) {
		for _, c := range []*roleConn{clientA, clientB} {
			for _, subject := range []string{"leaf.segment.orders", "leaf.snowflake.orders", "leaf.decode.snowflake"} {
				m, err := c.Request(subject, []byte("1"), violationWait)
				if err != nil {
					t.Fatalf("%s: request %s: %v", c.user, subject, err)
				}
				if len(m.Data) == 0 {
					t.Fatalf("%s: empty reply on %s", c.user, subject)
				}
				svc.expectHandled(t, 1)
			}
		}
	}) {
		t.FailNow()
	}

	if !t.Run("etl/fetch", func(t *testing.T) {
		ejs, err := jetstream.New(etl.Conn)
		if err != nil {
			t.Fatal(err)
		}
		cons, err := client.NewConsumer(ctx, ejs, "leaf", spec.Kind, spec.Tag)
		if err != nil {
			t.Fatalf("look up the pool consumer: %v", err)
		}
		// A pull answered by several messages needs the export's response type stream:
		// a single-response export lets the first through and drops the rest.
		raw, err := ejs.Consumer(ctx, poolStream, wire.PoolConsumer(spec.Kind, spec.Tag))
		if err != nil {
			t.Fatal(err)
		}
		batch, err := raw.Fetch(2, jetstream.FetchMaxWait(violationWait))
		if err != nil {
			t.Fatal(err)
		}
		got := 0
		for m := range batch.Messages() {
			got++
			if err := m.Nak(); err != nil { // back to the pool, for Next below
				t.Fatal(err)
			}
		}
		if got != 2 {
			t.Fatalf("a pull for 2 batches got %d (%v)", got, batch.Error())
		}

		ids, err := cons.Next(ctx) // the protocol's way: one batch, then a confirmed ack
		if err != nil {
			t.Fatalf("take a batch: %v", err)
		}
		if len(ids) != spec.Size {
			t.Fatalf("batch of %d IDs, want %d", len(ids), spec.Size)
		}
		if n := poolCount(ctx, js, "leaf.pool.segment.orders"); n != spec.Depth-1 {
			t.Fatalf("%d batches left after one was taken and acked, want %d", n, spec.Depth-1)
		}
	}) {
		t.FailNow()
	}

	if !t.Run("operator", func(t *testing.T) {
		m, err := op.Request("leaf.admin.tags.list", nil, violationWait)
		if err != nil || !bytes.Contains(m.Data, []byte("orders")) {
			t.Fatalf("leaf.admin.tags.list: %v", err)
		}
		svc.expectHandled(t, 1)

		// IDs and decoding, to check that the deployment serves (dispenser decode,
		// bench) without an application's password.
		for _, subject := range []string{"leaf.segment.orders", "leaf.snowflake.orders", "leaf.decode.snowflake"} {
			if _, err := op.Request(subject, []byte("1"), violationWait); err != nil {
				t.Fatalf("operator: request %s: %v", subject, err)
			}
			svc.expectHandled(t, 1)
		}

		m, err = op.Request("$SRV.PING.leaf", nil, violationWait)
		if err != nil {
			t.Fatalf("$SRV.PING.leaf: %v", err)
		}
		var ping micro.Ping
		if err := json.Unmarshal(m.Data, &ping); err != nil || ping.Name != "leaf" {
			t.Fatalf("$SRV.PING.leaf answered %q (%v)", m.Data, err)
		}

		ojs, err := jetstream.New(op.Conn)
		if err != nil {
			t.Fatal(err)
		}
		for bucket, key := range map[string]string{segmentsBucket: "orders", leasesBucket: leaseKey, "leaf_forever": "node-1", "leaf_deployment": "deployment"} {
			kv, err := ojs.KeyValue(ctx, bucket)
			if err != nil {
				t.Fatalf("bucket %s: %v", bucket, err)
			}
			if _, err := kv.Status(ctx); err != nil {
				t.Fatalf("status of %s: %v", bucket, err)
			}
			if _, err := kv.Get(ctx, key); err != nil {
				t.Fatalf("get %s from %s: %v", key, bucket, err)
			}
		}
		st, err := ojs.Stream(ctx, poolStream)
		if err != nil {
			t.Fatalf("pool stream info: %v", err)
		}
		if _, err := st.Consumer(ctx, wire.PoolConsumer(spec.Kind, spec.Tag)); err != nil {
			t.Fatalf("pool consumer info: %v", err)
		}
	}) {
		t.FailNow()
	}

	before := rs.snapshot(ctx, t, js, leaseKey)

	// What each role may not do. Every refusal is the server's, reported to the caller.
	t.Run("client/refused", func(t *testing.T) {
		cjs, err := jetstream.New(clientA.Conn)
		if err != nil {
			t.Fatal(err)
		}
		clientA.refusedRequest(t, "leaf.admin.tags.list")
		clientA.refusedRequest(t, "leaf.admin.tags.add")
		clientA.refusedRequest(t, "$SRV.PING.leaf")
		clientA.refusedPublish(t, "$KV.leaf_segments.orders", []byte(`{"max_id":1}`))
		clientA.refusedPublish(t, "$KV.leaf_leases."+leaseKey, nil)
		clientA.refusedCall(t, "$JS.API.STREAM.DELETE.KV_leaf_leases", func(ctx context.Context) error {
			return cjs.DeleteKeyValue(ctx, leasesBucket)
		})
		clientA.refusedRequest(t, "$JS.API.STREAM.PURGE.KV_leaf_leases")
		clientA.refusedRequest(t, "$JS.API.STREAM.DELETE.KV_leaf_segments")
		clientA.refusedPublish(t, "leaf.pool.segment.orders", []byte("1\n2\n3"))
		clientA.refusedPublish(t, "_INBOX_client-b.x", []byte("1"))
		clientA.refusedPublish(t, "leaf.time", nil)
		// Impersonating a dispenser, or reading what others get.
		clientA.refusedSubscribe(t, "leaf.segment.*", "leaf")
		clientA.refusedSubscribe(t, "leaf.segment.orders", "")
		clientA.refusedSubscribe(t, "leaf.>", "")
		clientA.refusedSubscribe(t, ">", "")
		clientA.refusedSubscribe(t, "_INBOX.>", "")
		clientA.refusedSubscribe(t, "_INBOX_client-b.>", "")
		clientB.refusedSubscribe(t, "_INBOX_client-a.>", "")
	})

	t.Run("etl/refused", func(t *testing.T) {
		ejs, err := jetstream.New(etl.Conn)
		if err != nil {
			t.Fatal(err)
		}
		etl.refusedPublish(t, "leaf.pool.segment.orders", []byte("1\n2\n3\n4\n5"))
		etl.refusedCall(t, "leaf.pool.segment.orders", func(ctx context.Context) error {
			_, err := ejs.Publish(ctx, "leaf.pool.segment.orders", []byte("1\n2\n3\n4\n5"))
			return err
		})
		etl.refusedPublish(t, "$KV.leaf_segments.orders", []byte(`{"max_id":1}`))
		etl.refusedPublish(t, "$KV.leaf_leases."+leaseKey, nil)
		etl.refusedRequest(t, "$JS.API.STREAM.PURGE.LEAF_POOL")
		etl.refusedRequest(t, "$JS.API.STREAM.DELETE.LEAF_POOL")
		etl.refusedRequest(t, "$JS.API.STREAM.MSG.DELETE.LEAF_POOL")
		etl.refusedRequest(t, "$JS.API.CONSUMER.DELETE.LEAF_POOL.segment_orders")
		etl.refusedRequest(t, "$JS.API.CONSUMER.CREATE.LEAF_POOL.mine.leaf.pool.>")
		etl.refusedRequest(t, "$JS.API.CONSUMER.MSG.NEXT.KV_leaf_segments.any")
		etl.refusedRequest(t, "$JS.API.STREAM.PURGE.KV_leaf_leases")
		etl.refusedRequest(t, "leaf.admin.tags.list")
		etl.refusedRequest(t, "leaf.segment.orders")
		etl.refusedSubscribe(t, "leaf.pool.>", "")
		etl.refusedSubscribe(t, ">", "")
	})

	t.Run("operator/refused", func(t *testing.T) {
		ojs, err := jetstream.New(op.Conn)
		if err != nil {
			t.Fatal(err)
		}
		kv, err := ojs.KeyValue(ctx, segmentsBucket)
		if err != nil {
			t.Fatal(err)
		}
		leases, err := ojs.KeyValue(ctx, leasesBucket)
		if err != nil {
			t.Fatal(err)
		}
		op.refusedCall(t, "$KV.leaf_segments.orders", func(ctx context.Context) error {
			_, err := kv.Put(ctx, "orders", []byte(`{"max_id":1,"step":1}`))
			return err
		})
		op.refusedCall(t, "$KV.leaf_leases."+leaseKey, func(ctx context.Context) error {
			return leases.Delete(ctx, leaseKey)
		})
		op.refusedCall(t, "$KV.leaf_leases."+leaseKey, func(ctx context.Context) error {
			return leases.Purge(ctx, leaseKey)
		})
		st, err := ojs.Stream(ctx, "KV_"+leasesBucket)
		if err != nil {
			t.Fatal(err)
		}
		op.refusedCall(t, "$JS.API.STREAM.PURGE.KV_leaf_leases", func(ctx context.Context) error {
			return st.Purge(ctx)
		})
		op.refusedCall(t, "$JS.API.STREAM.MSG.DELETE.KV_leaf_leases", func(ctx context.Context) error {
			return st.DeleteMsg(ctx, 1)
		})
		op.refusedCall(t, "$JS.API.STREAM.DELETE.KV_leaf_segments", func(ctx context.Context) error {
			return ojs.DeleteKeyValue(ctx, segmentsBucket)
		})
		op.refusedCall(t, "$JS.API.STREAM.DELETE.LEAF_POOL", func(ctx context.Context) error {
			return ojs.DeleteStream(ctx, poolStream)
		})
		op.refusedRequest(t, "$JS.API.STREAM.UPDATE.KV_leaf_leases")
		op.refusedRequest(t, "$JS.API.STREAM.CREATE.KV_leaf_segments")
		op.refusedRequest(t, "$JS.API.CONSUMER.MSG.NEXT.LEAF_POOL.segment_orders")
		op.refusedSubscribe(t, "leaf.admin.>", "leaf")
		op.refusedSubscribe(t, "leaf.segment.*", "leaf")
		op.refusedSubscribe(t, ">", "")
	})

	t.Run("dispenser/refused", func(t *testing.T) {
		// The JetStream user writes its buckets, but never deletes or purges a stream,
		// and is no service: a leaked dispenser password cannot answer requests.
		disp.refusedRequest(t, "$JS.API.STREAM.DELETE.KV_leaf_segments")
		disp.refusedRequest(t, "$JS.API.STREAM.PURGE.KV_leaf_leases")
		disp.refusedRequest(t, "$JS.API.STREAM.DELETE.LEAF_POOL")
		disp.refusedRequest(t, "$JS.API.STREAM.CREATE.OTHER")
		disp.refusedRequest(t, "leaf.segment.orders")
		disp.refusedSubscribe(t, "leaf.segment.*", "leaf")
		disp.refusedSubscribe(t, ">", "")

		// The service user writes replies (_R_.>) and nothing else.
		for _, subject := range []string{
			"$KV.leaf_segments.orders", "$JS.API.STREAM.PURGE.KV_leaf_leases", "$JS.API.STREAM.DELETE.KV_leaf_segments",
			"$SYS.REQ.SERVER.PING", "$O.leaf.x", "$SRV.PING", "leaf.pool.segment.orders", "leaf.segment.orders",
			"leaf.time", "_INBOX.x",
		} {
			svcConn.refusedPublish(t, subject, []byte("1"))
		}
		// Its endpoints only in queue group leaf.
		svcConn.refusedSubscribe(t, "leaf.segment.*", "")
		svcConn.refusedSubscribe(t, "leaf.segment.*", "other")
		svcConn.refusedSubscribe(t, "_INBOX.>", "")
	})

	if t.Failed() {
		t.FailNow()
	}
	rs.snapshot(ctx, t, js, leaseKey).same(t, before, "after the refused actions")

	// The confused deputy: requests the callers may send, with the reply subject aimed at
	// what they may not touch. The server maps each reply subject to _R_.<random> in the
	// exporting account (SERVICE for the service's subjects, LEAF for JetStream's) and
	// the answer back to the caller's own account, so nothing in LEAF moves.
	t.Run("deputy/client", func(t *testing.T) {
		base := rs.snapshot(ctx, t, js, leaseKey)
		total := rs.waitAPIIdle(t)
		targets := []string{
			"$KV.leaf_segments.orders",
			"$JS.API.STREAM.PURGE.KV_leaf_leases",
			"$JS.API.STREAM.DELETE.KV_leaf_segments",
			"leaf.pool.segment.orders",
		}
		clientA.drain()
		for _, reply := range targets {
			if err := clientA.PublishRequest("leaf.segment.orders", reply, []byte("1")); err != nil {
				t.Fatal(err)
			}
		}
		svc.expectHandled(t, len(targets)) // each answered, to _R_.<random>
		// Once the server answers a round trip, it has routed every reply sent before.
		if err := svcConn.FlushTimeout(violationWait); err != nil {
			t.Fatal(err)
		}
		if got := rs.waitAPIIdle(t); got != total {
			t.Errorf("the JetStream API handled %d requests while only the deputy replies went out", got-total)
		}
		rs.unchangedSince(ctx, t, js, base, leaseKey, "after the client's deputy requests")
	})

	t.Run("deputy/etl", func(t *testing.T) {
		// A pull request's reply subject is where JetStream sends the batch or, when
		// there is none, a status (404 No Messages). Within one account both go where
		// the reply says: a status is stored into a KV key or executed as a JetStream
		// API request (a purge). Across accounts the server checks that the puller's
		// own account has interest in the reply subject, and drops the pull if not.
		base := rs.snapshot(ctx, t, js, leaseKey)
		total := rs.waitAPIIdle(t)
		name := wire.PoolConsumer(spec.Kind, spec.Tag)
		next := "$JS.API.CONSUMER.MSG.NEXT.LEAF_POOL." + name
		pull := []byte(`{"batch":1,"no_wait":true}`)
		for _, reply := range []string{
			"$KV.leaf_segments.orders", "leaf.pool.segment.orders",
			"$JS.API.STREAM.PURGE.KV_leaf_leases", "$JS.API.STREAM.DELETE.KV_leaf_segments",
		} {
			if err := etl.PublishRequest(next, reply, pull); err != nil {
				t.Fatal(err)
			}
		}
		// Pull requests are taken in order: once this one is answered (a batch or a
		// 404), the ones before it were served or dropped.
		m, err := etl.Request(next, pull, violationWait)
		if err != nil {
			t.Fatalf("pull after the deputy pulls: %v", err)
		}
		if m.Reply != "" { // a batch: give it back, it is not this test's
			if err := m.Nak(); err != nil {
				t.Fatal(err)
			}
		}
		cons, err := js.Consumer(ctx, poolStream, name)
		if err != nil {
			t.Fatal(err)
		}
		info := cons.CachedInfo() // as js.Consumer read it, after the pulls
		if info.NumWaiting != 0 {
			t.Errorf("%d pull requests still wait on %s, to be answered later", info.NumWaiting, name)
		}
		if got := rs.waitAPIIdle(t); got != total+1 { // the consumer info just now
			t.Errorf("the JetStream API handled %d requests, want 1 (the consumer info)", got-total)
		}
		rs.unchangedSince(ctx, t, js, base, leaseKey, "after the ETL job's deputy pulls")
	})

	t.Run("deputy/operator", func(t *testing.T) {
		base := rs.snapshot(ctx, t, js, leaseKey)
		total := rs.waitAPIIdle(t)
		op.drain()
		if err := op.PublishRequest("leaf.admin.tags.list", "$JS.API.STREAM.DELETE.KV_leaf_segments", nil); err != nil {
			t.Fatal(err)
		}
		if err := op.PublishRequest("$JS.API.DIRECT.GET.KV_leaf_segments.$KV.leaf_segments.orders", "$KV.leaf_segments.orders", nil); err != nil {
			t.Fatal(err)
		}
		if err := op.PublishRequest("$JS.API.STREAM.INFO.KV_leaf_leases", "$JS.API.STREAM.PURGE.KV_leaf_leases", nil); err != nil {
			t.Fatal(err)
		}
		svc.expectHandled(t, 1)
		if err := svcConn.FlushTimeout(violationWait); err != nil {
			t.Fatal(err)
		}
		// A direct get after the deputy one is answered after it.
		if _, err := op.Request("$JS.API.DIRECT.GET.KV_leaf_segments.$KV.leaf_segments.orders", nil, violationWait); err != nil {
			t.Fatalf("direct get after the deputy one: %v", err)
		}
		// The stream info request itself is one; a purge would be a second.
		if got := rs.waitAPIIdle(t); got != total+1 {
			t.Errorf("the JetStream API handled %d requests, want 1 (the stream info)", got-total)
		}
		rs.unchangedSince(ctx, t, js, base, leaseKey, "after the operator's deputy requests")
	})

	second := startStandIn(t, rs.connect(t, "dispenser-service"))
	instances := []string{svc.svc.Info().ID, second.svc.Info().ID}

	t.Run("operator/discovery", func(t *testing.T) {
		// Every dispenser answers a ping: one request, as many replies as dispensers.
		expectEveryInstance(t, op, "$SRV.PING.leaf", instances)
	})

	t.Run("dispenser/discovery", func(t *testing.T) {
		// A dispenser's JetStream connection asks its peers ($SRV.INFO.leaf: the peer
		// worker-ID range check and the status page's cluster view) through LEAF's
		// import from SERVICE, and every peer's answer arrives, with no refusal.
		disp.drain()
		expectEveryInstance(t, disp, "$SRV.INFO.leaf", instances)
		expectEveryInstance(t, disp, "$SRV.PING.leaf", instances)
		select {
		case err := <-disp.errs:
			t.Errorf("dispenser: asynchronous error while asking its peers: %v", err)
		default:
		}
	})
}

// expectEveryInstance publishes one request on subject ($SRV.PING.leaf or
// $SRV.INFO.leaf) from c and waits for an answer from every service instance of ids.
func expectEveryInstance(t *testing.T, c *roleConn, subject string, ids []string) {
	t.Helper()
	want := map[string]bool{}
	for _, id := range ids {
		want[id] = true
	}
	inbox := c.NewInbox()
	sub, err := c.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	if err := c.PublishRequest(subject, inbox, nil); err != nil {
		t.Fatal(err)
	}
	for len(want) > 0 {
		m, err := sub.NextMsg(violationWait)
		if err != nil {
			t.Fatalf("%s: %s: still waiting for %d dispensers after %v: %v", c.user, subject, len(want), violationWait, err)
		}
		var answer struct {
			ID   string `json:"id"`
			Name string `json:"name"`
		}
		if err := json.Unmarshal(m.Data, &answer); err != nil || answer.Name != "leaf" {
			t.Fatalf("%s: %s answered %q (%v)", c.user, subject, m.Data, err)
		}
		delete(want, answer.ID)
	}
}

// poolCount is how many batches the pool stream holds on subject (0 while the stream
// does not exist).
func poolCount(ctx context.Context, js jetstream.JetStream, subject string) int {
	st, err := js.Stream(ctx, poolStream)
	if err != nil {
		return 0
	}
	info, err := st.Info(ctx, jetstream.WithSubjectFilter(subject))
	if err != nil {
		return 0
	}
	return int(info.State.Subjects[subject])
}

// streamState is what a stream holds, as far as "nothing moved" is concerned.
type streamState struct{ msgs, first, last uint64 }

// state is what the refused actions and the deputy replies must leave alone: every
// stream of the LEAF account as the server sees it, the orders tag row and the held
// worker-ID lease.
type state struct {
	streams  map[string]streamState
	orders   []byte
	orderRev uint64
	lease    []byte
}

func (rs *rolesServer) snapshot(ctx context.Context, t *testing.T, js jetstream.JetStream, leaseKey string) state {
	t.Helper()
	s := state{streams: make(map[string]streamState)}
	info, err := rs.srv.Jsz(&server.JSzOptions{Account: "LEAF", Accounts: true, Streams: true})
	if err != nil {
		t.Fatalf("jsz: %v", err)
	}
	for _, acc := range info.AccountDetails {
		if acc.Name != "LEAF" {
			t.Errorf("account %s has JetStream assets; only LEAF should", acc.Name)
			continue
		}
		for _, sd := range acc.Streams {
			s.streams[sd.Name] = streamState{sd.State.Msgs, sd.State.FirstSeq, sd.State.LastSeq}
		}
	}
	for _, name := range []string{"KV_" + segmentsBucket, "KV_" + leasesBucket, poolStream} {
		if _, ok := s.streams[name]; !ok {
			t.Fatalf("stream %s is missing", name)
		}
	}
	kv, err := js.KeyValue(ctx, segmentsBucket)
	if err != nil {
		t.Fatal(err)
	}
	e, err := kv.Get(ctx, "orders")
	if err != nil {
		t.Fatalf("tag orders: %v", err)
	}
	s.orders, s.orderRev = e.Value(), e.Revision()
	leases, err := js.KeyValue(ctx, leasesBucket)
	if err != nil {
		t.Fatal(err)
	}
	if e, err = leases.Get(ctx, leaseKey); err != nil {
		t.Fatalf("lease %s: %v", leaseKey, err)
	}
	s.lease = e.Value()
	return s
}

func (s state) same(t *testing.T, was state, when string) {
	t.Helper()
	for name, w := range was.streams {
		if n, ok := s.streams[name]; !ok {
			t.Errorf("%s: stream %s is gone", when, name)
		} else if n != w {
			t.Errorf("%s: stream %s holds %d messages %d..%d, held %d messages %d..%d",
				when, name, n.msgs, n.first, n.last, w.msgs, w.first, w.last)
		}
	}
	for name := range s.streams {
		if _, ok := was.streams[name]; !ok {
			t.Errorf("%s: stream %s appeared", when, name)
		}
	}
	if !bytes.Equal(s.orders, was.orders) || s.orderRev != was.orderRev {
		t.Errorf("%s: tag orders is %q (revision %d), was %q (revision %d)", when, s.orders, s.orderRev, was.orders, was.orderRev)
	}
	if !bytes.Equal(s.lease, was.lease) {
		t.Errorf("%s: lease is %q, was %q", when, s.lease, was.lease)
	}
}

// unchangedSince checks that nothing moved in LEAF since s was taken. Writes are
// queued per stream, so a read could miss one still in the queue: for the two streams
// a deputy reply could write to, the check is itself a write, accepted only if the
// stream's last sequence is still the one in s. On segments it rewrites the orders row
// with its own value; on the pool it stores a marker outside every pool's subject. The
// state must then be s plus those two writes, and nothing else.
func (rs *rolesServer) unchangedSince(ctx context.Context, t *testing.T, js jetstream.JetStream, s state, leaseKey, when string) {
	t.Helper()
	segs, pool := "KV_"+segmentsBucket, poolStream
	if _, err := js.Publish(ctx, "$KV."+segmentsBucket+".orders", s.orders,
		jetstream.WithExpectLastSequence(s.streams[segs].last)); err != nil {
		t.Errorf("%s: something was written into %s (expected last sequence %d): %v", when, segs, s.streams[segs].last, err)
	}
	if _, err := js.Publish(ctx, "leaf.pool.check.unchanged", nil,
		jetstream.WithExpectLastSequence(s.streams[pool].last)); err != nil {
		t.Errorf("%s: something was written into %s (expected last sequence %d): %v", when, pool, s.streams[pool].last, err)
	}
	want := state{streams: maps.Clone(s.streams), orders: s.orders, lease: s.lease}
	ss := want.streams[segs]
	ss.last++
	if ss.msgs == 1 { // the orders row alone: the rewrite replaced it
		ss.first = ss.last
	}
	want.streams[segs] = ss
	want.orderRev = ss.last
	ps := want.streams[pool]
	ps.last++
	ps.msgs++
	want.streams[pool] = ps
	rs.snapshot(ctx, t, js, leaseKey).same(t, want, when)
}
