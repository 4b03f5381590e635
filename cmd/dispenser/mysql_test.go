package main

import (
	"bytes"
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/leafbus/leafbus/segment"
	"github.com/leafbus/leafbus/testenv"
	"github.com/leafbus/leafbus/wire"
)

// leafDB opens dsn as an operator or a Leaf node would (database/sql and the driver the
// segment package registers), creates leaf_alloc and inserts rows (name, step), max_id
// left to the column default 1. Closed at cleanup.
func leafDB(tb testing.TB, dsn string, rows map[string]int) *sql.DB {
	tb.Helper()
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		tb.Fatalf("sql.Open: %v", err)
	}
	tb.Cleanup(func() { db.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := db.ExecContext(ctx, segment.MySQLSchema); err != nil {
		tb.Fatalf("create leaf_alloc: %v", err)
	}
	for name, step := range rows {
		if _, err := db.ExecContext(ctx, "INSERT INTO leaf_alloc (biz_tag, step) VALUES (?, ?)", name, step); err != nil {
			tb.Fatalf("insert %s: %v", name, err)
		}
	}
	return db
}

// startMySQLDispenser starts a dispenser with the mysql segment store on dsn (its own
// connection pool), embedding NATS when natsURL is empty and joining it otherwise.
func startMySQLDispenser(tb testing.TB, dsn, natsURL, nodeID string) *testDispenser {
	tb.Helper()
	return startDispenser(tb, func(c *testConfig) {
		c.Pools = nil
		c.NodeID = nodeID
		c.NATS = natsURL
		c.SegmentStore = "mysql"
		c.MySQLDSN = dsn
		c.MySQLCreateTable = true
	})
}

// idSets records every ID served per tag and fails on the first one seen twice.
type idSets struct {
	mu   sync.Mutex
	seen map[string]map[int64]bool
}

func (s *idSets) add(tb testing.TB, tag string, ids []int64) {
	tb.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.seen == nil {
		s.seen = make(map[string]map[int64]bool)
	}
	if s.seen[tag] == nil {
		s.seen[tag] = make(map[int64]bool)
	}
	for i, id := range ids {
		if id < 1 || (i > 0 && id <= ids[i-1]) {
			tb.Errorf("%s: batch %v is not positive and strictly increasing", tag, ids)
			return
		}
		if s.seen[tag][id] {
			tb.Errorf("%s: ID %d handed out twice", tag, id)
			return
		}
		s.seen[tag][id] = true
	}
}

// checkBelowMaxID: every ID served lies below its row's max_id, i.e. inside a range
// the store granted.
func (s *idSets) checkBelowMaxID(tb testing.TB, db *sql.DB) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	s.mu.Lock()
	defer s.mu.Unlock()
	for tag, ids := range s.seen {
		var maxID int64
		if err := db.QueryRowContext(ctx, "SELECT max_id FROM leaf_alloc WHERE biz_tag = ?", tag).Scan(&maxID); err != nil {
			tb.Fatalf("max_id of %s: %v", tag, err)
		}
		for id := range ids {
			if id >= maxID {
				tb.Fatalf("%s: ID %d served, but max_id is only %d", tag, id, maxID)
			}
		}
	}
}

