# leafbus: `make test` is what CI runs (.ci/run) and what a newcomer runs on a fresh
# Debian machine; it installs the servers the tests need, then runs every test with -race.

GO ?= go

# The Debian packages whose binaries testenv starts (private instances on loopback).
DEPS_PKGS := mariadb-server mariadb-client zookeeper
DEPS_FILES := /usr/sbin/mariadbd /usr/bin/mariadb-install-db /usr/share/java/zookeeper.jar
# Headless Chromium, which loads the status page in httpapi's browser test, and a font
# for it to render text with (the test checks the visible text and saves a screenshot).
DEPS_PKGS += chromium fonts-dejavu-core
DEPS_FILES += /usr/bin/chromium /usr/share/fonts/truetype/dejavu/DejaVuSans.ttf
# The Java stack of a Leaf client (cmd/dispenser's TestJavaLeafClient compiles and runs
# one with javac): a JDK, Spring Web 4.3's RestTemplate and Jackson 2.
DEPS_PKGS += default-jdk-headless libspring-web-java libjackson2-databind-java
DEPS_FILES += /usr/bin/javac /usr/share/java/spring3-web.jar /usr/share/java/jackson-databind.jar
# The checkers of the files operators deploy with: systemd-analyze verify for the unit
# (cmd/dispenser's TestSystemdUnit), promtool check rules for the alert rules (deploy's
# TestAlertRules).
DEPS_PKGS += systemd prometheus
DEPS_FILES += /usr/bin/systemd-analyze /usr/bin/promtool

.PHONY: all test deps build vet fmt bench fuzz alloc release release-ldflags image

all: build

build:
	$(GO) build ./...

# deps installs MariaDB, ZooKeeper, Chromium, Java (JDK, Spring Web, Jackson), systemd and
# Prometheus (for their checkers) when any of their files is missing; it does nothing (in
# about 0.1 s) when they are there. apt needs root: as another user it says what to run.
deps:
	@missing=""; for f in $(DEPS_FILES); do [ -e "$$f" ] || missing="$$missing $$f"; done; \
	command -v java >/dev/null 2>&1 || missing="$$missing java"; \
	if [ -z "$$missing" ]; then exit 0; fi; \
	echo "make deps: missing:$$missing; installing $(DEPS_PKGS)"; \
	if [ "$$(id -u)" != 0 ]; then \
		if command -v sudo >/dev/null 2>&1; then SUDO=sudo; else \
			echo "make deps: run as root: apt-get install -y --no-install-recommends $(DEPS_PKGS)" >&2; exit 1; fi; \
	fi; \
	$$SUDO env DEBIAN_FRONTEND=noninteractive apt-get update -qq && \
	$$SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $(DEPS_PKGS) >/dev/null && \
	echo "make deps: installed $(DEPS_PKGS)"

vet:
	$(GO) vet ./...

# release: static binaries (no cgo, paths trimmed) of the dispenser and bench for each of
# RELEASE_PLATFORMS, as dist/<cmd>-<os>-<arch>, and dist/SHA256SUMS over them
# (sha256sum -c SHA256SUMS checks a download). The version comes from the newest v* tag
# (git describe; none: "(devel)") and the revision from git, stamped with -X into
# internal/buildinfo: `dispenser version` prints them, a build after a tag as
# v1.2.4-dev.5.g0123abc, which semver orders after v1.2.3 (docs/compatibility.md). internal/buildinfo's tests check
# this target with make -n and build with RELEASE_LDFLAGS; make test builds no release.
RELEASE_PLATFORMS := linux/amd64 linux/arm64 darwin/amd64 darwin/arm64
RELEASE_CMDS := dispenser bench
DIST := dist
BUILDINFO := github.com/leafbus/leafbus/internal/buildinfo
RELEASE_VERSION = $(shell git describe --tags --match 'v[0-9]*' --dirty 2>/dev/null)
RELEASE_REVISION = $(shell git rev-parse HEAD 2>/dev/null)
RELEASE_DIRTY = $(shell git diff --quiet HEAD 2>/dev/null || echo true)
RELEASE_LDFLAGS = -s -w -X $(BUILDINFO).linkVersion=$(RELEASE_VERSION) -X $(BUILDINFO).linkRevision=$(RELEASE_REVISION) -X $(BUILDINFO).linkDirty=$(RELEASE_DIRTY)
release:
	rm -rf $(DIST) && mkdir -p $(DIST)
	@set -e; for p in $(RELEASE_PLATFORMS); do \
		os=$${p%/*}; arch=$${p#*/}; \
		for c in $(RELEASE_CMDS); do \
			echo "release $(DIST)/$$c-$$os-$$arch"; \
			CGO_ENABLED=0 GOOS=$$os GOARCH=$$arch $(GO) build -trimpath -ldflags '$(RELEASE_LDFLAGS)' -o $(DIST)/$$c-$$os-$$arch ./cmd/$$c; \
		done; \
	done
	cd $(DIST) && sha256sum $$(ls | grep -v '^SHA256SUMS$$') > SHA256SUMS
	@cat $(DIST)/SHA256SUMS

