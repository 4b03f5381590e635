package segment

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"github.com/leafbus/leafbus/internal/testutil"
	"github.com/leafbus/leafbus/testenv"
)

// mysqlUnderTest is a MySQLStore that can open a peer: another MySQLStore, with its own
// connection pool, over the same database, as another dispenser would.
type mysqlUnderTest struct {
	*MySQLStore
	dsn string
}

func (m *mysqlUnderTest) peer(t *testing.T) Store {
	return openMySQL(t, m.dsn)
}

// openMySQL opens a store over dsn, creating leaf_alloc, closed at cleanup.
func openMySQL(tb testing.TB, dsn string) *mysqlUnderTest {
	tb.Helper()
	return openMySQLWith(tb, MySQLConfig{DSN: dsn})
}

// openMySQLWith is openMySQL with more of the configuration set by the test.
func openMySQLWith(tb testing.TB, cfg MySQLConfig) *mysqlUnderTest {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cfg.CreateTable, cfg.Logger = true, testutil.Logger(tb)
	dsn := cfg.DSN
	s, err := OpenMySQLStore(ctx, cfg)
	if err != nil {
		tb.Fatalf("OpenMySQLStore: %v", err)
	}
	tb.Cleanup(func() {
		if err := s.Close(); err != nil {
			tb.Errorf("Close: %v", err)
		}
	})
	return &mysqlUnderTest{MySQLStore: s, dsn: dsn}
}

func testCtx(tb testing.TB) context.Context { return testutil.Context(tb, 30*time.Second) }

func TestMySQLStore(t *testing.T) {
	srv := testenv.MariaDB(t)
	testStore(t, func(t *testing.T) Store { return openMySQL(t, srv.NewDatabase(t)) })
}

// protocolDDL is PROTOCOL.md's leaf_alloc DDL, copied by hand: MySQLSchema must create
// exactly this table.
const protocolDDL = "CREATE TABLE `leaf_alloc` (\n" +
	"  `biz_tag` varchar(128) NOT NULL DEFAULT '',\n" +
	"  `max_id` bigint(20) NOT NULL DEFAULT '1',\n" +
	"  `step` int(11) NOT NULL,\n" +
	"  `description` varchar(256) DEFAULT NULL,\n" +
	"  `update_time` timestamp NOT NULL DEFAULT CURRENT_TIMESTAMP ON UPDATE CURRENT_TIMESTAMP,\n" +
	"  PRIMARY KEY (`biz_tag`)\n" +
	") ENGINE=InnoDB;"

// TestMySQLSchema: the table MySQLSchema creates is PROTOCOL's, as the server itself
// renders both (SHOW CREATE TABLE), and running it again changes nothing.
func TestMySQLSchema(t *testing.T) {
	srv := testenv.MariaDB(t)
	ctx := testCtx(t)
	showCreate := func(db *sql.DB) string {
		t.Helper()
		var name, ddl string
		if err := db.QueryRowContext(ctx, "SHOW CREATE TABLE leaf_alloc").Scan(&name, &ddl); err != nil {
			t.Fatalf("SHOW CREATE TABLE: %v", err)
		}
		return ddl
	}
	want := testenv.OpenDB(t, srv.NewDatabase(t))
	if _, err := want.ExecContext(ctx, protocolDDL); err != nil {
		t.Fatalf("PROTOCOL's DDL: %v", err)
	}
	ours := openMySQL(t, srv.NewDatabase(t))
	if _, err := ours.db.ExecContext(ctx, MySQLSchema); err != nil {
		t.Fatalf("MySQLSchema a second time: %v", err)
	}
	got, wantDDL := showCreate(ours.db), showCreate(want)
	if got != wantDDL {
		t.Fatalf("MySQLSchema creates\n%s\nwant PROTOCOL's table\n%s", got, wantDDL)
	}
	for _, part := range []string{"`max_id` bigint(20) NOT NULL DEFAULT 1", "`step` int(11) NOT NULL", "PRIMARY KEY (`biz_tag`)", "ENGINE=InnoDB"} {
		if !strings.Contains(got, part) {
			t.Errorf("SHOW CREATE TABLE lacks %q:\n%s", part, got)
		}
	}
	if !strings.HasPrefix(MySQLSchema, "CREATE TABLE IF NOT EXISTS `leaf_alloc` (") {
		t.Errorf("MySQLSchema does not start with CREATE TABLE IF NOT EXISTS `leaf_alloc`:\n%s", MySQLSchema)
	}
}

