package main

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
)

// errorTextMax is the longest an error's own text may be (issue 32): a first line that
// names the flag or file and the fix. The reason goes to docs/errors.md (or another page
// of docs/), whose anchor the message names.
const errorTextMax = 200

// TestErrorTextsShort reads every error text the project's code writes (the format of
// fmt.Errorf and the text of errors.New, and of the dispenser's "add" of a config
// mistake) and fails on one longer than errorTextMax: a runbook in an error message is
// read by no one, and crowds out the cause it wraps.
func TestErrorTextsShort(t *testing.T) {
	fset := token.NewFileSet()
	checked := 0
	err := filepath.WalkDir(repoRoot, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			switch d.Name() {
			case ".git", "node_modules", "testdata", "testenv", "chaos":
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, path, nil, 0)
		if err != nil {
			return err
		}
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok || len(call.Args) == 0 || !isErrorMaker(call.Fun) {
				return true
			}
			lit, ok := call.Args[0].(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				return true
			}
			text, err := strconv.Unquote(lit.Value)
			if err != nil {
				return true
			}
			checked++
			for _, m := range docAnchor.FindAllStringSubmatch(text, -1) {
				if !anchorsOf(t, filepath.Join(repoRoot, m[1]))[m[2]] {
					t.Errorf("%s: the error text names %s#%s, which is no heading of that file", fset.Position(lit.Pos()), m[1], m[2])
				}
			}
			if len(text) > errorTextMax {
				t.Errorf("%s: an error text of %d characters (at most %d: name the flag or file and the fix, and move the reason to docs/ with its anchor in the message):\n%s",
					fset.Position(lit.Pos()), len(text), errorTextMax, text)
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if checked < 500 {
		t.Fatalf("checked only %d error texts under %s: has the layout changed?", checked, repoRoot)
	}
}

// docAnchor is a page of docs/ and an anchor of it, as an error text names them.
var docAnchor = regexp.MustCompile(`(docs/[a-z-]+\.md)#([a-z0-9-]+)`)

// anchorsOf returns the anchors the headings of a Markdown file make.
func anchorsOf(tb testing.TB, path string) map[string]bool {
	tb.Helper()
	a := map[string]bool{}
	for _, m := range mdHeading.FindAllStringSubmatch(readFile(tb, path), -1) {
		a[headingSlug(m[1])] = true
	}
	return a
}

// isErrorMaker reports whether fun is fmt.Errorf, errors.New or a config check's add.
func isErrorMaker(fun ast.Expr) bool {
	switch f := fun.(type) {
	case *ast.SelectorExpr:
		pkg, ok := f.X.(*ast.Ident)
		return ok && (pkg.Name == "fmt" && f.Sel.Name == "Errorf" || pkg.Name == "errors" && f.Sel.Name == "New")
	case *ast.Ident:
		return f.Name == "add"
	}
	return false
}
