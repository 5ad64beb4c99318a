// Package examples_test keeps the examples something a user can copy: each at most
// 200 lines of non-test Go, importing nothing under internal/ (which a user cannot
// import). Their tests may use the repository's internal test helpers.
package examples_test

import (
	"bytes"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

const maxLines = 200

func TestEveryExampleIsShortAndImportsNothingInternal(t *testing.T) {
	dirs, err := os.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	examples := 0
	for _, d := range dirs {
		if !d.IsDir() {
			continue
		}
		files, err := filepath.Glob(filepath.Join(d.Name(), "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		lines := 0
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			src, err := os.ReadFile(f)
			if err != nil {
				t.Fatal(err)
			}
			lines += bytes.Count(src, []byte("\n"))
			parsed, err := parser.ParseFile(token.NewFileSet(), f, src, parser.ImportsOnly)
			if err != nil {
				t.Fatal(err)
			}
			for _, imp := range parsed.Imports {
				if path, _ := strconv.Unquote(imp.Path.Value); isInternal(path) {
					t.Errorf("%s imports %s: a user cannot import internal packages", f, path)
				}
			}
		}
		if lines == 0 {
			continue
		}
		examples++
		if lines > maxLines {
			t.Errorf("examples/%s has %d lines of non-test Go, more than %d", d.Name(), lines, maxLines)
		}
	}
	if examples == 0 {
		t.Error("no example found")
	}
}

func TestIsInternalTellsInternalImportPaths(t *testing.T) {
	for path, want := range map[string]bool{
		"github.com/dedupkit/dedupkit/internal/embedded": true,
		"internal/foo":                              true,
		"example.com/x/internal":                    true,
		"github.com/dedupkit/dedupkit/dedupkittest": false,
		"github.com/someone/internalize":            false,
	} {
		if got := isInternal(path); got != want {
			t.Errorf("isInternal(%q) = %v, want %v", path, got, want)
		}
	}
}

// isInternal reports whether path has an element "internal", which Go lets only
// packages of the same tree import.
func isInternal(path string) bool {
	for _, elem := range strings.Split(path, "/") {
		if elem == "internal" {
			return true
		}
	}
	return false
}