func TestOpenMySQLStore(t *testing.T) {
	srv := testenv.MariaDB(t)
	ctx := testCtx(t)
	t.Run("ErrNoLeafAlloc", func(t *testing.T) {
		dsn := srv.NewDatabase(t)
		_, err := OpenMySQLStore(ctx, MySQLConfig{DSN: dsn})
		if !errors.Is(err, ErrNoLeafAlloc) || !strings.Contains(err.Error(), "dispenser schema") || !strings.Contains(err.Error(), "--mysql-create-table") {
			t.Fatalf("OpenMySQLStore(no table) err = %v, want ErrNoLeafAlloc naming dispenser schema and --mysql-create-table", err)
		}
	})
	t.Run("ErrNoLeafAlloc/WrongTable", func(t *testing.T) {
		dsn := srv.NewDatabase(t)
		if _, err := testenv.OpenDB(t, dsn).ExecContext(ctx, "CREATE TABLE leaf_alloc (biz_tag varchar(128) PRIMARY KEY, max_id bigint)"); err != nil {
			t.Fatal(err)
		}
		if _, err := OpenMySQLStore(ctx, MySQLConfig{DSN: dsn, CreateTable: true}); !errors.Is(err, ErrNoLeafAlloc) {
			t.Fatalf("OpenMySQLStore(table without step) err = %v, want ErrNoLeafAlloc", err)
		}
	})
	t.Run("Unreachable", func(t *testing.T) {
		c := mysql.NewConfig()
		c.User, c.Passwd, c.Net, c.Addr, c.DBName = "leaf", "s3cret-pw", "tcp", "127.0.0.1:1", "leafdb"
		_, err := OpenMySQLStore(ctx, MySQLConfig{DSN: c.FormatDSN(), QueryTimeout: time.Second})
		if err == nil {
			t.Fatal("OpenMySQLStore(nothing listening) succeeded")
		}
		msg := err.Error()
		if !strings.Contains(msg, "127.0.0.1:1") || !strings.Contains(msg, "leafdb") || strings.Contains(msg, "s3cret-pw") {
			t.Fatalf("OpenMySQLStore(nothing listening) err = %q, want host and database named, never the password", msg)
		}
	})
	for _, tc := range []struct {
		name string
		cfg  MySQLConfig
	}{
		{"EmptyDSN", MySQLConfig{}},
		{"BadDSN", MySQLConfig{DSN: "leaf:s3cret-pw@tcp(db:3306/leafdb"}},
		{"NoDatabase", MySQLConfig{DSN: "leaf:s3cret-pw@tcp(db:3306)/"}},
		{"NegativePool", MySQLConfig{DSN: "leaf:s3cret-pw@tcp(db:3306)/leafdb", MaxOpenConns: -1}},
		{"NegativeTimeout", MySQLConfig{DSN: "leaf:s3cret-pw@tcp(db:3306)/leafdb", QueryTimeout: -time.Second}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := OpenMySQLStore(ctx, tc.cfg)
			if err == nil || strings.Contains(err.Error(), "s3cret-pw") {
				t.Fatalf("OpenMySQLStore(%s) err = %v, want an error without the password", tc.name, err)
			}
		})
	}
	t.Run("DriverSettings", func(t *testing.T) {
		dc, timeout, err := mysqlDriverConfig(MySQLConfig{DSN: "u:p@tcp(db:3306)/leaf?interpolateParams=true&readTimeout=7s"})
		if err != nil {
			t.Fatal(err)
		}
		if !dc.ParseTime || dc.Loc != time.UTC || dc.Params["time_zone"] != "'+00:00'" || dc.InterpolateParams {
			t.Errorf("driver config %+v: want parseTime, UTC, time_zone +00:00, no interpolation", dc)
		}
		if timeout != DefaultMySQLQueryTimeout || dc.Timeout != timeout || dc.ReadTimeout != 7*time.Second || dc.WriteTimeout != 2*timeout {
			t.Errorf("timeouts: call %v, dial %v, read %v, write %v; want %v, %v, 7s (from the DSN), %v", timeout, dc.Timeout, dc.ReadTimeout, dc.WriteTimeout,
				DefaultMySQLQueryTimeout, DefaultMySQLQueryTimeout, 2*DefaultMySQLQueryTimeout)
		}
	})
}

