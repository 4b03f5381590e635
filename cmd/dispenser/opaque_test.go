package main

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/leafbus/leafbus/client"
	"github.com/leafbus/leafbus/internal/testutil"
	"github.com/leafbus/leafbus/opaque"
	"github.com/leafbus/leafbus/wire"
)

// Opaque tags (issue 26): a tag added --opaque hands out the images of its segment
// numbers under the deployment's ID key; across dispensers, restarts and a lost marks
// bucket no ID comes twice; a dispenser with another key refuses the tag; the IDs a
// client receives show no order; `dispenser reveal` takes them back.

// writeKeyFile writes a key file holding key as hex, readable by its owner only.
func writeKeyFile(tb testing.TB, key []byte) string {
	tb.Helper()
	path := filepath.Join(tb.TempDir(), "id.key")
	if err := os.WriteFile(path, []byte(hex.EncodeToString(key)+"\n"), 0o600); err != nil {
		tb.Fatal(err)
	}
	return path
}

var (
	deploymentKey = []byte("the deployment's ID key, 32 bytes")
	wrongKey      = []byte("some other ID key of 32 bytes....")
)

// TestOpaqueTagCLI: `tag add --opaque --bits 53` through the CLI, its IDs over NATS (in
// range, sorted within a reply, not the numbers), `tag list` showing it, `reveal` giving
// back exactly the numbers handed out (asking the deployment, and offline with --bits),
// refusing a wrong key; what may not change of it; and a dispenser without a key
// refusing to add one.
func TestOpaqueTagCLI(t *testing.T) {
	keyFile, wrongFile := writeKeyFile(t, deploymentKey), writeKeyFile(t, wrongKey)
	d := startDispenser(t, func(c *testConfig) { c.IDKeyFile = keyFile })
	url := d.ClientURL()
	code, out, errOut := run(t, "tag", "add", "--nats", url, "--tag", "inv", "--step", "100", "--opaque", "--bits", "53")
	fp := opaque.Fingerprint(deploymentKey)
	if code != 0 || !strings.Contains(out, `"opaque": true`) || !strings.Contains(out, `"bits": 53`) || !strings.Contains(out, fp) {
		t.Fatalf("tag add --opaque --bits 53: exit %d\nstdout: %s\nstderr: %s", code, out, errOut)
	}
	if code, out, _ := run(t, "tag", "list", "--nats", url); code != 0 || !regexpLine(out, `^inv\s+1\s+100\s+false\s+true\s+53\s`) {
		t.Fatalf("tag list: exit %d, want a row inv 1 100 false true 53:\n%s", code, out)
	}
	c := d.client(t)
	ctx := testutil.Context(t, 30*time.Second)
	var got []int64
	for range 5 {
		ids, err := c.SegmentN(ctx, "inv", 10)
		if err != nil {
			t.Fatal(err)
		}
		for i, id := range ids {
			if id < 1 || id >= 1<<53 || i > 0 && id <= ids[i-1] {
				t.Fatalf("reply %v: want IDs in [1, 2^53), strictly increasing", ids)
			}
		}
		got = append(got, ids...)
	}
	if slices.Equal(got[:10], seq(1, 10)) {
		t.Fatalf("the opaque tag handed out its numbers themselves: %v", got[:10])
	}
	args := []string{"reveal", "--nats", url, "--tag", "inv", "--id-key-file", keyFile}
	for _, id := range got {
		args = append(args, strconv.FormatInt(id, 10))
	}
	code, out, errOut = run(t, args...)
	if code != 0 {
		t.Fatalf("reveal: exit %d\nstderr: %s", code, errOut)
	}
	numbers := parseLines(t, out)
	slices.Sort(numbers)
	if !slices.Equal(numbers, seq(1, 50)) {
		t.Fatalf("reveal of the 50 IDs handed out gave %v, want 1..50", numbers)
	}
	offline := append([]string{"reveal", "--nats", "nats://127.0.0.1:1", "--tag", "inv", "--bits", "53", "--id-key-file", keyFile}, args[7:]...)
	if code, out2, errOut := run(t, offline...); code != 0 || out2 != out {
		t.Fatalf("reveal --bits 53 without NATS: exit %d, %q, want %q\nstderr: %s", code, out2, out, errOut)
	}
	for _, tt := range []struct {
		name string
		args []string
		code int
		want string
	}{
		{"RevealWrongKey", []string{"reveal", "--nats", url, "--tag", "inv", "--id-key-file", wrongFile, "5"}, 1, "not the deployment's key"},
		{"RevealNoKey", []string{"reveal", "--nats", url, "--tag", "inv", "5"}, 2, "--id-key-file"},
		{"RevealPlainTag", []string{"reveal", "--nats", url, "--tag", "leaf-segment-test", "--id-key-file", keyFile, "5"}, 1, "not opaque"},
		{"RevealOutOfRange", []string{"reveal", "--nats", url, "--tag", "inv", "--id-key-file", keyFile, strconv.FormatInt(1<<53, 10)}, 2, "not an ID of a 53-bit tag"},
		{"UpdateOpaqueWidth", []string{"tag", "update", "--nats", url, "--tag", "inv", "--bits", "63"}, 1, "part of its permutation"},
		{"AddOpaqueMonotonic", []string{"tag", "add", "--nats", url, "--tag", "om", "--step", "10", "--opaque", "--monotonic"}, 1, "cannot be monotonic"},
		{"AddOverSampleTag", []string{"tag", "add", "--nats", url, "--tag", "leaf-segment-test", "--step", "10", "--opaque"}, 1, "exists"},
		{"AddCapped", []string{"tag", "add", "--nats", url, "--tag", "web", "--step", "10", "--bits", "53"}, 0, `"bits": 53`},
		{"UpdateCap", []string{"tag", "update", "--nats", url, "--tag", "web", "--bits", "40"}, 0, `"bits": 40`},
		{"ErrBits", []string{"tag", "add", "--nats", url, "--tag", "narrow", "--step", "10", "--bits", "8"}, 1, "bits 8"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			code, out, errOut := run(t, tt.args...)
			if tt.code != 0 {
				out = errOut
			}
			if code != tt.code || !strings.Contains(out, tt.want) {
				t.Fatalf("dispenser %s: exit %d, want %d with %q\nstdout: %s\nstderr: %s", strings.Join(tt.args, " "), code, tt.code, tt.want, out, errOut)
			}
		})
	}

	keyless := startDispenser(t, nil)
	code, _, errOut = run(t, "tag", "add", "--nats", keyless.ClientURL(), "--tag", "inv", "--step", "10", "--opaque")
	if code != 1 || !strings.Contains(errOut, "503") || !strings.Contains(errOut, "--id-key-file") {
		t.Fatalf("tag add --opaque on a dispenser without a key: exit %d, want 1 with a 503 naming --id-key-file\nstderr: %s", code, errOut)
	}
}

