package buildinfo

import (
	"os/exec"
	"strings"
	"testing"
)

// TestMakeRelease checks `make release` without building it (make test must not build
// eight binaries): make -n names the four platforms, both commands, a static build
// with trimmed paths and the checksums; and a small program built with the target's
// linker flags prints the revision git reports, so a renamed variable in this package
// cannot silently leave release binaries without one.
func TestMakeRelease(t *testing.T) {
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("no make")
	}
	out, err := exec.Command("make", "-C", "../..", "-n", "--no-print-directory", "release").CombinedOutput()
	if err != nil {
		t.Fatalf("make -n release: %v\n%s", err, out)
	}
	plan := string(out)
	for _, want := range []string{"linux/amd64", "linux/arm64", "darwin/amd64", "darwin/arm64",
		"for c in dispenser bench", "./cmd/$c", "CGO_ENABLED=0", "-trimpath", "-o dist/$c-$os-$arch", "sha256sum", "> SHA256SUMS"} {
		if !strings.Contains(plan, want) {
			t.Errorf("make -n release does not say %q:\n%s", want, plan)
		}
	}

	flags, err := exec.Command("make", "-C", "../..", "-s", "--no-print-directory", "release-ldflags").Output()
	if err != nil {
		t.Fatalf("make release-ldflags: %v", err)
	}
	rev, err := exec.Command("git", "rev-parse", "HEAD").Output()
	if err != nil {
		t.Skipf("no git revision here (%v): the linker flags carry none to check", err)
	}
	got, err := exec.Command("go", "run", "-ldflags", strings.TrimSpace(string(flags)), "./testdata/printversion").CombinedOutput()
	if err != nil {
		t.Fatalf("go run -ldflags %s: %v\n%s", flags, err, got)
	}
	if want := "(rev " + strings.TrimSpace(string(rev))[:revisionLen]; !strings.Contains(string(got), want) {
		t.Errorf("built with make release's linker flags %s, the program prints %q, want %q in it", flags, got, want)
	}
}