// TestMySQLStoreRowBySQL: a row inserted by plain SQL, relying on the column defaults as
// Leaf's documentation does, is listed and served; a hand-broken step is refused
// without moving max_id.
func TestMySQLStoreRowBySQL(t *testing.T) {
	s := openMySQL(t, testenv.MariaDB(t).NewDatabase(t))
	db := testenv.OpenDB(t, s.dsn)
	ctx := testCtx(t)
	if _, err := db.ExecContext(ctx, "INSERT INTO leaf_alloc (biz_tag, step, description) VALUES ('leaf-segment-test', 2000, 'Test leaf Segment Mode Get Id')"); err != nil {
		t.Fatal(err)
	}
	list, err := s.Tags(ctx)
	if err != nil || len(list) != 1 || list[0].Name != "leaf-segment-test" || list[0].MaxID != 1 || list[0].Step != 2000 {
		t.Fatalf("Tags = %+v, %v; want the inserted row with max_id 1", list, err)
	}
	got, err := s.Take(ctx, "leaf-segment-test", 0)
	if err != nil || got.MaxID != 2001 || got.Description != "Test leaf Segment Mode Get Id" {
		t.Fatalf("Take = %+v, %v; want max_id 2001 and the description", got, err)
	}
	if age := time.Since(got.UpdateTime); age < -2*time.Second || age > 2*time.Second {
		t.Errorf("update_time %v is not about now (%v): the time zone handling is off", got.UpdateTime, time.Now().UTC())
	}

	for _, step := range []int{0, -5, MaxStoredStep + 1} {
		t.Run(fmt.Sprintf("StoredStep%d", step), func(t *testing.T) {
			name := fmt.Sprintf("broken%d", step+10)
			if _, err := db.ExecContext(ctx, "INSERT INTO leaf_alloc (biz_tag, max_id, step) VALUES (?, 100, ?)", name, step); err != nil {
				t.Fatal(err)
			}
			_, err := s.Take(ctx, name, 0)
			if err == nil || errors.Is(err, ErrInvalidTag) || errors.Is(err, ErrTagNotFound) {
				t.Fatalf("Take(row with step %d) err = %v, want a plain error", step, err)
			}
			if row, err := s.Tag(ctx, name); err != nil || row.MaxID != 100 {
				t.Fatalf("Tag after the refused Take = %+v, %v; want max_id 100 (rolled back)", row, err)
			}
		})
	}
}