func seq(from int64, n int) []int64 {
	out := make([]int64, n)
	for i := range out {
		out[i] = from + int64(i)
	}
	return out
}

func parseLines(t *testing.T, s string) []int64 {
	t.Helper()
	var out []int64
	for _, line := range strings.Fields(s) {
		n, err := strconv.ParseInt(line, 10, 64)
		if err != nil {
			t.Fatalf("%q is not a number", line)
		}
		out = append(out, n)
	}
	return out
}

// TestOpaqueFleet: three dispenser processes with the deployment's key on one NATS
// server, clients asking for an opaque tag the whole time. One with another key, and
// one with none, refuse to start, naming the fingerprint they need; a dispenser is killed with -9 and started again on its data dir; then every dispenser
// stops, the marks bucket is deleted, and a new dispenser on a new data dir serves the
// tag from the deployment record. No ID comes twice, every reply is in the 53-bit range,
// and single IDs in the order a client received them rise about half the time.
func TestOpaqueFleet(t *testing.T) {
	t.Parallel() // its own servers and ports: it waits beside the others (make test's longest package)
	keyFile, wrongFile := writeKeyFile(t, deploymentKey), writeKeyFile(t, wrongKey)
	f := startFleet(t, 3, "--id-key-file", keyFile)
	ctx := testutil.Context(t, 3*time.Minute)
	step, on, bits := int64(50), true, 53
	// A dispenser without the key, started before any opaque tag (when none was needed),
	// serves on in the queue group: adding an opaque tag is refused (409) naming it,
	// and nothing is added; once it has stopped, the tag is added.
	// The queue group may hand the call to the keyless dispenser itself, which answers 503
	// (it has no key to add the tag with); asked again, a keyed one answers the 409.
	keyless := startProcess(t, "--nats", f.nats.URL(), "--data-dir", t.TempDir(), "--node-id", "keyless", "--http", "", "--sample-tag=false")
	var err error
	for range 20 {
		_, err = f.admin.AddTag(ctx, wire.AddTagRequest{Tag: "inv", Step: &step, Opaque: &on, Bits: &bits})
		if !errors.Is(err, wire.ErrUnavailable) || !strings.Contains(err.Error(), "the dispenser that answered has no ID key") {
			break
		}
	}
	if !errors.Is(err, wire.ErrConflict) || !strings.Contains(err.Error(), "keyless (no ID key") {
		t.Fatalf("add an opaque tag beside a dispenser without the key = %v; want a 409 naming it", err)
	}
	if tags, err := f.admin.Tags(ctx); err != nil || slices.ContainsFunc(tags, func(ti wire.TagInfo) bool { return ti.Tag == "inv" }) {
		t.Fatalf("after the refused add: tags %v, %v; want no inv", tags, err)
	}
	keyless.cmd.Process.Signal(syscall.SIGTERM)
	if err := <-keyless.done; err != nil {
		t.Fatalf("the keyless dispenser's clean stop: %v", err)
	}
	keyless.done <- nil // for its cleanup
	info, err := f.admin.AddTag(ctx, wire.AddTagRequest{Tag: "inv", Step: &step, Opaque: &on, Bits: &bits})
	if err != nil || !info.Opaque || info.Bits != 53 {
		t.Fatalf("add opaque tag = %+v, %v", info, err)
	}
	// No key, no serving (issue 30): a dispenser with another key, or none, refuses to
	// start, naming the fingerprint it needs and how to give the key; it never joins
	// the queue group to answer 503.
	fp := opaque.Fingerprint(deploymentKey)
	for _, extra := range [][]string{{"--id-key-file", wrongFile}, nil} {
		wantExit(t, append([]string{"--nats", f.nats.URL(), "--data-dir", t.TempDir(), "--node-id", "wrongkey", "--http", "", "--sample-tag=false"}, extra...),
			"ID key of opaque tags", fp, "--id-key-file", "LEAFBUS_ID_KEY")
	}

	load := startOpaqueLoad(t, f.conns(3), "inv")
	waitFor := func(n, singles int) {
		testutil.Eventually(t, 60*time.Second, fmt.Sprintf("%d IDs, %d of them single", n, singles), func() bool {
			_, pairs := load.rises()
			return load.count() >= n && pairs >= singles
		})
	}
	waitFor(3000, 300)
	killed := f.procs["m2"]
	killed.cmd.Process.Kill()
	err = <-killed.done
	killed.done <- err // for its cleanup
	f.start("m2")
	waitFor(load.count()+3000, 600)
	load.stop()

	// Every dispenser stops; the marks bucket is lost; a dispenser that never served
	// the tag starts on a new data dir and learns its range from the deployment record.
	for _, name := range []string{"m1", "m2", "m3"} {
		f.stop(name)
	}
	if err := f.js.DeleteKeyValue(ctx, "leaf_tagopts"); err != nil {
		t.Fatal(err)
	}
	f.start("m4")
	after := startOpaqueLoad(t, f.conns(1), "inv")
	testutil.Eventually(t, 60*time.Second, "IDs from the new dispenser", func() bool {
		_, pairs := after.rises()
		return after.count() >= 500 && pairs >= 200
	})
	after.stop()

	all := append(load.all(), after.all()...)
	if dups := testutil.Duplicates(all); len(dups) > 0 {
		t.Fatalf("%d IDs handed out twice of %d: %v", len(dups), len(all), dups[:min(len(dups), 10)])
	}
	for _, id := range all {
		if id < 1 || id >= 1<<53 {
			t.Fatalf("ID %d outside the tag's 53 bits", id)
		}
	}
	if load.refusedOtherKey() > 0 {
		t.Fatalf("%d requests were refused for the other key: a dispenser with it served; failures: %v", load.refusedOtherKey(), load.failures)
	}
	rises, pairs := load.rises()
	r2, p2 := after.rises()
	rises, pairs = rises+r2, pairs+p2
	t.Logf("%d IDs (%d after the bucket was lost), %d refused by the other key, single IDs in the order received: %d of %d pairs rise; failures %v",
		len(all), len(after.all()), load.refusedOtherKey(), rises, pairs, load.failures)
	// Independent images rise half the time, with a standard deviation of sqrt(n)/2;
	// the numbers themselves would rise nearly always.
	if d := float64(rises) - float64(pairs)/2; pairs < 800 || d*d > 100*float64(pairs)/4 {
		t.Fatalf("%d of %d consecutive single IDs rise: want about half (and at least 800 pairs)", rises, pairs)
	}
	// Under the deployment's key every ID is the image of a number the tag's segments
	// handed out: below its max_id now, each once. An ID made under the other key would
	// reveal to a number anywhere in 53 bits.
	maxID := tagMaxID(ctx, t, f.admin, "inv")
	p, err := opaque.New(deploymentKey, "inv", 53)
	if err != nil {
		t.Fatal(err)
	}
	numbers := map[int64]bool{}
	for _, id := range all {
		n, err := p.Reveal(id)
		if err != nil || numbers[n] || n >= maxID {
			t.Fatalf("Reveal(%d) = %d, %v: want a number below the tag's max_id %d, each once", id, n, err, maxID)
		}
		numbers[n] = true
	}
}

