package main

// docs/PROTOCOL.md is the contract users read, so these tests keep it honest against
// the code: every flag `dispenser --help` (and each subcommand's --help) lists is in its
// flag table, with its environment name and default, and every flag a table lists
// exists; every subject, header, KV bucket, stream and MySQL table the document names is
// one the code uses, and every one the code uses is named. The names are taken from the
// code (package wire, the packages that own the rest today, and what a running
// dispenser creates on its NATS server), never spelled again here.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"maps"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nats.go/micro"

	"github.com/leafbus/leafbus/dispenser"
	"github.com/leafbus/leafbus/internal/testutil"
	"github.com/leafbus/leafbus/pools"
	"github.com/leafbus/leafbus/segment"
	"github.com/leafbus/leafbus/wire"
	"github.com/leafbus/leafbus/workerid"
)

const protocolDocPath = "../../docs/PROTOCOL.md"

// The headings of the document's flag tables.
const (
	serveFlagsHeading      = "### Flags of `dispenser`"
	subcommandFlagsHeading = "### Flags of the subcommands"
)

// readProtocolDoc returns docs/PROTOCOL.md.
func readProtocolDoc(tb testing.TB) string {
	tb.Helper()
	b, err := os.ReadFile(protocolDocPath)
	if err != nil {
		tb.Fatalf("the contract must be in the repository: %v", err)
	}
	return string(b)
}

// docTable returns the rows (cells trimmed, header and separator left out) of the first
// table after heading in doc. A cell may hold `\|`, which is not a cell boundary.
func docTable(tb testing.TB, doc, heading string) [][]string {
	tb.Helper()
	i := strings.Index(doc, "\n"+heading+"\n")
	if i < 0 {
		tb.Fatalf("%s: no heading %q", protocolDocPath, heading)
	}
	var rows [][]string
	inTable := false
	for _, line := range strings.Split(doc[i+len(heading)+2:], "\n") {
		if !strings.HasPrefix(line, "|") {
			if inTable {
				break
			}
			if strings.HasPrefix(line, "#") {
				tb.Fatalf("%s: no table under %q", protocolDocPath, heading)
			}
			continue
		}
		inTable = true
		cells := splitCells(strings.Trim(line, "|"))
		if strings.Trim(cells[0], "- ") == "" {
			continue // the separator
		}
		rows = append(rows, cells)
	}
	if len(rows) < 2 {
		tb.Fatalf("%s: the table under %q has no rows", protocolDocPath, heading)
	}
	return rows[1:]
}

// splitCells splits a table row at every | that is not escaped as \|.
func splitCells(row string) []string {
	var cells []string
	start := 0
	for i := 0; i < len(row); i++ {
		if row[i] == '|' && (i == 0 || row[i-1] != '\\') {
			cells = append(cells, strings.TrimSpace(row[start:i]))
			start = i + 1
		}
	}
	return append(cells, strings.TrimSpace(row[start:]))
}

var codeSpan = regexp.MustCompile("`([^`]*)`")

// cellFlags returns the flags a cell names: each code span that starts with "--", by
// its first word ("--segment-store kv\|mysql" is segment-store).
func cellFlags(cell string) []string {
	var names []string
	for _, m := range codeSpan.FindAllStringSubmatch(cell, -1) {
		if f := strings.Fields(m[1]); len(f) > 0 && strings.HasPrefix(f[0], "--") {
			names = append(names, strings.TrimPrefix(f[0], "--"))
		}
	}
	return names
}

// helpFlags returns the flag names a --help output lists ("  -name type" lines, as
// flag.PrintDefaults writes them).
func helpFlags(tb testing.TB, help string) []string {
	tb.Helper()
	var names []string
	for _, m := range regexp.MustCompile(`(?m)^  -([^ \n]+)`).FindAllStringSubmatch(help, -1) {
		names = append(names, m[1])
	}
	return names
}

