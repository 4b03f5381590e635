package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
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
	cfg := testConfig(n)
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

	cfg := testConfig(n)
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

// TestEchoChildKeepsSecretsOffTheCommandLine: the password and token reach the child
// through its environment only.
func TestEchoChildKeepsSecretsOffTheCommandLine(t *testing.T) {
	cfg := defaultConfig()
	cfg.Conn.User, cfg.Conn.Password = "u", "hunter2"
	args := strings.Join(echoChildArgs(cfg, "_bench.echo.x", 1), " ")
	if strings.Contains(args, "hunter2") || !strings.Contains(args, "--user u") {
		t.Fatalf("child args %q: want --user and no password", args)
	}
	env := strings.Join(echoChildEnv(cfg), "\n")
	if !strings.Contains(env, envEchoPassword+"=hunter2") {
		t.Fatalf("child env lacks %s", envEchoPassword)
	}
}
