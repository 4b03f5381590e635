package main

import (
	"bytes"
	"context"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/leafbus/leafbus/wire"
)

// TestConformBinary: `dispenser conform` against the real binary passes every rule,
// one PASS line each after the scratch tag's name, and exits 0.
func TestConformBinary(t *testing.T) {
	p := startBinary(t, t.TempDir(), "--http", "")
	bin, err := buildDispenser()
	if err != nil {
		t.Fatal(err)
	}
	var stdout, stderr bytes.Buffer
	cmd := exec.Command(bin, "conform", "--nats", p.url, "--timeout", "10s")
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("dispenser conform: %v\nstdout:\n%s\nstderr:\n%s", err, stdout.String(), stderr.String())
	}
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	if len(lines) != 1+len(conformRules) || !strings.HasPrefix(lines[0], "scratch tag conform-") {
		t.Fatalf("want the scratch tag and %d rule lines, got:\n%s", len(conformRules), stdout.String())
	}
	for i, r := range conformRules {
		if want := "PASS " + r.name; lines[1+i] != want {
			t.Errorf("line %d = %q, want %q", 1+i, lines[1+i], want)
		}
	}
}

// conformFault breaks one kind of answer of the proxy: subject is what the client
// asked, reply the answer about to go back (changed in place).
type conformFault func(subject string, reply *nats.Msg)

// conformProxy answers the protocol's subjects of prefix "leaf" by asking a dispenser
// of prefix "real" and handing its answers back, through fault: a proxy, or another
// implementation, that is correct but for the fault.
type conformProxy struct {
	nc    *nats.Conn
	pub   wire.Subjects // what it serves
	real  wire.Subjects // where it asks
	fault conformFault
}

func startConformProxy(t *testing.T, url string, fault conformFault) {
	t.Helper()
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	p := &conformProxy{nc: nc, pub: wire.Subjects{Prefix: "leaf"}, real: wire.Subjects{Prefix: "real"}, fault: fault}
	for _, s := range []string{p.pub.IDsWildcard(wire.Segment), p.pub.IDsWildcard(wire.Snowflake), p.pub.Decode(), p.pub.AdminTags("*")} {
		if _, err := nc.QueueSubscribe(s, p.pub.QueueGroup(), p.forward); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := nc.Subscribe("$SRV.>", p.forward); err != nil {
		t.Fatal(err)
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
}

func (p *conformProxy) forward(m *nats.Msg) {
	if !p.pub.ReplyAllowed(m.Reply) {
		return
	}
	to := p.real.Prefix + strings.TrimPrefix(m.Subject, p.pub.Prefix)
	srv := strings.HasPrefix(m.Subject, "$SRV.")
	if srv {
		tok := strings.Split(m.Subject, ".")
		if len(tok) > 2 && tok[2] != p.pub.Service() {
			return // another service's, or the proxy's own question to the real one
		}
		to = strings.Join(append(tok[:2:2], append([]string{p.real.Service()}, tok[min(3, len(tok)):]...)...), ".")
	}
	out := nats.NewMsg(to)
	out.Header, out.Data = m.Header, m.Data
	ans, err := p.nc.RequestMsg(out, 10*time.Second)
	if err != nil {
		return
	}
	reply := nats.NewMsg(m.Reply)
	reply.Header, reply.Data = ans.Header, ans.Data
	if srv {
		reply.Data = bytes.ReplaceAll(reply.Data, []byte(`"`+p.real.Prefix), []byte(`"`+p.pub.Prefix))
	}
	if p.fault != nil {
		p.fault(m.Subject, reply)
	}
	_ = p.nc.PublishMsg(reply)
}

// TestConformBrokenResponder: conform through a faithful proxy passes every rule; each
// fault of the proxy fails the rule it breaks, and `dispenser conform` exits 1.
func TestConformBrokenResponder(t *testing.T) {
	d := startDispenser(t, func(c *testConfig) {
		c.Prefix = "real"
		c.HTTP = ""
	})
	isIDs := func(subject string) bool {
		return strings.HasPrefix(subject, "leaf.segment.") || strings.HasPrefix(subject, "leaf.snowflake.")
	}
	tests := []struct {
		name  string
		fault conformFault
		fails string // a rule that must fail; "" for none
	}{
		{"Faithful", nil, ""},
		{"BatchOutOfOrder", func(subject string, r *nats.Msg) {
			if isIDs(subject) && r.Header.Get(wire.ServiceErrorCodeHeader) == "" && bytes.Contains(r.Data, []byte("\n")) {
				lines := bytes.Split(r.Data, []byte("\n"))
				slices.Reverse(lines)
				r.Data = bytes.Join(lines, []byte("\n"))
			}
		}, "reply-order"},
		{"WrongErrorCode", func(_ string, r *nats.Msg) {
			if r.Header.Get(wire.ServiceErrorCodeHeader) == "404" {
				r.Header.Set(wire.ServiceErrorCodeHeader, "503")
			}
		}, "segment-not-found"},
		{"NoErrorReason", func(_ string, r *nats.Msg) { r.Header.Del(wire.ServiceErrorHeader) }, "error-headers"},
		{"WrongQueueGroupInInfo", func(subject string, r *nats.Msg) {
			if strings.HasPrefix(subject, "$SRV.INFO") {
				r.Data = bytes.ReplaceAll(r.Data, []byte(`"queue_group":"leaf"`), []byte(`"queue_group":"other"`))
			}
		}, "srv-info"},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			// One proxy at a time on the dispenser's server: the last one's connection
			// closed at the end of its subtest.
			nc := d.connect(t)
			startConformProxy(t, d.ClientURL(), tt.fault)
			var out bytes.Buffer
			if i == 1 {
				// Once through the command itself: the exit code.
				var stderr bytes.Buffer
				code := runCommand(context.Background(), []string{"conform", "--nats", d.ClientURL(), "--timeout", "10s"}, &out, &stderr)
				if code != 1 || !strings.Contains(stderr.String(), "rules failed") {
					t.Errorf("dispenser conform exited %d, stderr %q; want 1 saying how many rules failed", code, stderr.String())
				}
			} else {
				c := &conformer{nc: nc, subj: wire.Subjects{Prefix: "leaf"}, tag: "conform-" + strings.ToLower(tt.name), timeout: 10 * time.Second, quiet: 100 * time.Millisecond}
				c.run(context.Background(), &out)
			}
			fails := regexpFails.FindAllStringSubmatch(out.String(), -1)
			var failed []string
			for _, m := range fails {
				failed = append(failed, m[1])
			}
			switch {
			case tt.fails == "" && len(failed) > 0:
				t.Errorf("through a faithful proxy, rules failed:\n%s", out.String())
			case tt.fails != "" && !slices.Contains(failed, tt.fails):
				t.Errorf("fault %s: want FAIL %s, got:\n%s", tt.name, tt.fails, out.String())
			}
		})
	}
}

// regexpFails finds the rules a conform output fails.
var regexpFails = regexp.MustCompile(`(?m)^FAIL ([a-z0-9-]+): `)