// TestProtocolDocServeFlags: the flag table of `dispenser` lists exactly the flags
// `dispenser --help` lists, each with its LEAFBUS_<NAME> variable and its default.
func TestProtocolDocServeFlags(t *testing.T) {
	var help bytes.Buffer
	if code := runCommand(context.Background(), []string{"--help"}, io.Discard, &help); code != 0 {
		t.Fatalf("dispenser --help exited %d:\n%s", code, help.String())
	}
	listed := helpFlags(t, help.String())
	if len(listed) < 40 {
		t.Fatalf("dispenser --help lists %d flags; has its format changed?\n%s", len(listed), help.String())
	}
	c := defaultConfig()
	fs := c.flagSet(io.Discard)

	documented := map[string]bool{}
	for _, row := range docTable(t, readProtocolDoc(t), serveFlagsHeading) {
		if len(row) != 4 {
			t.Errorf("%s: flag table row %q: want 4 cells (flag, environment, default, meaning)", protocolDocPath, row)
			continue
		}
		names := cellFlags(row[0])
		if len(names) != 1 {
			t.Errorf("%s: flag table row %q: want exactly one flag in its first cell, got %q", protocolDocPath, row[0], names)
			continue
		}
		name := names[0]
		if documented[name] {
			t.Errorf("%s: --%s has two rows in the flag table", protocolDocPath, name)
		}
		documented[name] = true
		f := fs.Lookup(name)
		if f == nil || !slices.Contains(listed, name) {
			t.Errorf("%s documents --%s, but dispenser --help lists no such flag", protocolDocPath, name)
			continue
		}
		if want := "`" + envName(name) + "`"; row[1] != want {
			t.Errorf("%s: --%s: environment %s, want %s", protocolDocPath, name, row[1], want)
		}
		if err := checkDocDefault(f, row[2]); err != nil {
			t.Errorf("%s: --%s: default %q: %v", protocolDocPath, name, row[2], err)
		}
	}
	for _, name := range listed {
		if !documented[name] {
			t.Errorf("dispenser --help lists --%s, but %s does not document it: add a row to its table under %q", name, protocolDocPath, serveFlagsHeading)
		}
	}
}

// docDefaultExceptions are the flags whose default the table says in words: they hold
// no value a reader could type.
var docDefaultExceptions = map[string]string{
	"node-id":   "the host name", // the machine's, sanitised
	"worker-id": "none",          // -1 means "not given"
}

// checkDocDefault checks a default cell against the flag's real default. A bool reads
// "on" or "off" first; a flag with a value starts with it as a code span (durations are
// compared as durations: `1h` is 1h0m0s); a flag without one does not start with a value
// (a code span naming another flag, "`--user`'s", is not one).
func checkDocDefault(f *flag.Flag, cell string) error {
	if words, ok := docDefaultExceptions[f.Name]; ok {
		if !strings.HasPrefix(cell, words) {
			return fmt.Errorf("want it to start with %q", words)
		}
		return nil
	}
	if b, ok := f.Value.(interface{ IsBoolFlag() bool }); ok && b.IsBoolFlag() {
		want := map[string]string{"true": "on", "false": "off"}[f.DefValue]
		if !strings.HasPrefix(cell, want) {
			return fmt.Errorf("the flag defaults to %s: want the cell to start with %q", f.DefValue, want)
		}
		return nil
	}
	var value string
	if m := regexp.MustCompile("^`([^`]*)`").FindStringSubmatch(cell); m != nil && !strings.HasPrefix(m[1], "--") {
		value = m[1]
	}
	var def time.Duration
	isDuration := false
	if g, ok := f.Value.(flag.Getter); ok {
		def, isDuration = g.Get().(time.Duration)
	}
	switch {
	case f.DefValue == "" && value != "":
		return fmt.Errorf("the flag has no default, but the cell starts with the value %q", value)
	case f.DefValue == "":
		return nil
	case value == "":
		return fmt.Errorf("want the default %s as a code span first", f.DefValue)
	case isDuration:
		d, err := time.ParseDuration(value)
		if err != nil || d != def {
			return fmt.Errorf("%q is not the default %v", value, def)
		}
	case value != f.DefValue:
		return fmt.Errorf("%q is not the default %q", value, f.DefValue)
	}
	return nil
}

