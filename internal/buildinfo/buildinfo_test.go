package buildinfo

import (
	"runtime/debug"
	"strings"
	"testing"
)

func TestFromBuildInfo(t *testing.T) {
	rev := "0123456789abcdef0123456789abcdef01234567"
	for _, tt := range []struct {
		name       string
		bi         debug.BuildInfo
		str, sem   string
		wantCommit string
	}{
		{"Tagged", debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "v1.2.3"},
			Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: rev}, {Key: "vcs.modified", Value: "false"}}},
			"leafbus v1.2.3 (rev 0123456789ab)", "1.2.3", "0123456789ab"},
		{"PseudoDirty", debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "v0.0.0-20261129040000-0123456789ab+dirty"},
			Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: rev}, {Key: "vcs.modified", Value: "true"}}},
			"leafbus v0.0.0-20261129040000-0123456789ab+dirty (rev 0123456789ab, dirty)", "0.0.0-20261129040000-0123456789ab+dirty", "0123456789ab"},
		{"DevelWithVCS", debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Version: "(devel)"},
			Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: rev}}},
			"leafbus (devel) (rev 0123456789ab)", DevelSemver, "0123456789ab"},
		{"NoVCS", debug.BuildInfo{GoVersion: "go1.26.8"}, "leafbus (devel)", DevelSemver, ""},
		// A version that is not semantic (a numeric pre-release identifier with a
		// leading zero) is shown as it is and mapped to DevelSemver for $SRV.
		{"NotSemver", debug.BuildInfo{Main: debug.Module{Version: "v1.2.3-01"}},
			"leafbus v1.2.3-01", DevelSemver, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got := FromBuildInfo(&tt.bi)
			if got.String() != tt.str || got.Semver() != tt.sem || got.Revision != tt.wantCommit {
				t.Errorf("FromBuildInfo = %+v: String %q Semver %q, want %q %q rev %q", got, got.String(), got.Semver(), tt.str, tt.sem, tt.wantCommit)
			}
			if got.GoVersion == "" {
				t.Error("GoVersion empty: want the toolchain's")
			}
		})
	}
}

func TestIsSemver(t *testing.T) {
	for v, want := range map[string]bool{
		"1.0.0": true, "0.0.0-devel": true, "1.2.3-rc.1+build.5": true, "10.20.30": true,
		"1.2": false, "01.2.3": false, "1.2.3-": false, "1.2.3-01": false, "1.2.3+": false,
		"(devel)": false, "1.2.3-a..b": false, "1.2.3-a_b": false,
	} {
		if got := isSemver(v); got != want {
			t.Errorf("isSemver(%q) = %v, want %v", v, got, want)
		}
	}
}

func TestReadIsSemver(t *testing.T) {
	// Whatever the toolchain stamped into this test binary, the service version is
	// semantic: the NATS service API refuses anything else.
	if v := Read().Semver(); !isSemver(v) {
		t.Errorf("Read().Semver() = %q: not semantic", v)
	}
}

// What make release stamps (git describe) is ordered as the builds were made: a build
// after a tag sorts after it and before the next patch.
func TestFromDescribe(t *testing.T) {
	for describe, want := range map[string]string{
		"v1.2.3":                     "v1.2.3",
		"v1.2.3-dirty":               "v1.2.3+dirty",
		"v1.2.3-5-g0123abc":          "v1.2.4-dev.5.g0123abc",
		"v1.2.3-5-g0123abc-dirty":    "v1.2.4-dev.5.g0123abc+dirty",
		"v1.2.9-12-gdeadbeef":        "v1.2.10-dev.12.gdeadbeef",
		"v1.3.0-rc.1":                "v1.3.0-rc.1",
		"v1.3.0-rc.1-5-g0123abc":     "v1.3.0-rc.1.dev.5.g0123abc",
		"v1.3.0-rc-1-2-gabc1234":     "v1.3.0-rc-1.dev.2.gabc1234",
		"0123abc":                    "0123abc", // no tag: kept, and not semantic (Semver says devel)
		"(devel)":                    "(devel)",
		"v1.2.3-5-g0123abc-dirtyish": "v1.2.3-5-g0123abc-dirtyish",
	} {
		got := fromDescribe(describe)
		if got != want {
			t.Errorf("fromDescribe(%q) = %q, want %q", describe, got, want)
		}
		if strings.HasPrefix(want, "v") && !isSemver(strings.TrimPrefix(got, "v")) {
			t.Errorf("fromDescribe(%q) = %q: not semantic", describe, got)
		}
	}
}

func TestWithLinked(t *testing.T) {
	base := Info{Version: Devel, GoVersion: "go1.26.8"}
	got := base.withLinked("v1.3.0", "fedcba9876543210fedcba9876543210fedcba98", "true")
	if got.String() != "leafbus v1.3.0 (rev fedcba987654, dirty)" || got.Semver() != "1.3.0" {
		t.Errorf("linked: %q %q", got.String(), got.Semver())
	}
	if got := base.withLinked("", "", ""); got != base {
		t.Errorf("nothing linked: %+v, want %+v", got, base)
	}
}
