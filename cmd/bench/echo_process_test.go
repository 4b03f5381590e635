package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/leafbus/leafbus/testenv"
)

// TestRunEchoProcessBaseline runs both baselines in one run: the echo in this process,
// then the echo in a `bench echo` child (this test binary), each loaded like the
// dispenser, each with its own ratios.
func TestRunEchoProcessBaseline(t *testing.T) {
	t.Setenv(envRunAsCommand, "1") // inherited by the child only: TestMain has run here
	n := testenv.StartNATS(t)
	startFake(t, n, faults{})
	cfg := testConfig(n.URL())
	cfg.Baseline, cfg.Batch, cfg.exe = "echo,echo-process", 10, os.Args[0]
	rep := runBounded(t, cfg)
	for _, b := range []*BaselineReport{rep.Baseline, rep.BaselineProcess} {
		if b == nil || b.Error != "" || b.Echo == nil {
			t.Fatalf("baseline = %+v, want an echo run", b)
		}
		if b.Echo.OK != cfg.Requests || len(b.Echo.Errors) != 0 || b.Echo.IDs != 10*cfg.Requests {
			t.Errorf("echo (%s) ok %d ids %d errors %v, want %d good replies", b.Where, b.Echo.OK, b.Echo.IDs, b.Echo.Errors, cfg.Requests)
		}
		if len(b.Ratios) < 7 || b.Ratios[0].Ratio == nil {
			t.Errorf("echo (%s) ratios = %+v, want 7 rows", b.Where, b.Ratios)
		}
	}
	if rep.Baseline.Where != "in-process" || rep.BaselineProcess.Where != "own process" {
		t.Errorf("where = %q, %q; want in-process, own process", rep.Baseline.Where, rep.BaselineProcess.Where)
	}
	// Where is what was asked for; the CPU of a process watched is what ran: only the
	// echo-process phase had a `bench echo` child to watch.
	if runtime.GOOS == "linux" {
		if _, ok := rep.BaselineProcess.Echo.CPU[cpuEcho]; !ok {
			t.Errorf("the echo-process phase watched no echo process: CPU %v", rep.BaselineProcess.Echo.CPU)
		}
		if _, ok := rep.Baseline.Echo.CPU[cpuEcho]; ok {
			t.Errorf("the in-process phase watched an echo process: CPU %v", rep.Baseline.Echo.CPU)
		}
	}
	var text bytes.Buffer
	if err := rep.WriteText(&text); err != nil || !strings.Contains(text.String(), "dispenser/echo-process") {
		t.Errorf("text report (err %v) lacks the echo-process column:\n%s", err, text.String())
	}
}

