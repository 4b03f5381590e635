package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/leafbus/leafbus/wire"
)

// The Java stack a Leaf client runs on, from Debian's packages (make deps installs them):
// Spring Web 4.3 (RestTemplate) and its dependencies, Jackson 2, a JDK.
var javaJars = []string{
	"/usr/share/java/spring3-web.jar",
	"/usr/share/java/spring3-core.jar",
	"/usr/share/java/spring3-beans.jar",
	"/usr/share/java/commons-logging.jar",
	"/usr/share/java/jackson-databind.jar",
	"/usr/share/java/jackson-core.jar",
	"/usr/share/java/jackson-annotations.jar",
}

// javaClasspath checks that javac, java and the jars are there and returns the class
// path; anything missing fails the test, naming make deps.
func javaClasspath(t *testing.T) string {
	t.Helper()
	var missing []string
	for _, tool := range []string{"javac", "java"} {
		if _, err := exec.LookPath(tool); err != nil {
			missing = append(missing, tool)
		}
	}
	for _, jar := range javaJars {
		if _, err := os.Stat(jar); err != nil {
			missing = append(missing, jar)
		}
	}
	if len(missing) > 0 {
		t.Fatalf("the Java client test needs %s: run make deps (it installs default-jdk-headless, libspring-web-java and libjackson2-databind-java)", strings.Join(missing, ", "))
	}
	return strings.Join(javaJars, string(os.PathListSeparator))
}

// TestJavaLeafClient plays a Leaf client's calls with the real Java stack against the
// real dispenser binary started from a Leaf leaf.properties, on rows inserted by plain
// SQL (testdata/java/LeafClientCalls.java lists the calls: getForObject with String and
// Long, POST, dotted, colon, space and Chinese tags, snowflake keys, decodeSnowflakeId
// with good and bad IDs, /cache and /db). Then the same tags over NATS, through the Go
// client and through the raw subject encoding.
func TestJavaLeafClient(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary and runs a JVM")
	}
	cp := javaClasspath(t)
	classes := t.TempDir()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	if out, err := exec.CommandContext(ctx, "javac", "-encoding", "UTF-8", "-d", classes, "-cp", cp,
		filepath.Join("testdata", "java", "LeafClientCalls.java")).CombinedOutput(); err != nil {
		t.Fatalf("javac: %v\n%s", err, out)
	}

	shop := newLeafShop(t)
	b := startBinary(t, t.TempDir(), "--leaf-properties", shop.props, "--sample-tag=false")
	base := fmt.Sprintf("http://127.0.0.1:%d", shop.httpPort)
	java := exec.CommandContext(ctx, "java", "-cp", classes+string(os.PathListSeparator)+cp, "LeafClientCalls",
		base, strconv.FormatInt(shop.workerID, 10))
	out, err := java.CombinedOutput()
	t.Logf("java LeafClientCalls:\n%s", out)
	if err != nil || strings.Contains(string(out), "FAIL ") || !strings.Contains(string(out), "ok DB") {
		t.Fatalf("the Java client's calls failed (%v): see the output above", err)
	}

	// The same tags over NATS: the Go client names them as they are, the raw subject
	// carries them encoded. Each tag has served three IDs over HTTP (leafRows' max_id
	// and the two after); leaf-segment-test five.
	nc, c := b.connect(t)
	for _, r := range leafRows {
		served := int64(3)
		if r.tag == "leaf-segment-test" {
			served = 5
		}
		ids, err := c.SegmentN(ctx, r.tag, 2)
		if err != nil || len(ids) != 2 || ids[0] != r.maxID+served {
			t.Errorf("client.SegmentN(%q, 2) = %v, %v; want it to start at %d", r.tag, ids, err, r.maxID+served)
		}
		subject := wire.Subjects{Prefix: "leaf"}.IDs(wire.Segment, r.tag)
		m, err := nc.Request(subject, nil, 10*time.Second)
		if err != nil || string(m.Data) != strconv.FormatInt(r.maxID+served+2, 10) {
			t.Errorf("nats req %s: %v, %v; want %d", subject, m, err, r.maxID+served+2)
		}
	}
}
