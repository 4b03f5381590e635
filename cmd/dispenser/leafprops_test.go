package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/go-zookeeper/zk"

	"github.com/leafbus/leafbus/snowflake"
	"github.com/leafbus/leafbus/testenv"
)

// leafAllocDDL is leaf_alloc as Leaf's README creates it, run by hand as a Leaf
// operator did, not by the dispenser.
const leafAllocDDL = "CREATE TABLE `leaf_alloc` (" +
	"`biz_tag` varchar(128) NOT NULL DEFAULT ''," +
	"`max_id` bigint(20) NOT NULL DEFAULT '1'," +
	"`step` int(11) NOT NULL," +
	"`description` varchar(256) DEFAULT NULL," +
	"`update_time` timestamp NOT NULL DEFAULT CURRENT_TIMESTAMP ON UPDATE CURRENT_TIMESTAMP," +
	"PRIMARY KEY (`biz_tag`)) ENGINE=InnoDB"

// leafRows are Leaf rows a shop has, each inserted by plain SQL with its own max_id.
var leafRows = []struct {
	tag   string
	maxID int64
}{
	{"leaf-segment-test", 1}, {"com.acme.order", 1001}, {"order:create", 2001}, {"order create", 3001}, {"订单", 4001},
}

// leafShop is a Leaf deployment's state before the switch: its leaf_alloc rows in
// MariaDB, its node in ZooKeeper in Leaf's layout, and its leaf.properties.
type leafShop struct {
	props     string // path of leaf.properties
	httpPort  int
	name      string // leaf.name
	advertise string // the Leaf node's ip:port
	workerID  int64  // the Leaf node's sequence
	leafTS    int64  // its recorded timestamp
	zk        *zk.Conn
}