# image: the Docker image (Dockerfile), tagged and stamped with the version and revision
# make release stamps (the build context holds no .git). Needs a Docker engine.
IMAGE_TAG = $(or $(RELEASE_VERSION),devel)
image:
	docker build --build-arg VERSION=$(RELEASE_VERSION) --build-arg REVISION=$(RELEASE_REVISION) -t leafbus:$(IMAGE_TAG) .

# release-ldflags prints the linker flags release builds with (its test reads them).
release-ldflags:
	@echo '$(RELEASE_LDFLAGS)'

fmt:
	gofmt -l -w $$(git ls-files '*.go')

# test: every package against real servers, with the race detector; the Kubernetes
# manifests' checks (deploy/kubernetes, a module of its own: k8s.io stays out of go.mod;
# one test file, which go test's own vet checks cover: a separate go vet there compiled
# k8s.io's types a second time, 63 s of a cold build);
# then the allocation tests, which the race detector's own allocations make skip,
# without it; then every fuzz target for a count of inputs; then the Node.js client's
# tests (test-js). Four test binaries at once (TEST_P): most packages wait on the servers
# they start, so the CPU stays about a third idle even then. 5m36s to 6m07s on 2 cores from
# a fresh clone with the Go build cache warm (four green runs, 2026-11-29), 14m00s with it
# empty; 7m32s at TEST_P=2. A test that fails under this load is a bug
# to find at its root (docs/testing.md). The timeout is the backstop for a hang.
TEST_P ?= 4
test: deps
	$(GO) vet ./...
	$(GO) test -race -count=1 -p $(TEST_P) -timeout 25m ./...
	cd deploy/kubernetes && $(GO) test -count=1 ./...
	$(MAKE) --no-print-directory alloc
	$(MAKE) --no-print-directory fuzz FUZZTIME=$(TEST_FUZZTIME)
	$(MAKE) --no-print-directory test-js

# alloc: the tests of the zero-allocation claims that skip under -race (the reply path
# of an ID request, the load generator's publish), run without it. They are found by
# name wherever they live; a name not found, or a test that skips, fails the step.
ALLOC_TESTS := TestReplyAllocatesNothing|TestTakeAllocatesNothing|TestPublishAllocations
alloc:
	@want=$$(echo '$(ALLOC_TESTS)' | tr '|' '\n' | wc -l); \
	found=$$(grep -rhoE --include='*_test.go' '^func ($(ALLOC_TESTS))\(' . | sort -u | wc -l); \
	dirs=$$(grep -rlE --include='*_test.go' '^func ($(ALLOC_TESTS))\(' . | xargs -r -n1 dirname | sort -u); \
	if [ "$$found" -ne "$$want" ]; then echo "make alloc: found $$found of the $$want tests $(ALLOC_TESTS)" >&2; exit 1; fi; \
	echo "alloc: $(ALLOC_TESTS) without -race in" $$dirs; \
	log=$$(mktemp); \
	$(GO) test -count=1 -v -run '^($(ALLOC_TESTS))$$' $$dirs >"$$log" 2>&1 || { cat "$$log"; rm -f "$$log"; exit 1; }; \
	if grep -q -- '--- SKIP' "$$log"; then cat "$$log"; rm -f "$$log"; echo "make alloc: a test skipped" >&2; exit 1; fi; \
	rm -f "$$log"