// TestMySQLThreeDispensers: three dispensers (one embedded NATS, each its own MySQL
// pool) serve 20 tags with small steps to concurrent clients while a Leaf node takes
// segments of the same rows by plain SQL: no ID is served twice, none falls in a range
// Leaf took, and every one lies below its row's max_id.
func TestMySQLThreeDispensers(t *testing.T) {
	dsn := testenv.MariaDB(t).NewDatabase(t)
	const tagCount = 20
	rows := map[string]int{}
	var tags []string
	for i := range tagCount {
		name := fmt.Sprintf("tag%02d", i)
		tags = append(tags, name)
		rows[name] = 50
	}
	db := leafDB(t, dsn, rows)
	first := startMySQLDispenser(t, dsn, "", "mysql-1")
	startMySQLDispenser(t, dsn, first.ClientURL(), "mysql-2")
	startMySQLDispenser(t, dsn, first.ClientURL(), "mysql-3")

	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var ids idSets
	type leafRange struct{ start, end int64 }
	var leafMu sync.Mutex
	leafRanges := map[string][]leafRange{}
	var wg sync.WaitGroup
	const clients, requests = 6, 400
	for c := range clients {
		client := first.client(t)
		rng := rand.New(rand.NewPCG(uint64(c), 11))
		wg.Go(func() {
			for range requests {
				tag := tags[rng.IntN(len(tags))]
				batch := make([]int64, 1+rng.IntN(30))
				if err := client.Fill(ctx, wire.Segment, tag, batch); err != nil {
					t.Errorf("client %d: %v", c, err)
					return
				}
				ids.add(t, tag, batch)
			}
		})
	}
	// Leaf beside them: its own transaction on the same rows.
	wg.Go(func() {
		for i := range 100 {
			tag := tags[i%len(tags)]
			var maxID, step int64
			err := func() error {
				tx, err := db.BeginTx(ctx, nil)
				if err != nil {
					return err
				}
				defer tx.Rollback()
				if _, err := tx.ExecContext(ctx, "UPDATE leaf_alloc SET max_id = max_id + step WHERE biz_tag = ?", tag); err != nil {
					return err
				}
				if err := tx.QueryRowContext(ctx, "SELECT max_id, step FROM leaf_alloc WHERE biz_tag = ?", tag).Scan(&maxID, &step); err != nil {
					return err
				}
				return tx.Commit()
			}()
			if err != nil {
				t.Errorf("Leaf take of %s: %v", tag, err)
				return
			}
			leafMu.Lock()
			leafRanges[tag] = append(leafRanges[tag], leafRange{maxID - step, maxID})
			leafMu.Unlock()
		}
	})
	wg.Wait()
	if t.Failed() {
		return
	}
	ids.checkBelowMaxID(t, db)
	total := 0
	for tag, set := range ids.seen {
		total += len(set)
		for _, r := range leafRanges[tag] {
			for id := r.start; id < r.end; id++ {
				if set[id] {
					t.Fatalf("%s: ID %d served by a dispenser lies in Leaf's range [%d, %d)", tag, id, r.start, r.end)
				}
			}
		}
	}
	t.Logf("%d IDs over %d tags from 3 dispensers, %d Leaf segments beside them", total, len(ids.seen), 100)
	// Each of the three served a share (so each took segments through its own pool).
	for id, n := range segmentRequestsPerInstance(t, first) {
		if n == 0 {
			t.Errorf("dispenser %s served no segment request", id)
		}
	}
}

// segmentRequestsPerInstance asks every service instance for its stats ($SRV.STATS.leaf
// with no queue group: each answers) and returns its segment request count by
// instance ID; it fails unless three answer.
func segmentRequestsPerInstance(t *testing.T, d *testDispenser) map[string]int {
	t.Helper()
	nc := d.connect(t)
	inbox := nats.NewInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		t.Fatal(err)
	}
	if err := nc.PublishRequest("$SRV.STATS.leaf", inbox, nil); err != nil {
		t.Fatal(err)
	}
	counts := map[string]int{}
	for len(counts) < 3 {
		msg, err := sub.NextMsg(5 * time.Second)
		if err != nil {
			t.Fatalf("$SRV.STATS.leaf: %d of 3 instances answered: %v", len(counts), err)
		}
		var stats micro.Stats
		if err := json.Unmarshal(msg.Data, &stats); err != nil {
			t.Fatalf("$SRV.STATS.leaf reply %s: %v", msg.Data, err)
		}
		counts[stats.ID] = 0
		for _, e := range stats.Endpoints {
			if e.Subject == "leaf.segment.*" {
				counts[stats.ID] += e.NumRequests
			}
		}
	}
	return counts
}