// TestMySQLStoreNeverSplicesTag: a tag only ever reaches MySQL as a bound parameter.
// Names that would break a spliced statement are text like any other (Leaf's biz_tag
// holds them): each is its own row, matched exactly, and the table is untouched.
func TestMySQLStoreNeverSplicesTag(t *testing.T) {
	s := openMySQL(t, testenv.MariaDB(t).NewDatabase(t))
	ctx := testCtx(t)
	mustAdd(t, s, Tag{Name: "a", Step: 10})
	hostile := []string{
		"a'; DROP TABLE leaf_alloc; --",
		"a' OR '1'='1",
		`a\`,
		"a`",
		"x' UNION SELECT 1,2,3,4,5 -- ",
	}
	for _, name := range hostile {
		if _, err := s.Take(ctx, name, 0); !errors.Is(err, ErrTagNotFound) {
			t.Errorf("Take(%q) before it exists: err = %v, want ErrTagNotFound", name, err)
		}
	}
	for i, name := range hostile {
		mustAdd(t, s, Tag{Name: name, Step: int64(i + 2)})
		if got, err := s.Take(ctx, name, 0); err != nil || got.Name != name || got.MaxID != int64(i+3) {
			t.Errorf("Take(%q) = %+v, %v; want that row, max_id %d", name, got, err, i+3)
		}
	}
	if got, err := s.Tag(ctx, "a"); err != nil || got.MaxID != 1 {
		t.Fatalf("Tag(a) = %+v, %v; want the row untouched, max_id 1", got, err)
	}
	if list, err := s.Tags(ctx); err != nil || len(list) != len(hostile)+1 {
		t.Fatalf("Tags = %+v, %v; want %d rows", list, err, len(hostile)+1)
	}
	if _, err := s.Take(ctx, "a\x00", 0); !errors.Is(err, ErrInvalidTag) {
		t.Errorf("Take(a NUL) err = %v, want ErrInvalidTag", err)
	}
}