// opaqueLoad is clients asking for one tag: half of the requests for one ID (kept in
// the order each client received them, for the order statistic), the rest for batches.
type opaqueLoad struct {
	tag    string
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu       sync.Mutex
	ids      []int64
	singles  [][]int64 // per client, single IDs in the order received
	failures map[string]int
	wrong    int // 503s naming another key
}

func startOpaqueLoad(t *testing.T, conns []*nats.Conn, tag string) *opaqueLoad {
	t.Helper()
	l := &opaqueLoad{tag: tag, failures: map[string]int{}, singles: make([][]int64, len(conns))}
	ctx, cancel := context.WithCancel(context.Background())
	l.cancel = cancel
	for i, nc := range conns {
		c, err := client.NewClient(nc, client.WithHedge(0), client.WithTimeout(5*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		l.wg.Add(1)
		go func() {
			defer l.wg.Done()
			for n := 0; ctx.Err() == nil; n++ {
				count := 1
				if n%2 != 0 {
					count = 1 + n%40
				}
				ids, err := c.SegmentN(ctx, tag, count)
				l.record(i, count, ids, err)
			}
		}()
	}
	t.Cleanup(l.stop)
	return l
}

func (l *opaqueLoad) record(client, count int, ids []int64, err error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if err != nil {
		var we *wire.Error
		switch {
		case errors.As(err, &we) && strings.Contains(we.Description, "another ID key") && strings.Contains(we.Description, opaque.Fingerprint(wrongKey)):
			l.wrong++
		case errors.Is(err, context.Canceled):
		default:
			l.failures[errorClass(err)]++
		}
		return
	}
	l.ids = append(l.ids, ids...)
	if count == 1 {
		l.singles[client] = append(l.singles[client], ids[0])
	}
}

func (l *opaqueLoad) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.ids)
}