// TestMySQLRowInsertedBySQL: a row an operator inserts by hand is served at the first
// request, starting at its max_id, without waiting for the tag refresh.
func TestMySQLRowInsertedBySQL(t *testing.T) {
	dsn := testenv.MariaDB(t).NewDatabase(t)
	db := leafDB(t, dsn, nil)
	d := startMySQLDispenser(t, dsn, "", "mysql-1")
	cl := d.client(t) // exact IDs (d.client never hedges): a hedged copy would take the first range
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := cl.Segment(ctx, "late"); !errors.Is(err, wire.ErrNotFound) {
		t.Fatalf("Segment(late) before the insert err = %v, want 404", err)
	}
	if _, err := db.ExecContext(ctx, "INSERT INTO leaf_alloc (biz_tag, max_id, step, description) VALUES ('late', 5000, 10, 'by hand')"); err != nil {
		t.Fatal(err)
	}
	got, err := cl.SegmentN(ctx, "late", 3)
	if err != nil || len(got) != 3 || got[0] != 5000 || got[2] != 5002 {
		t.Fatalf("SegmentN(late, 3) = %v, %v; want 5000 5001 5002", got, err)
	}
}

// TestMySQLOutage stops a private MariaDB under load: tags with IDs left keep serving,
// tags whose buffers are spent answer 503, and after MariaDB starts again everything
// serves by itself; no ID is served twice over the whole run.
//
// Sizing: "rich" tags have a stored step of 1,000,000 and hand out a few hundred IDs,
// so their first segment never runs out; "dry" tags have step 5, so whatever their
// dynamic step grew to, they hold at most a few hundred IDs when MariaDB stops.
func TestMySQLOutage(t *testing.T) {
	t.Parallel() // its own servers and ports: it waits beside the others (make test's longest package)
	srv := testenv.StartMariaDB(t)
	dsn := srv.NewDatabase(t)
	rich := []string{"rich1", "rich2"}
	dry := []string{"dry1", "dry2", "dry3"}
	rows := map[string]int{}
	for _, tag := range rich {
		rows[tag] = 1_000_000
	}
	for _, tag := range dry {
		rows[tag] = 5
	}
	db := leafDB(t, dsn, rows)
	d := startMySQLDispenser(t, dsn, "", "mysql-1")
	client := d.client(t)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	var ids idSets
	take := func(tag string, n int) error {
		batch := make([]int64, n)
		if err := client.Fill(ctx, wire.Segment, tag, batch); err != nil {
			return err
		}
		ids.add(t, tag, batch)
		return nil
	}
	for _, tag := range append(rich, dry...) {
		for range 5 {
			if err := take(tag, 3); err != nil {
				t.Fatalf("%s before the outage: %v", tag, err)
			}
		}
	}

	// Load on the rich tags for the whole run: not one request may fail.
	stopLoad := make(chan struct{})
	var load sync.WaitGroup
	for _, tag := range rich {
		load.Go(func() {
			for {
				select {
				case <-stopLoad:
					return
				default:
				}
				if err := take(tag, 1); err != nil {
					t.Errorf("%s under load: %v", tag, err)
					return
				}
				time.Sleep(2 * time.Millisecond)
			}
		})
	}
	defer func() {
		select {
		case <-stopLoad:
		default:
			close(stopLoad)
		}
		load.Wait()
	}()

	srv.Stop()
	// Each dry tag serves what its buffers hold, then answers 503, and keeps doing so.
	const dryBound = 1000 // far more than 5 * 2^k summed over the few loads before the stop
	for _, tag := range dry {
		served := 0
		for {
			err := take(tag, 1)
			if err == nil {
				if served++; served > dryBound {
					t.Fatalf("%s served %d IDs with MariaDB down: more than its buffers can hold", tag, served)
				}
				continue
			}
			if !errors.Is(err, wire.ErrUnavailable) {
				t.Fatalf("%s with MariaDB down and buffers spent: %v, want 503", tag, err)
			}
			break
		}
		if err := take(tag, 1); !errors.Is(err, wire.ErrUnavailable) {
			t.Fatalf("%s asked again with MariaDB down: %v, want 503", tag, err)
		}
		t.Logf("%s served %d IDs from its buffers, then 503", tag, served)
	}
	// The rich tags kept serving meanwhile (the load goroutines fail the test if not);
	// one more request each, to be sure they still do.
	for _, tag := range rich {
		if err := take(tag, 10); err != nil {
			t.Fatalf("%s with MariaDB down: %v, want IDs from its buffer", tag, err)
		}
	}

	srv.Start()
	for _, tag := range dry {
		deadline := time.Now().Add(20 * time.Second)
		for {
			err := take(tag, 1)
			if err == nil {
				break
			}
			if !errors.Is(err, wire.ErrUnavailable) || time.Now().After(deadline) {
				t.Fatalf("%s after MariaDB came back: %v", tag, err)
			}
			time.Sleep(100 * time.Millisecond)
		}
		for range 20 {
			if err := take(tag, 7); err != nil {
				t.Fatalf("%s after recovery: %v", tag, err)
			}
		}
	}
	close(stopLoad)
	load.Wait()
	if t.Failed() {
		return
	}
	ids.checkBelowMaxID(t, db)
}