// TestMySQLStoreLeafCompat: a Leaf node (plain SQL, Leaf's own transaction) and two
// dispensers' stores take from the same rows at once; every range is granted once and
// together they leave no hole.
func TestMySQLStoreLeafCompat(t *testing.T) {
	s := openMySQL(t, testenv.MariaDB(t).NewDatabase(t))
	peer := s.peer(t)
	leaf := testenv.OpenDB(t, s.dsn)
	ctx := testCtx(t)
	tags := []string{"orders", "users"}
	for _, name := range tags {
		mustAdd(t, s, Tag{Name: name, Step: 13})
	}
	type grant struct{ start, end int64 }
	var mu sync.Mutex
	grants := map[string][]grant{}
	record := func(tag string, maxID, step int64) {
		mu.Lock()
		grants[tag] = append(grants[tag], grant{maxID - step, maxID})
		mu.Unlock()
	}
	// leafTake is Leaf's updateMaxIdAndGetLeafAlloc: UPDATE, then SELECT, one transaction.
	leafTake := func(tag string) error {
		tx, err := leaf.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer tx.Rollback()
		if _, err := tx.ExecContext(ctx, "UPDATE leaf_alloc SET max_id = max_id + step WHERE biz_tag = ?", tag); err != nil {
			return err
		}
		var maxID, step int64
		if err := tx.QueryRowContext(ctx, "SELECT max_id, step FROM leaf_alloc WHERE biz_tag = ?", tag).Scan(&maxID, &step); err != nil {
			return err
		}
		if err := tx.Commit(); err != nil {
			return err
		}
		record(tag, maxID, step)
		return nil
	}
	const rounds = 40
	var wg sync.WaitGroup
	for _, tag := range tags {
		for w := range 2 {
			wg.Go(func() {
				for range rounds {
					if err := leafTake(tag); err != nil {
						t.Errorf("Leaf take %s: %v", tag, err)
						return
					}
				}
			})
			wg.Go(func() {
				st := []Store{s, peer}[w]
				for i := range rounds {
					step := int64(0)
					if i%2 == 1 {
						step = int64(5 + w)
					}
					got, err := st.Take(ctx, tag, step)
					if err != nil {
						t.Errorf("Take %s: %v", tag, err)
						return
					}
					if step == 0 {
						step = got.Step
					}
					record(tag, got.MaxID, step)
				}
			})
		}
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	for _, tag := range tags {
		g := grants[tag]
		slices.SortFunc(g, func(a, b grant) int { return cmp.Compare(a.start, b.start) })
		next := int64(1)
		for _, r := range g {
			if r.start != next {
				t.Fatalf("%s: range [%d, %d) follows %d: overlap or hole between Leaf and the stores", tag, r.start, r.end, next)
			}
			next = r.end
		}
		if len(g) != 4*rounds {
			t.Fatalf("%s: %d ranges, want %d", tag, len(g), 4*rounds)
		}
	}
}

// TestMySQLStoreOverflow: MariaDB refuses max_id + step past BIGINT (error 1690) and the
// store reports ErrMaxIDOverflow with max_id untouched, by stored and by custom step.
func TestMySQLStoreOverflow(t *testing.T) {
	s := openMySQL(t, testenv.MariaDB(t).NewDatabase(t))
	ctx := testCtx(t)
	const top = 1<<63 - 1
	mustAdd(t, s, Tag{Name: "full", Step: MaxStoredStep, MaxID: top - 1})
	for _, step := range []int64{0, 2, MaxStoredStep} {
		_, err := s.Take(ctx, "full", step)
		if !errors.Is(err, ErrMaxIDOverflow) {
			t.Fatalf("Take(step %d) err = %v, want ErrMaxIDOverflow", step, err)
		}
		if mysqlErrNumber(err) != mysqlErrDataOutOfRange {
			t.Errorf("Take(step %d) err = %v, want it to carry MySQL error 1690", step, err)
		}
	}
	if got, err := s.Take(ctx, "full", 1); err != nil || got.MaxID != top {
		t.Fatalf("Take(step 1) = %+v, %v; want max_id %d", got, err, int64(top))
	}
	if _, err := s.Take(ctx, "full", 1); !errors.Is(err, ErrMaxIDOverflow) {
		t.Fatalf("Take at the top err = %v, want ErrMaxIDOverflow", err)
	}
}

// TestMySQLStoreServerDown: with the server stopped every call fails within the call
// timeout with an error the generator retries (neither ErrTagNotFound nor
// ErrInvalidTag), and the same store works again once the server is back.
func TestMySQLStoreServerDown(t *testing.T) {
	srv := testenv.StartMariaDB(t)
	ctx := testCtx(t)
	dsn := srv.NewDatabase(t)
	s, err := OpenMySQLStore(ctx, MySQLConfig{DSN: dsn, CreateTable: true, QueryTimeout: time.Second, Logger: testutil.Logger(t)})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	mustAdd(t, s, Tag{Name: "a", Step: 10})
	srv.Stop()
	began := time.Now()
	_, err = s.Take(ctx, "a", 0)
	if err == nil || errors.Is(err, ErrTagNotFound) || errors.Is(err, ErrInvalidTag) {
		t.Fatalf("Take with the server down err = %v, want a retryable store error", err)
	}
	if d := time.Since(began); d > 5*time.Second {
		t.Errorf("Take with the server down took %v", d)
	}
	srv.Start()
	var got Tag
	deadline := time.Now().Add(10 * time.Second)
	for {
		if got, err = s.Take(ctx, "a", 0); err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	// The Take that failed while the server was down committed nothing.
	if err != nil || got.MaxID != 11 {
		t.Fatalf("Take after restart = %+v, %v; want max_id 11", got, err)
	}

	// A server that hangs instead of refusing ends the call at QueryTimeout (1s), not
	// before (it would not be hanging) and not much after (the bound would not hold).
	// Freeze returns once every server thread is stopped; a bare SIGSTOP let a thread
	// still answer a Take at once on a loaded machine.
	thaw := srv.Freeze()
	began = time.Now()
	_, err = s.Take(ctx, "a", 0)
	if d := time.Since(began); err == nil || d < 900*time.Millisecond || d > 3*time.Second {
		t.Fatalf("Take on a hung server = %v after %v, want an error after about 1s", err, d)
	}
	thaw()
	deadline = time.Now().Add(10 * time.Second)
	for {
		if got, err = s.Take(ctx, "a", 0); err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	// Whether the hung Take committed is unknown to the caller (a gap at most); the
	// next range starts wherever the row is now.
	if err != nil || (got.MaxID != 21 && got.MaxID != 31) {
		t.Fatalf("Take after the thaw = %+v, %v; want max_id 21 or 31", got, err)
	}
}

// TestMySQLStoreUpdateUnchanged: an UPDATE that changes nothing reports 0 rows affected
// in MySQL; the store must still find the tag.
func TestMySQLStoreUpdateUnchanged(t *testing.T) {
	s := openMySQL(t, testenv.MariaDB(t).NewDatabase(t))
	ctx := testCtx(t)
	mustAdd(t, s, Tag{Name: "a", Step: 10, Description: "same"})
	step, descr := int64(10), "same"
	got, err := s.UpdateTag(ctx, TagUpdate{Name: "a", Step: &step, Description: &descr})
	if err != nil || got.Step != 10 || got.Description != "same" {
		t.Fatalf("UpdateTag(unchanged values) = %+v, %v; want the tag as it is", got, err)
	}
	empty := ""
	if got, err = s.UpdateTag(ctx, TagUpdate{Name: "a", Description: &empty}); err != nil || got.Description != "" {
		t.Fatalf("UpdateTag(empty description) = %+v, %v", got, err)
	}
}

// TestMySQLStoreRaiseMaxIDWaitsForTake: UpdateTag checks a new max_id against the row
// under its write lock, so a Leaf node's Take holding the row makes the update wait and
// then see the advanced max_id: a raise to a value the Take passed is refused, never
// written over it.
func TestMySQLStoreRaiseMaxIDWaitsForTake(t *testing.T) {
	// The update must outwait the test's lock, however slow the machine: a long timeout.
	s := openMySQLWith(t, MySQLConfig{DSN: testenv.MariaDB(t).NewDatabase(t), QueryTimeout: 30 * time.Second})
	db := testenv.OpenDB(t, s.dsn)
	ctx := testCtx(t)
	mustAdd(t, s, Tag{Name: "a", Step: 10})
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, "UPDATE leaf_alloc SET max_id = max_id + 1000 WHERE biz_tag = 'a'"); err != nil {
		t.Fatal(err)
	}
	errc := make(chan error, 1)
	go func() {
		target := int64(500)
		_, err := s.UpdateTag(ctx, TagUpdate{Name: "a", MaxID: &target})
		errc <- err
	}()
	// Commit once the update waits for the row lock. On a starved machine the wait may
	// not show within the bound; the update must be refused either way, since it reads
	// the row under its lock after the Take's commit.
	lockWait := false
	for deadline := time.Now().Add(10 * time.Second); !lockWait && time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		var n int
		err := db.QueryRowContext(ctx, "SELECT COUNT(*) FROM information_schema.INNODB_TRX WHERE trx_state = 'LOCK WAIT'").Scan(&n)
		lockWait = err == nil && n >= 1 // the server is shared with the package's other tests
	}
	if !lockWait {
		t.Log("the update's lock wait was not seen within 10s; committing anyway")
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errc:
		if !errors.Is(err, ErrInvalidTag) {
			t.Fatalf("UpdateTag(max_id 500) after a Take to 1001 = %v, want ErrInvalidTag", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("UpdateTag did not return within 10s of the Take's commit")
	}
	if got, err := s.Tag(ctx, "a"); err != nil || got.MaxID != 1001 {
		t.Fatalf("Tag = %+v, %v; want max_id 1001", got, err)
	}
}

// TestMySQLStoreRestoredBackupMarks: leaf_alloc is put back to an older copy under a
// running dispenser (rows restored by plain SQL). The tag is refused, with no ID
// repeated (another spelling that MySQL maps to the same row is refused throughout,
// ErrTagSpelling, and takes nothing); the other tag is served; the start-up check names it; UpdateTag raises max_id and serving resumes.
func TestMySQLStoreRestoredBackupMarks(t *testing.T) {
	s := openMySQL(t, testenv.MariaDB(t).NewDatabase(t))
	db := testenv.OpenDB(t, s.dsn)
	ctx := testCtx(t)
	mustAdd(t, s, Tag{Name: "orders", Step: 10}, Tag{Name: "users", Step: 10})
	marks := NewInmemMarks()
	g, _ := startMarked(t, marksConfig(t, s, marks))
	var seen idSet
	refuseOrders := func() {
		t.Helper()
		if err := g.Fill(ctx, "Orders", make([]int64, 1)); !errors.Is(err, ErrTagSpelling) {
			t.Fatalf("Fill(Orders) = %v, want ErrTagSpelling", err)
		}
	}
	for range 30 {
		seen.add(t, "orders", fill(t, g, "orders", 1))
		refuseOrders()
	}
	// The preload started in the third segment lands as the next segment, or, when it
	// comes back after the 30th fill spent the third (a slow MariaDB under load), as the
	// current one (install): either way no load is in flight and a fresh segment waits.
	b := g.bufferOf("orders")
	waitFor(t, "orders' preload", func() bool {
		b.mu.Lock()
		defer b.mu.Unlock()
		cur := b.cur.Load()
		return !b.loading && (b.next != nil || (cur != nil && !cur.spent()))
	})
	mark := marks.Mark("orders")
	if all := marks.All(); len(all) != 1 || mark <= seen.max("orders") {
		t.Fatalf("marks %v, want one, under the row's own name, above every ID served (up to %d)", all, seen.max("orders"))
	}

	if _, err := db.ExecContext(ctx, "UPDATE leaf_alloc SET max_id = 1 WHERE biz_tag = 'orders'"); err != nil {
		t.Fatal(err)
	}
	err := fillUntilRefused(t, g, &seen, "orders", 30)
	if !strings.Contains(err.Error(), fmt.Sprintf("below %d", mark)) {
		t.Errorf("refusal of orders = %v, want it to name the mark %d", err, mark)
	}
	refuseOrders()
	seen.add(t, "users", fill(t, g, "users", 4))
	// One refused Take, [1, 11); then reads only.
	err = CheckStoreAgainstMarks(ctx, s, marks)
	if want := fmt.Sprintf("orders (max_id 11, mark %d)", mark); !errors.Is(err, ErrStoreWentBack) || !strings.Contains(err.Error(), want) {
		t.Fatalf("CheckStoreAgainstMarks = %v, want ErrStoreWentBack naming %s", err, want)
	}

	low := mark - 1 // upward from 11, so allowed, but not enough
	if _, err := s.UpdateTag(ctx, TagUpdate{Name: "orders", MaxID: &low}); err != nil {
		t.Fatalf("UpdateTag(max_id %d): %v", low, err)
	}
	if err := CheckStoreAgainstMarks(ctx, s, marks); !errors.Is(err, ErrStoreWentBack) {
		t.Fatalf("CheckStoreAgainstMarks with max_id %d = %v, want ErrStoreWentBack", low, err)
	}
	if _, err := s.UpdateTag(ctx, TagUpdate{Name: "orders", MaxID: &mark}); err != nil {
		t.Fatalf("UpdateTag(max_id %d): %v", mark, err)
	}
	dst := make([]int64, 3)
	waitFor(t, "orders to serve again", func() bool { return g.Fill(ctx, "orders", dst) == nil })
	seen.add(t, "orders", dst)
	if dst[0] < mark {
		t.Fatalf("first IDs after the repair = %v, want them at or above the mark %d", dst, mark)
	}
	if err := CheckStoreAgainstMarks(ctx, s, marks); err != nil {
		t.Fatalf("CheckStoreAgainstMarks after the repair = %v", err)
	}
}

// BenchmarkMySQLTake is one Take round trip (BEGIN, UPDATE, SELECT, COMMIT) on MariaDB.
func BenchmarkMySQLTake(b *testing.B) {
	s := openMySQL(b, testenv.MariaDB(b).NewDatabase(b))
	mustAdd(b, s, Tag{Name: "bench", Step: 1000})
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := s.Take(ctx, "bench", 0); err != nil {
			b.Fatal(err)
		}
	}
}

// TestMySQLStoreMissingGrant: a store whose MySQL user lacks a privilege answers that
// operation with ErrStoreDenied (so ErrUnavailable: a 503, not a 500), naming the
// privilege, the table, the user and the GRANT that mends it; a grant given while the
// store runs takes effect at the next call. With Leaf's own grants (SELECT and UPDATE
// on leaf_alloc) it serves and only adding a tag is refused.
func TestMySQLStoreMissingGrant(t *testing.T) {
	srv := testenv.MariaDB(t)
	rootDSN := srv.NewDatabase(t)
	admin := openMySQL(t, rootDSN) // creates leaf_alloc
	ctx := testCtx(t)
	if _, err := admin.AddTag(ctx, Tag{Name: "orders", Step: 1000}); err != nil {
		t.Fatal(err)
	}
	root := testenv.OpenDB(t, rootDSN)
	dbName := admin.database
	user := "leaf_" + dbName // unique on the shared server, like the database
	exec := func(stmt string) {
		t.Helper()
		if _, err := root.ExecContext(ctx, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	exec("CREATE USER '" + user + "'@'%' IDENTIFIED BY 'pw'")
	t.Cleanup(func() { _, _ = root.ExecContext(context.Background(), "DROP USER '"+user+"'@'%'") })
	exec("GRANT SELECT, UPDATE ON `" + dbName + "`.`leaf_alloc` TO '" + user + "'@'%'") // Leaf's grants

	cfg, err := mysql.ParseDSN(rootDSN)
	if err != nil {
		t.Fatal(err)
	}
	cfg.User, cfg.Passwd = user, "pw"
	_, err = OpenMySQLStore(ctx, MySQLConfig{DSN: cfg.FormatDSN(), CreateTable: true})
	testutil.CheckErr(t, "OpenMySQLStore --mysql-create-table without CREATE", err, ErrStoreDenied, "GRANT CREATE ON `"+dbName+"`.`leaf_alloc`")
	leaf, err := OpenMySQLStore(ctx, MySQLConfig{DSN: cfg.FormatDSN()})
	if err != nil {
		t.Fatalf("OpenMySQLStore with SELECT, UPDATE: %v", err)
	}
	defer leaf.Close()

	if _, err := leaf.Take(ctx, "orders", 0); err != nil {
		t.Fatalf("Take with SELECT, UPDATE: %v", err)
	}
	if _, err := leaf.Tags(ctx); err != nil {
		t.Fatalf("Tags with SELECT, UPDATE: %v", err)
	}
	_, err = leaf.AddTag(ctx, Tag{Name: "invoices", Step: 1000})
	grant := "GRANT INSERT ON `" + dbName + "`.`leaf_alloc` TO '" + user + "'@"
	testutil.CheckErr(t, "AddTag without INSERT", err, ErrStoreDenied, grant)
	testutil.CheckErr(t, "AddTag without INSERT", err, ErrUnavailable, "lacks the INSERT privilege on leaf_alloc")

	exec("GRANT INSERT ON `" + dbName + "`.`leaf_alloc` TO '" + user + "'@'%'")
	if _, err := leaf.AddTag(ctx, Tag{Name: "invoices", Step: 1000}); err != nil {
		t.Fatalf("AddTag once INSERT was granted: %v", err)
	}

	exec("REVOKE UPDATE ON `" + dbName + "`.`leaf_alloc` FROM '" + user + "'@'%'")
	_, err = leaf.Take(ctx, "orders", 0)
	testutil.CheckErr(t, "Take without UPDATE", err, ErrStoreDenied, "GRANT UPDATE ON `"+dbName+"`.`leaf_alloc`")
	_, err = leaf.UpdateTag(ctx, TagUpdate{Name: "orders", Step: new(int64(2000))})
	testutil.CheckErr(t, "UpdateTag without UPDATE", err, ErrStoreDenied, "needs to update tags")

	// Not every error is a refusal: with SELECT left, a missing tag is still that.
	if _, err := leaf.Tag(ctx, "nope"); !errors.Is(err, ErrTagNotFound) || errors.Is(err, ErrStoreDenied) {
		t.Errorf("Tag of a missing tag: %v, want ErrTagNotFound", err)
	}
}
