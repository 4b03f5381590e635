package buildinfo

import (
	"os"
	"os/exec"
	"regexp"
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

// TestImageStampedAsRelease: the Dockerfile stamps both binaries through the same
// variables as make release (the image's build context holds no .git, so the toolchain
// cannot), from build arguments that make image passes from git; and a program built with
// the Dockerfile's flags, the arguments filled in, prints them.
func TestImageStampedAsRelease(t *testing.T) {
	if _, err := exec.LookPath("make"); err != nil {
		t.Skip("no make")
	}
	b, err := os.ReadFile("../../Dockerfile")
	if err != nil {
		t.Fatal(err)
	}
	dockerfile := string(b)
	for _, arg := range []string{"ARG VERSION=", "ARG REVISION="} {
		if !strings.Contains(dockerfile, arg) {
			t.Errorf("the Dockerfile declares no %s", arg)
		}
	}
	// The flags are set once (ENV LDFLAGS) and every binary is built with them.
	def := regexp.MustCompile(`(?m)^ENV LDFLAGS="([^"]*)"$`).FindStringSubmatch(dockerfile)
	if def == nil {
		t.Fatal(`the Dockerfile sets no ENV LDFLAGS="..."`)
	}
	for _, want := range []string{"linkVersion=${VERSION}", "linkRevision=${REVISION}"} {
		if !strings.Contains(def[1], "github.com/leafbus/leafbus/internal/buildinfo."+want) {
			t.Errorf("the Dockerfile's LDFLAGS %q, want -X ...buildinfo.%s", def[1], want)
		}
	}
	for _, bin := range []string{"dispenser", "bench"} {
		if !strings.Contains(dockerfile, `-ldflags="$LDFLAGS" -o /out/`+bin+" ./cmd/"+bin) {
			t.Errorf("the Dockerfile does not build %s with -ldflags=\"$LDFLAGS\"", bin)
		}
	}

	out, err := exec.Command("make", "-C", "../..", "-n", "--no-print-directory", "image").CombinedOutput()
	if err != nil {
		t.Fatalf("make -n image: %v\n%s", err, out)
	}
	rev, err := exec.Command("git", "rev-parse", "HEAD").Output()
	if err != nil {
		t.Skipf("no git revision here (%v)", err)
	}
	if want := "--build-arg REVISION=" + strings.TrimSpace(string(rev)); !strings.Contains(string(out), want) || !strings.Contains(string(out), "--build-arg VERSION=") {
		t.Errorf("make -n image: %s, want it to pass VERSION and %s", out, want)
	}

	flags := strings.NewReplacer("${VERSION}", "v9.8.7", "${REVISION}", "0123456789abcdef").Replace(def[1])
	got, err := exec.Command("go", "run", "-ldflags", flags, "./testdata/printversion").CombinedOutput()
	if err != nil {
		t.Fatalf("go run -ldflags %s: %v\n%s", flags, err, got)
	}
	if want := "v9.8.7 (rev 0123456789ab"; !strings.Contains(string(got), want) {
		t.Errorf("built with the Dockerfile's linker flags, the program prints %q, want %q in it", got, want)
	}
}