// TestProtocolDocSubcommandFlags: the subcommands' flag table names, for each of
// `tag add`, `tag list`, `tag update`, `decode`, `reveal` and `conform`, exactly the flags its --help lists;
// `schema` has none.
func TestProtocolDocSubcommandFlags(t *testing.T) {
	ctx := context.Background()
	helps := map[string]func(stderr io.Writer) error{
		"tag add":    func(w io.Writer) error { return runTag(ctx, []string{"add", "--help"}, io.Discard, w) },
		"tag list":   func(w io.Writer) error { return runTag(ctx, []string{"list", "--help"}, io.Discard, w) },
		"tag update": func(w io.Writer) error { return runTag(ctx, []string{"update", "--help"}, io.Discard, w) },
		"decode":     func(w io.Writer) error { return runDecode(ctx, []string{"--help"}, io.Discard, w) },
		"schema":     func(w io.Writer) error { return runSchema([]string{"--help"}, io.Discard, w) },
		"reveal":     func(w io.Writer) error { return runReveal(ctx, []string{"--help"}, io.Discard, w) },
		"conform":    func(w io.Writer) error { return runConform(ctx, []string{"--help"}, io.Discard, w) },
	}
	documented := map[string][]string{} // command -> flags the table gives it
	for _, row := range docTable(t, readProtocolDoc(t), subcommandFlagsHeading) {
		if len(row) != 4 {
			t.Errorf("%s: subcommand flag row %q: want 4 cells (flag, commands, default, meaning)", protocolDocPath, row)
			continue
		}
		names := cellFlags(row[0])
		if len(names) == 0 {
			t.Errorf("%s: subcommand flag row %q names no flag", protocolDocPath, row[0])
		}
		for _, cmd := range strings.Split(row[1], ",") {
			cmd = strings.TrimSpace(cmd)
			if _, ok := helps[cmd]; !ok {
				t.Errorf("%s: subcommand flag row %q: no command %q (want one of %q)", protocolDocPath, row[0], cmd, slices.Sorted(maps.Keys(helps)))
				continue
			}
			documented[cmd] = append(documented[cmd], names...)
		}
	}
	for _, cmd := range slices.Sorted(maps.Keys(helps)) {
		var help bytes.Buffer
		if err := helps[cmd](&help); !errors.Is(err, flag.ErrHelp) {
			t.Fatalf("dispenser %s --help: %v, want flag.ErrHelp", cmd, err)
		}
		listed := helpFlags(t, help.String())
		for _, name := range listed {
			if !slices.Contains(documented[cmd], name) {
				t.Errorf("dispenser %s --help lists --%s, but %s does not give it to %q under %q", cmd, name, protocolDocPath, cmd, subcommandFlagsHeading)
			}
		}
		for _, name := range documented[cmd] {
			if !slices.Contains(listed, name) {
				t.Errorf("%s gives --%s to %q, but dispenser %s --help lists no such flag", protocolDocPath, name, cmd, cmd)
			}
		}
	}
}

// TestProtocolDocEnvironment: every LEAFBUS_ variable the document names is the
// environment name of a flag of `dispenser` or of a subcommand, or LEAFBUS_ID_KEY.
func TestProtocolDocEnvironment(t *testing.T) {
	known := map[string]bool{}
	add := func(help string) {
		for _, name := range helpFlags(t, help) {
			known[envName(name)] = true
		}
	}
	var help bytes.Buffer
	runCommand(context.Background(), []string{"--help"}, io.Discard, &help)
	add(help.String())
	for _, op := range []string{"add", "list", "update"} {
		help.Reset()
		_ = runTag(context.Background(), []string{op, "--help"}, io.Discard, &help)
		add(help.String())
	}
	help.Reset()
	_ = runDecode(context.Background(), []string{"--help"}, io.Discard, &help)
	add(help.String())
	help.Reset()
	_ = runReveal(context.Background(), []string{"--help"}, io.Discard, &help)
	add(help.String())
	known[dispenser.IDKeyEnv] = true // the key itself: read from the environment only, no flag
	if len(known) < 40 {
		t.Fatalf("found %d flags in the --help outputs; has their format changed?", len(known))
	}
	for _, v := range regexp.MustCompile(`\bLEAFBUS_[A-Z0-9_]+`).FindAllString(readProtocolDoc(t), -1) {
		if !known[v] {
			t.Errorf("%s names %s, which is no flag's environment variable", protocolDocPath, v)
		}
	}
}