func (l *opaqueLoad) all() []int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.ids)
}

func (l *opaqueLoad) refusedOtherKey() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.wrong
}

// rises counts, over every client's single IDs in the order it received them, the
// consecutive pairs that rise, and the pairs.
func (l *opaqueLoad) rises() (rises, pairs int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, ids := range l.singles {
		for i := 1; i < len(ids); i++ {
			pairs++
			if ids[i] > ids[i-1] {
				rises++
			}
		}
	}
	return rises, pairs
}

func (l *opaqueLoad) stop() {
	l.cancel()
	l.wg.Wait()
}

// regexpLine reports whether a line of s matches the pattern.
func regexpLine(s, pattern string) bool {
	re := regexp.MustCompile(pattern)
	for _, line := range strings.Split(s, "\n") {
		if re.MatchString(line) {
			return true
		}
	}
	return false
}

// TestOpaquePoolsBufferHTTP: with an opaque tag every path a client can take hands out
// images of its numbers, each once and each revealed to a number the tag's segments
// handed out: pre-filled replies (--pool), batches of the pool stream through
// client.Consumer, the buffering client (a reply with gaps is kept as runs of one), and
// Leaf's HTTP API.
func TestOpaquePoolsBufferHTTP(t *testing.T) {
	const size = 50
	keyFile := writeKeyFile(t, deploymentKey)
	d := startDispenser(t, func(c *testConfig) {
		c.IDKeyFile = keyFile
		if err := c.Pools.Set(fmt.Sprintf("segment:inv:%d:4", size)); err != nil {
			t.Fatal(err)
		}
	})
	ctx := testutil.Context(t, time.Minute)
	admin := d.client(t)
	step, on := int64(200), true
	if _, err := admin.AddTag(ctx, wire.AddTagRequest{Tag: "inv", Step: &step, Opaque: &on}); err != nil {
		t.Fatal(err)
	}
	p, err := opaque.New(deploymentKey, "inv", 63)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int64]string{}
	take := func(how string, ids []int64) {
		t.Helper()
		for i, id := range ids {
			if prev, dup := seen[id]; dup {
				t.Fatalf("%s: ID %d handed out twice (first by %s)", how, id, prev)
			}
			seen[id] = how
			if how != "buffer" && i > 0 && id <= ids[i-1] {
				t.Fatalf("%s: reply not strictly increasing: %v", how, ids)
			}
		}
	}

	// Replies of the pool's size (pre-filled) and of others.
	for i := range 40 {
		n := size
		if i%4 == 3 {
			n = 7
		}
		ids, err := admin.SegmentN(ctx, "inv", n)
		if err != nil {
			t.Fatal(err)
		}
		take("request", ids)
	}
	// Until the pool (which found no tag before the add, and backs off) answers some.
	statsNC := d.connect(t)
	testutil.Eventually(t, 20*time.Second, "a request answered from the opaque tag's pool", func() bool {
		ids, err := admin.SegmentN(ctx, "inv", size)
		if err != nil {
			t.Fatal(err)
		}
		take("request", ids)
		return pooledReplies(t, statsNC) > 0
	})
	// The pool stream, as an ETL job takes it.
	js, err := jetstream.New(d.connect(t))
	if err != nil {
		t.Fatal(err)
	}
	var cons *client.Consumer
	testutil.Eventually(t, 20*time.Second, "the pool stream's consumer", func() bool {
		cons, err = client.NewConsumer(ctx, js, "leaf", wire.Segment, "inv")
		return err == nil
	})
	for range 3 {
		batch, err := cons.Next(ctx)
		if err != nil {
			t.Fatalf("a batch of the pool stream: %v", err)
		}
		if len(batch) != size {
			t.Fatalf("a batch of the pool stream has %d IDs, want %d", len(batch), size)
		}
		take("pool stream", batch)
	}
	// The buffering client.
	opts := client.DefaultBufferOptions()
	opts.Batch = 100
	buf, err := admin.Buffer(wire.Segment, "inv", opts)
	if err != nil {
		t.Fatal(err)
	}
	defer buf.Close()
	var fromBuf []int64
	for range 500 {
		id, err := buf.Next(ctx)
		if err != nil {
			t.Fatal(err)
		}
		fromBuf = append(fromBuf, id)
	}
	take("buffer", fromBuf)
	// Leaf's HTTP API.
	status, body := httpGet(t, "http://"+d.HTTPAddr().String()+"/api/segment/get/inv?count=20")
	if status != 200 {
		t.Fatalf("HTTP: %d %s", status, body)
	}
	take("HTTP", parseLines(t, body))

	maxID := tagMaxID(ctx, t, admin, "inv")
	numbers := map[int64]bool{}
	for id, how := range seen {
		n, err := p.Reveal(id)
		if err != nil || n >= maxID || numbers[n] {
			t.Fatalf("%s: Reveal(%d) = %d, %v; want a number below max_id %d, each once", how, id, n, err, maxID)
		}
		numbers[n] = true
	}
	t.Logf("%d IDs from requests, pools, the pool stream, the buffer and HTTP, max_id %d", len(seen), maxID)
}

