package main

import (
	"fmt"
	"io"
	"net/http"
	neturl "net/url"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/leafbus/leafbus/internal/testutil"
	"github.com/leafbus/leafbus/opaque"
	"github.com/leafbus/leafbus/testenv"
	"github.com/leafbus/leafbus/wire"
)

// TestMySQLTagSpellings: on Leaf's usual table (biz_tag utf8mb4_general_ci, which folds
// case, accents, İ/ı and trailing spaces), a tag is served only by its stored bytes.
// Every other spelling of an opaque tag, a narrow (20-bit) tag, a monotonic tag and a
// row inserted by plain SQL as "Plain", asked over NATS (the tag's subject token) and
// over Leaf's HTTP API (URL-escaped), is answered 400 by both faces with one message
// naming the stored tag, and gets no ID; admin updates through another spelling are
// refused and change nothing; the real tags keep serving with no ID twice, the opaque
// one through its permutation, the narrow one within 20 bits, the monotonic one in
// order. Before, "tİny" was served the opaque tag's raw counter.
func TestMySQLTagSpellings(t *testing.T) {
	dsn := testenv.MariaDB(t).NewDatabase(t)
	db := leafDB(t, dsn, nil)
	ctx := testutil.Context(t, time.Minute)
	for _, stmt := range []string{
		"ALTER TABLE leaf_alloc MODIFY biz_tag varchar(128) CHARACTER SET utf8mb4 COLLATE utf8mb4_general_ci NOT NULL DEFAULT ''",
		"INSERT INTO leaf_alloc (biz_tag, max_id, step) VALUES ('Plain', 1, 100)",
	} {
		if _, err := db.ExecContext(ctx, stmt); err != nil {
			t.Fatal(err)
		}
	}
	keyFile := writeKeyFile(t, deploymentKey)
	d := startDispenser(t, func(c *testConfig) {
		c.Pools = nil
		c.SegmentStore, c.MySQLDSN, c.MySQLCreateTable = "mysql", dsn, true
		c.IDKeyFile = keyFile
	})
	admin := d.client(t)
	step, on, bits := int64(100), true, 20
	for _, r := range []wire.AddTagRequest{
		{Tag: "tiny", Step: &step, Opaque: &on},
		{Tag: "narrow", Step: &step, Bits: &bits},
		{Tag: "mono", Step: &step, Monotonic: &on},
	} {
		if _, err := admin.AddTag(ctx, r); err != nil {
			t.Fatalf("add %s: %v", r.Tag, err)
		}
	}
	perm, err := opaque.New(deploymentKey, "tiny", wire.MaxTagBits)
	if err != nil {
		t.Fatal(err)
	}

	seen := map[string]map[int64]bool{} // by tag: tags share ID values, a tag never twice
	last := map[string]int64{}
	serve := func(tag string) {
		t.Helper()
		ids, err := admin.SegmentN(ctx, tag, 7)
		if err != nil {
			t.Fatalf("SegmentN(%s): %v", tag, err)
		}
		if seen[tag] == nil {
			seen[tag] = map[int64]bool{}
		}
		for _, id := range ids {
			if seen[tag][id] {
				t.Fatalf("%s's ID %d served twice", tag, id)
			}
			seen[tag][id] = true
			switch tag {
			case "tiny":
				if n, err := perm.Reveal(id); err != nil || n < 1 || n > 1000 {
					t.Fatalf("tiny's ID %d reveals %d, %v; want one of its numbers", id, n, err)
				}
			case "narrow":
				if id >= 1<<20 {
					t.Fatalf("narrow's ID %d is past 20 bits", id)
				}
			case "mono":
				if id <= last[tag] {
					t.Fatalf("mono's ID %d after %d", id, last[tag])
				}
				last[tag] = id
			}
		}
	}
	stored := []string{"tiny", "narrow", "mono", "Plain"}
	for _, tag := range stored {
		serve(tag)
	}

	nc := d.connect(t)
	subjects := wire.Subjects{Prefix: "leaf"}
	base := "http://" + d.HTTPAddr().String() + "/api/segment/get/"
	spellings := map[string][]string{
		"tiny":   {"tİny", "tıny", "TİNY", "Tiny", "TINY", "tíny", "tiny ", "tiny  "},
		"narrow": {"NARROW", "nárrow", "narrow "},
		"mono":   {"Mono", "mönö", "mono "},
		"Plain":  {"plain", "PLAIN", "Plain "},
	}
	for _, tag := range stored {
		for _, spelling := range spellings[tag] {
			msg, err := nc.Request(subjects.IDs(wire.Segment, spelling), []byte("5"), 10*time.Second)
			if err != nil {
				t.Fatalf("NATS %q: %v", spelling, err)
			}
			code, reason := msg.Header.Get(wire.ServiceErrorCodeHeader), msg.Header.Get(wire.ServiceErrorHeader)
			if want := fmt.Sprintf("ask for %s", wire.Quote(tag)); code != "400" || !strings.Contains(reason, want) || len(msg.Data) != 0 {
				t.Errorf("NATS %q (token %s): %s %q, body %q; want 400 saying %s", spelling, wire.TagToken(spelling), code, reason, msg.Data, want)
			}
			url := base + neturl.PathEscape(spelling) + "/"
			resp, err := http.Get(url)
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 400 || strings.TrimSpace(string(body)) != reason {
				t.Errorf("GET %s: %d %q; want 400 with NATS's reason %q", url, resp.StatusCode, body, reason)
			}
		}
	}

	// Admin calls through another spelling change nothing.
	newStep, wider, off := int64(5), 40, false
	for _, r := range []wire.UpdateTagRequest{
		{Tag: "TİNY", Step: &newStep},
		{Tag: "tİny", Opaque: &off},
		{Tag: "NARROW", Bits: &wider},
		{Tag: "Mono", Monotonic: &off},
		{Tag: "plain", Monotonic: &on},
	} {
		if _, err := admin.UpdateTag(ctx, r); err == nil || !strings.Contains(err.Error(), "400") {
			t.Errorf("update %+v: %v, want a 400", r, err)
		}
	}
	// So do adds of another spelling: the name is taken, by the stored tag.
	for _, r := range []wire.AddTagRequest{
		{Tag: "TİNY", Step: &step, Opaque: &on},
		{Tag: "tıny", Step: &step},
		{Tag: "Narrow", Step: &step, Bits: &bits},
		{Tag: "mono ", Step: &step, Monotonic: &on},
	} {
		stored := map[byte]string{'T': "tiny", 't': "tiny", 'N': "narrow", 'm': "mono"}[r.Tag[0]]
		if _, err := admin.AddTag(ctx, r); err == nil || !strings.Contains(err.Error(), wire.Quote(stored)) {
			t.Errorf("add %q: %v, want a refusal naming %q", r.Tag, err, stored)
		}
	}
	tags, err := admin.Tags(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, info := range tags {
		names = append(names, info.Tag)
		want := map[string][2]any{"tiny": {true, 63}, "narrow": {false, 20}, "mono": {false, 63}, "Plain": {false, 63}}[info.Tag]
		if info.Step != 100 || want != [2]any{} && (info.Opaque != want[0] || info.Bits != want[1]) ||
			info.Monotonic != (info.Tag == "mono") {
			t.Errorf("after the refused updates: %+v", info)
		}
	}
	if slices.Contains(names, "tİny") || len(names) != 4 {
		t.Errorf("tags %v: want the four", names)
	}
	for _, tag := range stored {
		serve(tag)
	}
}
