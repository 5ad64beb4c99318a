// Package examples_test keeps the examples something a user can copy: each at most
// 200 lines of non-test Go, and nothing in them, their tests included, importing a
// package under internal/ (which a user cannot import; dedupkittest is the public
// test helper).
package examples_test

import (
	"bytes"
	"fmt"
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
	problems, examples, err := checkExamples(".")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		t.Error(p)
	}
	if examples == 0 {
		t.Error("no example found")
	}
}

// The check reads the examples' tests too: a test importing a package under
// internal/ is reported, while test lines do not count toward the length limit.
func TestCheckExamplesReportsATestThatImportsInternal(t *testing.T) {
	root := t.TempDir()
	for name, src := range map[string]string{
		"ok/main.go":       "package main\n\nfunc main() {}\n",
		"ok/main_test.go":  "package main\n\nimport _ \"github.com/dedupkit/dedupkit/dedupkittest\"\n" + strings.Repeat("\n", 2*maxLines),
		"bad/main.go":      "package main\n\nfunc main() {}\n",
		"bad/main_test.go": "package main\n\nimport _ \"github.com/dedupkit/dedupkit/internal/embedded\"\n",
	} {
		path := filepath.Join(root, name)
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(src), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	problems, examples, err := checkExamples(root)
	if err != nil {
		t.Fatal(err)
	}
	if examples != 2 {
		t.Errorf("%d examples, want 2", examples)
	}
	if len(problems) != 1 || !strings.Contains(problems[0], filepath.Join("bad", "main_test.go")) ||
		!strings.Contains(problems[0], "internal/embedded") {
		t.Errorf("problems %q, want one: bad/main_test.go imports internal/embedded", problems)
	}
}

// checkExamples checks each directory under root that holds an example (non-test Go
// files): at most maxLines lines of non-test Go, and no Go file of it, test or not,
// importing a package under internal/. It returns what breaks a rule, and how many
// examples it found.
func checkExamples(root string) (problems []string, examples int, err error) {
	dirs, err := os.ReadDir(root)
	if err != nil {
		return nil, 0, err
	}
	for _, d := range dirs {
		if !d.IsDir() {
			continue
		}
		files, err := filepath.Glob(filepath.Join(root, d.Name(), "*.go"))
		if err != nil {
			return nil, 0, err
		}
		lines := 0
		for _, f := range files {
			src, err := os.ReadFile(f)
			if err != nil {
				return nil, 0, err
			}
			if !strings.HasSuffix(f, "_test.go") {
				lines += bytes.Count(src, []byte("\n"))
			}
			parsed, err := parser.ParseFile(token.NewFileSet(), f, src, parser.ImportsOnly)
			if err != nil {
				return nil, 0, err
			}
			for _, imp := range parsed.Imports {
				if path, _ := strconv.Unquote(imp.Path.Value); isInternal(path) {
					problems = append(problems, fmt.Sprintf("%s imports %s: a user cannot import internal packages", f, path))
				}
			}
		}
		if lines == 0 {
			continue
		}
		examples++
		if lines > maxLines {
			problems = append(problems, fmt.Sprintf("examples/%s has %d lines of non-test Go, more than %d", d.Name(), lines, maxLines))
		}
	}
	return problems, examples, nil
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