// pooledReplies is the segment endpoint's pooled_replies in $SRV.STATS.leaf.
func pooledReplies(t *testing.T, nc *nats.Conn) uint64 {
	t.Helper()
	msg, err := nc.Request("$SRV.STATS.leaf", nil, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	var stats struct {
		Endpoints []struct {
			Name string `json:"name"`
			Data struct {
				Pooled uint64 `json:"pooled_replies"`
			} `json:"data"`
		} `json:"endpoints"`
	}
	if err := json.Unmarshal(msg.Data, &stats); err != nil {
		t.Fatal(err)
	}
	for _, e := range stats.Endpoints {
		if e.Name == "segment" {
			return e.Data.Pooled
		}
	}
	return 0
}

// httpGet gets url and returns its status and body.
func httpGet(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(b)
}

// tagMaxID is tag's max_id as the admin API lists it (0 when it is not listed).
func tagMaxID(ctx context.Context, t *testing.T, admin *client.Client, tag string) int64 {
	t.Helper()
	tags, err := admin.Tags(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, info := range tags {
		if info.Tag == tag {
			return info.MaxID
		}
	}
	return 0
}

// wantExit runs the dispenser binary with args and wants it to exit non-zero within a
// minute, its stderr naming each of want.
func wantExit(t *testing.T, args []string, want ...string) {
	t.Helper()
	bin, err := buildDispenser()
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var stderr testutil.SyncBuffer
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Stderr = &stderr
	err = cmd.Run()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || ctx.Err() != nil {
		t.Fatalf("dispenser %v: %v, want it to refuse to start\nstderr:\n%s", args, err, stderr.String())
	}
	for _, w := range want {
		if !strings.Contains(stderr.String(), w) {
			t.Errorf("dispenser %v exited %v, its stderr not naming %q:\n%s", args, err, w, stderr.String())
		}
	}
}