// newLeafShop sets up what a Leaf server with the returned leaf.properties ran on:
// leaf_alloc with leafRows, and under /snowflake/<leaf.name>/forever three Leaf nodes of
// other servers, then this server's own (this host's IPv4 and its port), so its worker
// ID is 3.
func newLeafShop(t *testing.T) *leafShop {
	t.Helper()
	dsn := testenv.MariaDB(t).NewDatabase(t)
	db := testenv.OpenDB(t, dsn)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := db.ExecContext(ctx, leafAllocDDL); err != nil {
		t.Fatal(err)
	}
	for _, r := range leafRows {
		if _, err := db.ExecContext(ctx, "INSERT INTO leaf_alloc (biz_tag, max_id, step, description) VALUES (?, ?, 1000, 'a Leaf row')", r.tag, r.maxID); err != nil {
			t.Fatalf("insert %q: %v", r.tag, err)
		}
	}
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	// Leaf's database user, with the grants README's migration steps name: a dispenser
	// that serves the table needs nothing more than Leaf does.
	user, password := "leaf_"+cfg.DBName, "s3cret:@/pw"
	for _, stmt := range []string{
		"CREATE USER '" + user + "'@'%' IDENTIFIED BY '" + password + "'",
		"GRANT SELECT, UPDATE ON `" + cfg.DBName + "`.leaf_alloc TO '" + user + "'@'%'",
	} {
		if _, err := db.ExecContext(ctx, stmt); err != nil {
			t.Fatalf("%s: %v", stmt, err)
		}
	}
	t.Cleanup(func() { db.Exec("DROP USER '" + user + "'@'%'") }) //nolint:errcheck // the server may be gone
	cfg.User, cfg.Passwd = user, password
	ip, err := firstIPv4()
	if err != nil {
		t.Skipf("this host has no IPv4 address besides loopback, which a Leaf server needs: %v", err)
	}
	srv := testenv.ZooKeeper(t)
	s := &leafShop{
		httpPort: freePort(t),
		name:     "com.acme.leaf." + strings.TrimPrefix(srv.NewRoot(t), "/"),
		zk:       srv.Connect(t),
		leafTS:   time.Now().Add(-time.Minute).UnixMilli(),
	}
	s.advertise = fmt.Sprintf("%s:%d", ip, s.httpPort)
	forever := "/snowflake/" + s.name + "/forever"
	for _, p := range []string{"/snowflake", "/snowflake/" + s.name, forever} {
		if _, err := s.zk.Create(p, nil, 0, zk.WorldACL(zk.PermAll)); err != nil && !errors.Is(err, zk.ErrNodeExists) {
			t.Fatalf("create %s: %v", p, err)
		}
	}
	for i, addr := range []string{"10.0.0.1:8080", "10.0.0.2:8080", "10.0.0.3:8080", s.advertise} {
		host, port, _ := strings.Cut(addr, ":")
		data := fmt.Sprintf(`{"ip":"%s","port":"%s","timestamp":%d}`, host, port, s.leafTS)
		created, err := s.zk.Create(forever+"/"+addr+"-", []byte(data), zk.FlagSequence, zk.WorldACL(zk.PermAll))
		if err != nil || !strings.HasSuffix(created, fmt.Sprintf("-%010d", i)) {
			t.Fatalf("create the Leaf node of %s: %s, %v", addr, created, err)
		}
	}
	s.workerID = 3
	s.props = filepath.Join(t.TempDir(), "leaf.properties")
	content := fmt.Sprintf(`leaf.name=%s
leaf.segment.enable=true
leaf.jdbc.url=jdbc:mysql://%s/%s?useUnicode=true&characterEncoding=utf8
leaf.jdbc.username=%s
leaf.jdbc.password=%s

leaf.snowflake.enable=true
leaf.snowflake.zk.address=%s
leaf.snowflake.port=%d
`, s.name, cfg.Addr, cfg.DBName, cfg.User, cfg.Passwd, srv.Addr(), s.httpPort)
	if err := os.WriteFile(s.props, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	return s
}

// leafPath is Leaf's URL path for a segment tag: escaped, and ending with a slash so
// that Spring keeps a dotted tag whole.
func leafPath(tag string) string { return "/api/segment/get/" + url.PathEscape(tag) + "/" }

// TestBinaryLeafProperties: the real binary started with nothing but a Leaf server's
// leaf.properties (and where to keep its data) serves the table's tags, dotted, colon,
// space and Chinese ones included, over Leaf's HTTP API on Leaf's port and over NATS (the
// Go client naming them as they are, and the raw subject in the tag encoding), and keeps
// the Leaf node's worker ID, recording its timestamps on that node.
func TestBinaryLeafProperties(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	shop := newLeafShop(t)
	b := startBinary(t, t.TempDir(), "--leaf-properties", shop.props, "--sample-tag=false")
	base := fmt.Sprintf("http://127.0.0.1:%d", shop.httpPort)
	httpGet := func(path string) string {
		t.Helper()
		resp, err := http.Get(base + path)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != 200 {
			t.Fatalf("GET %s: %d %s", path, resp.StatusCode, body)
		}
		return string(body)
	}
	for _, r := range leafRows {
		if got := httpGet(leafPath(r.tag)); got != strconv.FormatInt(r.maxID, 10) {
			t.Errorf("GET %s = %s, want the row's first ID %d", leafPath(r.tag), got, r.maxID)
		}
	}

	nc, c := b.connect(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, r := range leafRows {
		id, err := c.Segment(ctx, r.tag)
		if err != nil || id != r.maxID+1 {
			t.Errorf("client.Segment(%q) = %d, %v; want %d", r.tag, id, err, r.maxID+1)
		}
	}
	for subject, want := range map[string]int64{
		"leaf.segment.com%2Eacme%2Eorder": 1003,
		"leaf.segment.order%3Acreate":     2003,
		"leaf.segment.order%20create":     3003,
		"leaf.segment.%E8%AE%A2%E5%8D%95": 4003,
	} {
		m, err := nc.Request(subject, nil, 10*time.Second)
		if err != nil || string(m.Data) != strconv.FormatInt(want, 10) {
			t.Errorf("nats req %s: %v, %v; want %d", subject, m, err, want)
		}
	}

	// The worker ID is the Leaf node's; the dispenser records on that node.
	sf, err := strconv.ParseInt(httpGet("/api/snowflake/get/biz:order"), 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	d, err := snowflake.DefaultLayout().Decode(sf)
	if err != nil || d.WorkerID != shop.workerID || d.Timestamp <= shop.leafTS {
		t.Fatalf("snowflake ID %d decodes to %+v, %v: want worker %d above the Leaf node's timestamp %d", sf, d, err, shop.workerID, shop.leafTS)
	}
	forever := "/snowflake/" + shop.name + "/forever"
	node := fmt.Sprintf("%s/%s-%010d", forever, shop.advertise, shop.workerID)
	deadline := time.Now().Add(10 * time.Second)
	for {
		data, _, err := shop.zk.Get(node)
		if err != nil {
			t.Fatalf("get %s: %v", node, err)
		}
		var rec struct {
			Timestamp int64 `json:"timestamp"`
		}
		if json.Unmarshal(data, &rec) == nil && rec.Timestamp > shop.leafTS {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s still holds %s after 10s: the dispenser does not record on the Leaf node", node, data)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if children, _, err := shop.zk.Children(forever); err != nil || len(children) != 4 {
		t.Errorf("%s holds %v (%v): want the four Leaf nodes and no new one", forever, children, err)
	}
	// Where a person reads a tag, it is the tag as it is, never its encoding.
	for what, page := range map[string]string{
		"/db":                       httpGet("/db"),
		"the status page":           httpGet("/"),
		"/metrics":                  httpGet("/metrics"),
		"dispenser tag list":        runTagCmd(t, "list", "--nats", b.url),
		"dispenser tag list --json": runTagCmd(t, "list", "--json", "--nats", b.url),
	} {
		for _, tag := range []string{"com.acme.order", "order:create", "order create", "订单"} {
			if !strings.Contains(page, tag) {
				t.Errorf("%s does not show the tag %q", what, tag)
			}
		}
		if strings.Contains(page, "%E8%AE%A2") || strings.Contains(page, "=E8=AE=A2") {
			t.Errorf("%s shows a tag's encoding", what)
		}
	}
	// What leafbus adds to Leaf's tree (README, "Migrating from a running Leaf"): the
	// ephemeral alive node of this ip:port under /snowflake/<name>/leafbus, nothing else.
	for path, want := range map[string]string{
		"/snowflake/" + shop.name:                    "forever leafbus",
		"/snowflake/" + shop.name + "/leafbus":       "alive",
		"/snowflake/" + shop.name + "/leafbus/alive": shop.advertise,
	} {
		children, _, err := shop.zk.Children(path)
		slices.Sort(children)
		if err != nil || strings.Join(children, " ") != want {
			t.Errorf("%s holds %q (%v), want %q", path, children, err, want)
		}
	}
	if _, stat, err := shop.zk.Get("/snowflake/" + shop.name + "/leafbus/alive/" + shop.advertise); err != nil || stat.EphemeralOwner == 0 {
		t.Errorf("the alive node: %+v, %v; want an ephemeral node", stat, err)
	}
}
