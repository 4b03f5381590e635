package main

// README is the front door and docs/ holds the rest (issue 32): these tests keep the door
// small and every way through it open, so a section moved from one file to another
// cannot leave a link pointing at nothing.

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// readmeMaxLines is how long the front door may grow: what a newcomer reads in five
// minutes. Everything longer belongs in docs/.
const readmeMaxLines = 250

// The Markdown files whose links are checked, from the repository's root.
var docFiles = []string{"README.md", "BENCHMARKS.md", "docs/*.md", "clients/js/README.md"}

var (
	mdLink    = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	mdHeading = regexp.MustCompile(`(?m)^#{1,6} (.+)$`)
	slugDrop  = regexp.MustCompile(`[^a-z0-9 _-]`)
)

func TestReadmeIsAFrontDoor(t *testing.T) {
	doc := readFile(t, filepath.Join(repoRoot, "README.md"))
	if n := strings.Count(doc, "\n"); n > readmeMaxLines {
		t.Errorf("README.md has %d lines, more than %d: move the detail to docs/ and link it", n, readmeMaxLines)
	}
	for _, want := range []string{"go run ./cmd/dispenser", "make test", "docs/PROTOCOL.md", "docs/operations.md"} {
		if !strings.Contains(doc, want) {
			t.Errorf("README.md does not mention %q", want)
		}
	}
}

// TestDocLinksResolve checks that every relative link in README and docs/ names a file
// of the repository and, when it has one, an anchor that a heading of that file makes
// (GitHub's rule: lower case, punctuation dropped, spaces to dashes).
func TestDocLinksResolve(t *testing.T) {
	var files []string
	for _, pattern := range docFiles {
		m, err := filepath.Glob(filepath.Join(repoRoot, pattern))
		if err != nil {
			t.Fatal(err)
		}
		files = append(files, m...)
	}
	if len(files) < 5 {
		t.Fatalf("found only %d Markdown files under %s: %v", len(files), repoRoot, files)
	}
	anchors := map[string]map[string]bool{}
	anchorsOf := func(path string) map[string]bool {
		if a, ok := anchors[path]; ok {
			return a
		}
		a := map[string]bool{}
		b, err := os.ReadFile(path)
		if err == nil {
			for _, m := range mdHeading.FindAllStringSubmatch(string(b), -1) {
				a[headingSlug(m[1])] = true
			}
		}
		anchors[path] = a
		return a
	}
	for _, file := range files {
		doc := readFile(t, file)
		doc = regexp.MustCompile("(?s)```.*?```").ReplaceAllString(doc, "")
		for _, m := range mdLink.FindAllStringSubmatch(doc, -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			path, anchor, _ := strings.Cut(target, "#")
			full := file
			if path != "" {
				full = filepath.Join(filepath.Dir(file), path)
				if _, err := os.Stat(full); err != nil {
					t.Errorf("%s: link %q: no file %s", file, target, full)
					continue
				}
			}
			if anchor == "" || !strings.HasSuffix(full, ".md") {
				continue
			}
			if !anchorsOf(full)[anchor] {
				t.Errorf("%s: link %q: %s has no heading with anchor #%s", file, target, full, anchor)
			}
		}
	}
}

// headingSlug is the anchor GitHub gives a Markdown heading.
func headingSlug(heading string) string {
	s := strings.ToLower(strings.TrimSpace(heading))
	s = slugDrop.ReplaceAllString(s, "")
	return strings.ReplaceAll(s, " ", "-")
}