// TestSchemaCommand: what `dispenser schema` prints, fed to MariaDB statement by statement
// as `dispenser schema | mysql leaf` would, creates both tables, twice without error; a
// dispenser without --mysql-create-table then serves a row inserted by SQL, and the
// registry table takes a worker.
func TestSchemaCommand(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := runCommand(context.Background(), []string{"schema"}, &out, &errOut); code != 0 {
		t.Fatalf("dispenser schema: exit %d, stderr %s", code, errOut.String())
	}
	if code := runCommand(context.Background(), []string{"schema", "extra"}, io.Discard, &errOut); code != 2 {
		t.Fatalf("dispenser schema extra: exit %d, want 2", code)
	}
	dsn := testenv.MariaDB(t).NewDatabase(t)
	db, err := sql.Open("mysql", dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var statements []string
	for _, s := range strings.Split(out.String(), ";") {
		var lines []string
		for _, l := range strings.Split(s, "\n") {
			if !strings.HasPrefix(strings.TrimSpace(l), "--") {
				lines = append(lines, l)
			}
		}
		if s := strings.TrimSpace(strings.Join(lines, "\n")); s != "" {
			statements = append(statements, s)
		}
	}
	if len(statements) != 2 {
		t.Fatalf("schema has %d statements, want 2:\n%s", len(statements), out.String())
	}
	for range 2 {
		for _, s := range statements {
			if _, err := db.ExecContext(ctx, s); err != nil {
				t.Fatalf("exec %q: %v", s, err)
			}
		}
	}
	if _, err := db.ExecContext(ctx, "INSERT INTO leaf_alloc (biz_tag, step) VALUES ('orders', 100)"); err != nil {
		t.Fatal(err)
	}
	d := startDispenser(t, func(c *testConfig) {
		c.SegmentStore = "mysql"
		c.WorkerRegistry = "mysql"
		c.MySQLDSN = dsn
		c.Advertise = "127.0.0.1:4999"
	})
	cl := d.client(t) // exact IDs (d.client never hedges): a hedged copy would take the first ones
	if got, err := cl.SegmentN(ctx, "orders", 2); err != nil || got[0] != 1 || got[1] != 2 {
		t.Fatalf("SegmentN(orders, 2) = %v, %v; want 1 2", got, err)
	}
	if _, err := cl.Snowflake(ctx, "x"); err != nil {
		t.Fatalf("Snowflake: %v", err)
	}
	var rows int
	if err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM leaf_workerid_alloc WHERE ip_port = '127.0.0.1:4999'").Scan(&rows); err != nil || rows != 1 {
		t.Fatalf("leaf_workerid_alloc rows for the node = %d, %v; want 1", rows, err)
	}
}
