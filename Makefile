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

.PHONY: all test deps build vet fmt bench fuzz

all: build

build:
	$(GO) build ./...

# deps installs MariaDB, ZooKeeper, Chromium and Java (JDK, Spring Web, Jackson) when any of
# their files is missing; it does nothing (in about 0.1 s) when they are there. apt needs
# root: as another user it says what to run.
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

fmt:
	gofmt -l -w $$(git ls-files '*.go')

# test: every package against real servers, with the race detector. The suite is kept
# well under 20 minutes on 2 cores; the timeout is the backstop for a hang.
test: deps
	$(GO) vet ./...
	$(GO) test -race -count=1 -timeout 25m ./...
	$(MAKE) --no-print-directory fuzz FUZZTIME=2s

# fuzz: each Go fuzz target in turn (the protocol's parsers and name rules, the admin
# bodies). make test runs them for 2 s each; make fuzz FUZZTIME=10m digs deeper. A
# failure leaves the input under the package's testdata/fuzz, where it stays a test.
FUZZTIME ?= 60s
FUZZ_TARGETS := wire:FuzzParseCount wire:FuzzParseID wire:FuzzDecodeIDs wire:FuzzNames wire:FuzzTagEncodings bus:FuzzAdminBodies
fuzz:
	@for t in $(FUZZ_TARGETS); do \
		pkg=$${t%%:*}; fn=$${t#*:}; log=$$(mktemp); \
		echo "fuzz $$pkg $$fn for $(FUZZTIME)"; \
		$(GO) test -run '^$$' -fuzz "^$$fn\$$" -fuzztime $(FUZZTIME) ./$$pkg >"$$log" 2>&1 || { cat "$$log"; exit 1; }; \
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
