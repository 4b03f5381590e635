// Package buildinfo is the one place that says which build of leafbus is running: the
// module version and VCS revision the Go toolchain stamped into the binary
// (runtime/debug.ReadBuildInfo). `dispenser version`, the start banner, $SRV.INFO, the
// status page and the leafbus_build_info gauge all show what Read returns.
package buildinfo

import (
	"regexp"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"

	"github.com/leafbus/leafbus/wire"
)

// Devel is the module version of a build without one: `go build` outside a tagged
// checkout with -buildvcs=false, `go run`, a test binary.
const Devel = "(devel)"

// DevelSemver is the service version ($SRV.INFO) of a build whose module version is not
// semantic (Devel): semver's lowest pre-release, so that it sorts before every release.
const DevelSemver = wire.DevelVersion

// revisionLen is how many hex digits of the revision are shown, as in a Go pseudo-version.
const revisionLen = 12

// Info is a build's identity.
type Info struct {
	Version   string // the module version: "v1.2.3", a pseudo-version, or Devel
	Revision  string // the VCS revision's first 12 hex digits; "" when not stamped
	Dirty     bool   // built from a working tree with uncommitted changes
	GoVersion string // the toolchain, "go1.26.8"
}

// What `make release` stamps with -ldflags -X (the Makefile's RELEASE_LDFLAGS), for
// builds the toolchain cannot stamp itself: a git worktree (whose .git is a file), or a
// machine whose GOFLAGS holds -buildvcs=false. Empty: the toolchain's stamp stands.
// They are set by the linker only, never written at run time.
var (
	linkVersion  string // git describe of a v* tag, "v1.2.3" (fromDescribe)
	linkRevision string // git rev-parse HEAD
	linkDirty    string // "true" when the tree had uncommitted changes
)

// Read returns the running binary's Info.
func Read() Info {
	info := Info{Version: Devel, GoVersion: runtime.Version()}
	if bi, ok := debug.ReadBuildInfo(); ok {
		info = FromBuildInfo(bi)
	}
	return info.withLinked(linkVersion, linkRevision, linkDirty)
}

// withLinked puts what the linker stamped over what the toolchain did.
func (i Info) withLinked(version, revision, dirty string) Info {
	if version != "" {
		i.Version = fromDescribe(version)
	}
	if revision != "" {
		i.Revision = revision[:min(len(revision), revisionLen)]
		i.Dirty = dirty == "true"
	}
	return i
}

// describeAfterTag is what `git describe --tags --dirty` prints for a commit after a tag:
// the tag, the commits since, the abbreviated revision, and "-dirty" for a changed tree.
var describeAfterTag = regexp.MustCompile(`^(v[0-9]+\.[0-9]+\.)([0-9]+)(-[0-9A-Za-z.-]+?)?-([0-9]+)-g([0-9a-f]+)(-dirty)?$`)

// fromDescribe makes what `git describe` printed (make release's version) a version that
// semver orders as the builds were made. As printed, "v1.2.3-5-g0123abc" is a
// pre-release of v1.2.3, older than the tag it comes after; it becomes
// "v1.2.4-dev.5.g0123abc", after v1.2.3 and before v1.2.4, as Go's pseudo-versions do
// (a pre-release tag's "v1.3.0-rc.1-5-g0123abc" becomes "v1.3.0-rc.1.dev.5.g0123abc").
// "-dirty" becomes the build part "+dirty", as the Go toolchain stamps it. A tag as it
// is, or anything else, is kept.
func fromDescribe(v string) string {
	base, dirty := v, ""
	if b, ok := strings.CutSuffix(v, "-dirty"); ok {
		base, dirty = b, "+dirty"
	}
	m := describeAfterTag.FindStringSubmatch(v)
	if m == nil {
		if isSemver(strings.TrimPrefix(base, "v")) {
			return base + dirty
		}
		return v
	}
	if m[3] != "" { // after a pre-release tag: a later pre-release of the same version
		return m[1] + m[2] + m[3] + ".dev." + m[4] + ".g" + m[5] + dirty
	}
	patch, err := strconv.ParseUint(m[2], 10, 64)
	if err != nil {
		return v
	}
	return m[1] + strconv.FormatUint(patch+1, 10) + "-dev." + m[4] + ".g" + m[5] + dirty
}

// FromBuildInfo reads an Info from what the toolchain stamped.
func FromBuildInfo(bi *debug.BuildInfo) Info {
	info := Info{Version: bi.Main.Version, GoVersion: bi.GoVersion}
	if info.Version == "" {
		info.Version = Devel
	}
	if info.GoVersion == "" {
		info.GoVersion = runtime.Version()
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			info.Revision = s.Value[:min(len(s.Value), revisionLen)]
		case "vcs.modified":
			info.Dirty = s.Value == "true"
		}
	}
	return info
}

// String is the line `dispenser version` prints: "leafbus v1.2.3 (rev 0123456789ab)",
// "leafbus (devel) (rev 0123456789ab, dirty)", or "leafbus (devel)" without a revision.
func (i Info) String() string {
	s := "leafbus " + i.Version
	switch {
	case i.Revision != "" && i.Dirty:
		s += " (rev " + i.Revision + ", dirty)"
	case i.Revision != "":
		s += " (rev " + i.Revision + ")"
	case i.Dirty:
		s += " (dirty)"
	}
	return s
}

// Semver is the version as the NATS service API wants it (semantic, without the "v"):
// a tagged build's "v1.2.3" is "1.2.3", a pseudo-version keeps its pre-release and
// build parts ("0.0.0-20261129040000-0123456789ab+dirty"), and anything that is not
// semantic (Devel) is DevelSemver. docs/PROTOCOL.md "Discovery and statistics" says so.
func (i Info) Semver() string {
	v := strings.TrimPrefix(i.Version, "v")
	if v == i.Version || !isSemver(v) {
		return DevelSemver
	}
	return v
}

// isSemver reports whether v is MAJOR.MINOR.PATCH[-PRERELEASE][+BUILD] as semver 2.0.0
// defines it: numbers without leading zeros, dot-separated identifiers of
// [0-9A-Za-z-], and no numeric pre-release identifier with a leading zero.
func isSemver(v string) bool {
	v, build, hasBuild := strings.Cut(v, "+")
	if hasBuild && !identifiers(build, false) {
		return false
	}
	core, pre, hasPre := strings.Cut(v, "-")
	if hasPre && !identifiers(pre, true) {
		return false
	}
	parts := strings.Split(core, ".")
	if len(parts) != 3 {
		return false
	}
	for _, p := range parts {
		if !number(p) {
			return false
		}
	}
	return true
}

// identifiers checks a dot-separated pre-release or build part.
func identifiers(s string, pre bool) bool {
	for _, id := range strings.Split(s, ".") {
		if id == "" {
			return false
		}
		numeric := true
		for _, c := range id {
			switch {
			case c >= '0' && c <= '9':
			case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c == '-':
				numeric = false
			default:
				return false
			}
		}
		if pre && numeric && !number(id) {
			return false
		}
	}
	return true
}

// number is a non-negative decimal without a leading zero.
func number(s string) bool {
	if s == "" || (len(s) > 1 && s[0] == '0') {
		return false
	}
	_, err := strconv.ParseUint(s, 10, 64)
	return err == nil
}
