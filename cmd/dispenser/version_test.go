package main

import (
	"bytes"
	"context"
	"os/exec"
	"testing"

	"github.com/leafbus/leafbus/internal/buildinfo"
)

// TestVersionCommand: `dispenser version` and `dispenser --version` print
// internal/buildinfo's line and exit 0, in the process and from the built binary; an
// argument after it is a usage error.
func TestVersionCommand(t *testing.T) {
	want := buildinfo.Read().String() + "\n"
	for _, args := range [][]string{{"version"}, {"--version"}, {"-version"}} {
		var out, errOut bytes.Buffer
		if code := runCommand(context.Background(), args, &out, &errOut); code != 0 || out.String() != want {
			t.Errorf("dispenser %q: exit %d, stdout %q, stderr %q; want 0 and %q", args, code, out.String(), errOut.String(), want)
		}
	}
	var out, errOut bytes.Buffer
	if code := runCommand(context.Background(), []string{"version", "extra"}, &out, &errOut); code != 2 || out.Len() != 0 {
		t.Errorf("dispenser version extra: exit %d, stdout %q; want 2 and nothing printed", code, out.String())
	}

	bin, err := buildDispenser()
	if err != nil {
		t.Fatal(err)
	}
	a, errA := exec.Command(bin, "version").Output()
	b, errB := exec.Command(bin, "--version").Output()
	if errA != nil || errB != nil || !bytes.HasPrefix(a, []byte("leafbus ")) || !bytes.Equal(a, b) {
		t.Errorf("binary: version %q (%v), --version %q (%v): want the same leafbus line", a, errA, b, errB)
	}
}