// TestEchoAt: a `bench echo` started by hand (here echoMain on a goroutine) serves the
// baseline named with --echo-at, and stops on its context.
func TestEchoAt(t *testing.T) {
	n := testenv.StartNATS(t)
	startFake(t, n, faults{})
	ctx, cancel := context.WithCancel(context.Background())
	stdout, readyW := io.Pipe()
	done := make(chan int, 1)
	args := []string{"--nats", n.URL(), "--subject", "_bench.echo.byhand", "--batch", "3", "--responders", "2"}
	go func() { done <- echoMain(ctx, args, strings.NewReader(""), readyW, io.Discard) }()
	line := make([]byte, len("ready _bench.echo.byhand\n"))
	if _, err := io.ReadFull(stdout, line); err != nil || string(line) != "ready _bench.echo.byhand\n" {
		t.Fatalf("bench echo printed %q, %v; want its ready line", line, err)
	}
	go io.Copy(io.Discard, stdout)

	cfg := testConfig(n.URL())
	cfg.Baseline, cfg.EchoAt, cfg.Batch = "echo-process", "_bench.echo.byhand", 3
	rep := runBounded(t, cfg)
	if b := rep.BaselineProcess; b == nil || b.Echo == nil || b.Echo.OK != cfg.Requests {
		t.Fatalf("baseline at a hand-started echo = %+v, want %d good replies", b, cfg.Requests)
	}
	cancel()
	select {
	case code := <-done:
		if code != exitOK {
			t.Fatalf("bench echo exit = %d, want 0", code)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("bench echo did not stop within 10s of its context")
	}
}

func TestParseEchoFlags(t *testing.T) {
	tests := []struct {
		name    string
		args    []string
		check   func(ec echoConfig) bool
		wantErr bool
	}{
		{"Defaults", nil, func(ec echoConfig) bool {
			return ec.Responders == 1 && strings.HasPrefix(ec.Subject, "_bench.echo.") && !ec.UntilEOF
		}, false},
		{"Shape", []string{"--batch", "100", "--encoding", "binary", "--subject", "a.b", "--until-stdin-eof"}, func(ec echoConfig) bool {
			return ec.Batch == 100 && ec.Encoding.String() == "binary" && ec.Subject == "a.b" && ec.UntilEOF
		}, false},
		{"ErrWildcardSubject", []string{"--subject", "a.*"}, nil, true},
		{"ErrEmptyToken", []string{"--subject", "a..b"}, nil, true},
		{"ErrResponders", []string{"--responders", "0"}, nil, true},
		{"ErrKind", []string{"--kind", "uuid"}, nil, true},
		{"ErrPositional", []string{"extra"}, nil, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ec, err := parseEchoFlags(tt.args, io.Discard)
			if tt.wantErr {
				if !errors.Is(err, ErrInvalidConfig) {
					t.Fatalf("parseEchoFlags(%v) error = %v, want ErrInvalidConfig", tt.args, err)
				}
				return
			}
			if err != nil || !tt.check(ec) {
				t.Fatalf("parseEchoFlags(%v) = %+v, %v", tt.args, ec, err)
			}
		})
	}
}

// TestEchoChildKeepsSecretsOffTheCommandLine: the password, the token and the server
// URLs (which may carry either) reach the child through its environment only, and the
// child reads them back from there.
func TestEchoChildKeepsSecretsOffTheCommandLine(t *testing.T) {
	cfg := defaultConfig()
	cfg.Conn.User, cfg.Conn.Password = "u", "hunter2"
	cfg.Conn.URLs = "nats://u:url-pw@127.0.0.1:4222,nats://url-token@127.0.0.1:4223"
	args := echoChildArgs(cfg, "_bench.echo.x", 1)
	joined := strings.Join(args, " ")
	for _, secret := range []string{"hunter2", "url-pw", "url-token"} {
		if strings.Contains(joined, secret) {
			t.Fatalf("child args %q carry %q", joined, secret)
		}
	}
	if !strings.Contains(joined, "--user u") {
		t.Fatalf("child args %q: want --user", joined)
	}
	env := echoChildEnv(cfg)
	for _, kv := range []string{envEchoPassword + "=hunter2", envEchoNATS + "=" + cfg.Conn.URLs} {
		if !slices.Contains(env, kv) {
			t.Fatalf("child env lacks %s", kv)
		}
	}
	tok := cfg
	tok.Conn.User, tok.Conn.Password, tok.Conn.Token = "", "", "tok-secret"
	if a := strings.Join(echoChildArgs(tok, "_bench.echo.x", 1), " "); strings.Contains(a, "tok-secret") {
		t.Fatalf("child args %q carry the token", a)
	}
	if !slices.Contains(echoChildEnv(tok), envEchoToken+"=tok-secret") {
		t.Fatalf("child env lacks %s", envEchoToken)
	}
	t.Setenv(envEchoNATS, cfg.Conn.URLs)
	t.Setenv(envEchoPassword, "hunter2")
	ec, err := parseEchoFlags(args[1:], io.Discard)
	if err != nil || ec.Conn.URLs != cfg.Conn.URLs || ec.Conn.Password != "hunter2" {
		t.Fatalf("the child parses %v into URLs %q password %q, %v; want the parent's", args[1:], ec.Conn.URLs, ec.Conn.Password, err)
	}
}