# fuzz: each Go fuzz target in turn (the protocol's parsers and name rules, the admin
# bodies). make test runs each for TEST_FUZZTIME inputs (a count, not a duration: a
# duration budget can fail a clean target with "context deadline exceeded" at its end
# on a busy machine, golang/go#75804, fixed in Go 1.27), about half a second per wire
# target and a few seconds for the admin bodies here. make fuzz FUZZTIME=10m digs
# deeper. A failure writes the input under the package's testdata/fuzz, where it stays
# a test. Targets are found by name wherever they live (one package each).
FUZZTIME ?= 60s
TEST_FUZZTIME := 10000x
FUZZ_TARGETS := FuzzParseCount FuzzParseID FuzzDecodeIDs FuzzAppendIDs FuzzNames FuzzTagEncodings FuzzAdminBodies
fuzz:
	@for fn in $(FUZZ_TARGETS); do \
		pkg=$$(grep -rlE --include='*_test.go' "^func $$fn\(" . | xargs -r -n1 dirname | sort -u); \
		if [ -z "$$pkg" ] || [ "$$(echo "$$pkg" | wc -l)" -ne 1 ]; then echo "make fuzz: $$fn is in no package or in several: $$pkg" >&2; exit 1; fi; \
		log=$$(mktemp); \
		echo "fuzz $$pkg $$fn for $(FUZZTIME)"; \
		$(GO) test -run '^$$' -fuzz "^$$fn\$$" -fuzztime $(FUZZTIME) $$pkg >"$$log" 2>&1 || { cat "$$log"; rm -f "$$log"; exit 1; }; \
		rm -f "$$log"; \
	done

# bench: the Go benchmarks (BENCHMARKS.md explains each number and cmd/bench).
bench:
	$(GO) test -run '^$$' -bench . -benchmem ./...

# chaos: the whole chaos suite (package chaos, TestChaos): a 3-node NATS cluster, MariaDB,
# ZooKeeper and five dispensers (every worker-ID registry, MySQL segments, KV R3) under a
# steady load through the hedging client and a monotonic tag's clients, thirteen faults one
# after another (three aimed at the monotonic tag's leader), then a report (also written to
# chaos-report.txt): IDs checked, duplicates, errors by code per fault, the longest gap
# without service, the time from each fault's end to full service, the monotonic
# promise checked on every reply and its failover gaps. About 3 to 4 minutes here. make
# test runs its short version (TestChaosShort, about a minute).
.PHONY: chaos
chaos: deps
	LEAFBUS_CHAOS=full LEAFBUS_CHAOS_REPORT=$(CURDIR)/chaos-report.txt \
		$(GO) test -count=1 -timeout 15m -run '^TestChaos$$' -v ./chaos

# test-js: the Node.js client (clients/js, npm package @leafbus/client) built and tested
# with node --test against the real dispenser binary, and its `npm pack` tarball installed
# into an empty project and run there; about 15 s. It needs Node.js 20 or
# later with npm, and the npm registry (or npm's cache) for `npm ci`, which runs only
# when node_modules is missing or older than package-lock.json. No Node fails the step.
.PHONY: test-js
test-js:
	@command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1 || { \
		echo "make test-js: node and npm not found: install Node.js 20 or later (Debian: apt-get install nodejs npm)" >&2; exit 1; }
	@node -e 'process.exit(+process.versions.node.split(".")[0] >= 20 ? 0 : 1)' || { \
		echo "make test-js: node $$(node --version) is too old: install Node.js 20 or later" >&2; exit 1; }
	@cd clients/js && if [ ! -f node_modules/.package-lock.json ] || [ package-lock.json -nt node_modules/.package-lock.json ]; then \
		npm ci --no-audit --no-fund --loglevel=error; fi
	cd clients/js && npm run --silent build
	@dir=$$(mktemp -d) && trap 'rm -rf "$$dir"' EXIT && \
		$(GO) build -o "$$dir/dispenser" ./cmd/dispenser && \
		cd clients/js && LEAFBUS_DISPENSER_BIN="$$dir/dispenser" node --test --test-timeout=120000 test/client.test.mjs test/pack.test.mjs