// docNames are the names the document uses, by kind, after writing <prefix> as the
// default prefix and every other <placeholder> in a subject as the wildcard *.
type docNames struct {
	subjects, srv, headers, words map[string]bool
}

// notSubjects are tokens that look like subjects of the default prefix but are not.
var notSubjects = map[string]string{
	"leaf.name":                 "Leaf's configuration key, the ZooKeeper path name (--zk-name)",
	"leaf.properties":           "Leaf's configuration file (--leaf-properties)",
	"leaf.segment.enable":       "Leaf's configuration key",
	"leaf.jdbc.url":             "Leaf's configuration key",
	"leaf.jdbc.username":        "Leaf's configuration key",
	"leaf.jdbc.password":        "Leaf's configuration key",
	"leaf.snowflake.enable":     "Leaf's configuration key",
	"leaf.snowflake.zk.address": "Leaf's configuration key",
	"leaf.snowflake.port":       "Leaf's configuration key",
	"leaf.snowflake.mode":       "a Leaf fork's configuration key",
}

// Subject-like tokens: dot-separated parts, each a name, a <placeholder>, * or >.
const subjectParts = `(?:[A-Za-z0-9_*-]+|<[A-Za-z -]+>|>)(?:\.(?:[A-Za-z0-9_*-]+|<[A-Za-z -]+>|>))*`

var (
	docSubject     = regexp.MustCompile(`(?:^|[^A-Za-z0-9_.$])(leaf\.` + subjectParts + `)`) // not the end of $SRV.PING.leaf.<id>
	docSRVSubject  = regexp.MustCompile(`\$SRV\.` + subjectParts)
	docHeader      = regexp.MustCompile(`\b(?:Leaf|Nats)-[A-Z][A-Za-z]*(?:-[A-Z][A-Za-z]*)*\b`)
	docWord        = regexp.MustCompile(`[A-Za-z0-9_]+`)
	docPlaceholder = regexp.MustCompile(`<[A-Za-z -]+>`)
)

func readDocNames(doc string) docNames {
	doc = strings.NewReplacer("<prefix>", wire.DefaultPrefix, "<PREFIX>", strings.ToUpper(wire.DefaultPrefix)).Replace(doc)
	n := docNames{subjects: map[string]bool{}, srv: map[string]bool{}, headers: map[string]bool{}, words: map[string]bool{}}
	norm := func(s string) string { return docPlaceholder.ReplaceAllString(s, "*") }
	for _, m := range docSubject.FindAllStringSubmatch(doc, -1) {
		if _, skip := notSubjects[m[1]]; !skip {
			n.subjects[norm(m[1])] = true
		}
	}
	for _, s := range docSRVSubject.FindAllString(doc, -1) {
		n.srv[norm(s)] = true
	}
	for _, h := range docHeader.FindAllString(doc, -1) {
		n.headers[h] = true
	}
	for _, w := range docWord.FindAllString(doc, -1) {
		n.words[w] = true
	}
	return n
}

// codeNames are the names the code uses.
type codeNames struct {
	subjects map[string]bool // with * for a tag
	srv      map[string]bool
	headers  map[string]bool
	buckets  map[string]bool
	streams  map[string]bool
	tables   map[string]bool // MySQL
}

// covers reports whether the document's subject s is one of known, or a wildcard (a
// * token, a final >) that matches one of them.
func covers(known map[string]bool, s string) bool {
	if known[s] {
		return true
	}
	for k := range known {
		if subjectMatches(s, k) {
			return true
		}
	}
	return false
}

