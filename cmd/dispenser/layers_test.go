package main

import (
	"go/parser"
	"go/token"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestFacesImportTheCoreOnly holds the faces to ARCHITECTURE.md's layering: the NATS
// face (bus) and the HTTP face (httpapi) parse and encode, and reach the rest of the
// project through core, wire, metrics and client only, so that no rule of a source is
// decided by a face.
func TestFacesImportTheCoreOnly(t *testing.T) {
	allowed := map[string]bool{"core": true, "wire": true, "metrics": true, "client": true}
	const module = "github.com/leafbus/leafbus/"
	for _, face := range []string{"bus", "httpapi"} {
		files, err := filepath.Glob(filepath.Join(repoRoot, face, "*.go"))
		if err != nil || len(files) == 0 {
			t.Fatalf("%s: no Go files (%v)", face, err)
		}
		for _, file := range files {
			if strings.HasSuffix(file, "_test.go") {
				continue
			}
			f, err := parser.ParseFile(token.NewFileSet(), file, nil, parser.ImportsOnly)
			if err != nil {
				t.Fatal(err)
			}
			for _, imp := range f.Imports {
				path, _ := strconv.Unquote(imp.Path.Value)
				if pkg, ok := strings.CutPrefix(path, module); ok && !allowed[pkg] {
					t.Errorf("%s imports %s: a face reaches the project through core, wire, metrics and client only", file, path)
				}
			}
		}
	}
}