// subjectMatches reports whether the NATS subject pattern matches subject: * matches
// one token, a final > one or more.
func subjectMatches(pattern, subject string) bool {
	p, t := strings.Split(pattern, "."), strings.Split(subject, ".")
	for i, tok := range p {
		switch {
		case tok == ">" && i == len(p)-1:
			return len(t) > i
		case i >= len(t) || tok != "*" && tok != t[i]:
			return false
		}
	}
	return len(p) == len(t)
}

// TestProtocolDocNames starts a dispenser (KV store, KV registry, a pool, so that it
// creates every bucket and the pool stream), then compares the names the document uses
// with the names the code uses: the subjects its service lists in $SRV.INFO and those
// package wire builds, the headers of wire (and monotonic's Leaf-Tag, and the JetStream
// headers a pool feeder sends), the buckets and streams the dispenser created, and the
// MySQL tables of `dispenser schema`.
func TestProtocolDocNames(t *testing.T) {
	code := liveCodeNames(t)
	doc := readDocNames(readProtocolDoc(t))

	for s := range doc.subjects {
		if !covers(code.subjects, s) {
			t.Errorf("%s names subject %s, which the code does not use (it uses %q)", protocolDocPath, s, slices.Sorted(maps.Keys(code.subjects)))
		}
	}
	for s := range doc.srv {
		if !covers(code.srv, s) {
			t.Errorf("%s names %s, which the service does not answer (it answers %q)", protocolDocPath, s, slices.Sorted(maps.Keys(code.srv)))
		}
	}
	for h := range doc.headers {
		if !code.headers[h] {
			t.Errorf("%s names header %s, which the code does not use (it uses %q)", protocolDocPath, h, slices.Sorted(maps.Keys(code.headers)))
		}
	}
	// Buckets and tables start with the prefix and _ (a bucket's own stream with KV_
	// before that), streams with the prefix in upper case and _.
	bucketPrefix, streamPrefix := wire.DefaultPrefix+"_", strings.ToUpper(wire.DefaultPrefix)+"_"
	for w := range doc.words {
		name := strings.TrimPrefix(w, "KV_")
		switch {
		case strings.HasPrefix(name, bucketPrefix) && !code.buckets[name] && !code.tables[name]:
			t.Errorf("%s names %s, which is neither a KV bucket the dispenser created (%q) nor a MySQL table of dispenser schema (%q)",
				protocolDocPath, w, slices.Sorted(maps.Keys(code.buckets)), slices.Sorted(maps.Keys(code.tables)))
		case strings.HasPrefix(w, streamPrefix) && !code.streams[w]:
			t.Errorf("%s names stream %s, which the dispenser did not create (it created %q)", protocolDocPath, w, slices.Sorted(maps.Keys(code.streams)))
		}
	}

	for s := range code.subjects {
		if !doc.subjects[s] {
			t.Errorf("the code uses subject %s, but %s does not name it", s, protocolDocPath)
		}
	}
	for _, verb := range []micro.Verb{micro.PingVerb, micro.InfoVerb, micro.StatsVerb} {
		s, err := micro.ControlSubject(verb, wire.DefaultPrefix, "")
		if err != nil {
			t.Fatal(err)
		}
		if !doc.srv[s] {
			t.Errorf("the service answers %s, but %s does not name it", s, protocolDocPath)
		}
	}
	for h := range code.headers {
		if !doc.headers[h] {
			t.Errorf("the code uses header %s, but %s does not name it", h, protocolDocPath)
		}
	}
	for _, set := range []map[string]bool{code.buckets, code.streams, code.tables} {
		for name := range set {
			if !doc.words[name] {
				t.Errorf("the dispenser uses %s, but %s does not name it", name, protocolDocPath)
			}
		}
	}
}

// liveCodeNames runs a dispenser with the defaults (KV store, KV registry) and a pool,
// and collects the names it uses.
func liveCodeNames(t *testing.T) codeNames {
	t.Helper()
	subj := wire.Subjects{Prefix: wire.DefaultPrefix}
	d := startDispenser(t, func(c *testConfig) {
		c.Prefix = subj.Prefix
		c.Pools = pools.Specs{{Kind: wire.Segment, Tag: dispenser.SampleTagName, Size: 10, Depth: 1}}
	})
	nc := d.connect(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx := testutil.Context(t, 30*time.Second)

	code := codeNames{
		subjects: map[string]bool{subj.Time(): true},
		srv:      map[string]bool{},
		headers: map[string]bool{
			wire.EncodingHeader: true, wire.NodeIDHeader: true,
			wire.ServiceErrorCodeHeader: true, wire.ServiceErrorHeader: true,
			wire.TagHeader: true,
			// What a pool feeder sends with each batch (PROTOCOL.md "Feeding a pool").
			jetstream.MsgIDHeader: true, jetstream.ExpectedStreamHeader: true, jetstream.ExpectedLastSeqHeader: true,
		},
		buckets: map[string]bool{},
		streams: map[string]bool{},
		tables:  map[string]bool{},
	}
	for _, kind := range []wire.Kind{wire.Segment, wire.Snowflake} {
		// The pool subjects with a wildcard for the tag's token (Pool would encode "*").
		code.subjects[strings.TrimSuffix(subj.Pool(kind, "x"), "x")+"*"] = true
	}

	// The service's endpoints, as it lists them.
	info, err := nc.RequestWithContext(ctx, mustControlSubject(t, micro.InfoVerb, subj.Service(), ""), nil)
	if err != nil {
		t.Fatalf("$SRV.INFO: %v", err)
	}
	var mi micro.Info
	if err := json.Unmarshal(info.Data, &mi); err != nil {
		t.Fatalf("$SRV.INFO answer %q: %v", info.Data, err)
	}
	if len(mi.Endpoints) == 0 {
		t.Fatalf("$SRV.INFO lists no endpoints: %s", info.Data)
	}
	for _, e := range mi.Endpoints {
		code.subjects[e.Subject] = true
	}
	for _, verb := range []micro.Verb{micro.PingVerb, micro.InfoVerb, micro.StatsVerb} {
		for _, scope := range [][2]string{{"", ""}, {subj.Service(), ""}, {subj.Service(), "*"}} {
			code.srv[mustControlSubject(t, verb, scope[0], scope[1])] = true
		}
	}

	// The buckets and streams it created: the pool stream appears once Run set it up.
	testutil.Eventually(t, 20*time.Second, "the pool stream "+subj.PoolStream(), func() bool {
		_, err := js.Stream(ctx, subj.PoolStream())
		return err == nil
	})
	names := js.ListStreams(ctx)
	for st := range names.Info() {
		if bucket, ok := strings.CutPrefix(st.Config.Name, "KV_"); ok {
			code.buckets[bucket] = true
			continue
		}
		code.streams[st.Config.Name] = true
		for _, s := range st.Config.Subjects {
			code.subjects[s] = true
		}
	}
	if err := names.Err(); err != nil {
		t.Fatalf("list streams: %v", err)
	}
	if len(code.buckets) < 6 {
		t.Fatalf("the dispenser created the buckets %q; want at least its six", slices.Sorted(maps.Keys(code.buckets)))
	}

	for _, ddl := range []string{segment.MySQLSchema, workerid.MySQLRegistrySchema} {
		m := regexp.MustCompile("(?i)CREATE TABLE (?:IF NOT EXISTS )?`?([A-Za-z0-9_]+)").FindStringSubmatch(ddl)
		if m == nil {
			t.Fatalf("no CREATE TABLE in %q", ddl)
		}
		code.tables[m[1]] = true
	}
	return code
}

func mustControlSubject(tb testing.TB, verb micro.Verb, name, id string) string {
	tb.Helper()
	s, err := micro.ControlSubject(verb, name, id)
	if err != nil {
		tb.Fatal(err)
	}
	return s
}
