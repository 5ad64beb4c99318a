package dedupkit_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path"
	"regexp"
	"strings"
	"testing"
	"testing/fstest"
)

// Tests are named after what they prove, not after the review round that found
// them: no file regression*_test.go or review*_test.go, and no test function named
// TestR<n>, TestRegression… or TestReview….

var (
	historyFile = regexp.MustCompile(`^(regression|review).*_test\.go$`)
	historyTest = regexp.MustCompile(`^Test(R\d+|Regression|Review)`)
)

func TestTestsAreNamedAfterWhatTheyProve(t *testing.T) {
	problems, files, err := historyNames(os.DirFS("."))
	if err != nil {
		t.Fatal(err)
	}
	if files == 0 {
		t.Fatal("no _test.go file found: is the walk still right?")
	}
	for _, p := range problems {
		t.Error(p)
	}
}

func TestNameCheckerFindsHistoryNames(t *testing.T) {
	src := func(funcs ...string) *fstest.MapFile {
		s := "package p\n\nimport \"testing\"\n\n"
		for _, f := range funcs {
			s += "func " + f + "(t *testing.T) {}\n\n"
		}
		return &fstest.MapFile{Data: []byte(s)}
	}
	fsys := fstest.MapFS{
		"p/regression7_test.go":      src(),
		"p/review_test.go":           src(),
		"p/regression_batch_test.go": src(),
		"p/ack_test.go": src("TestR3", "TestRegressionLostAck", "TestReviewRound2",
			"TestRedisOutageNaks", "TestReplierAnswers503", "TestRetriedClaimIsOwn"),
		"p/notatest.go":                   src("TestR4"), // not a test file
		".hidden/regression_test.go":      src("TestR5"), // not walked
		"p/testdata/review_test.go":       src("TestR6"), // not walked
		"p/regressions_are_fine_in.go.md": src(),
	}
	problems, files, err := historyNames(fsys)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{
		"p/ack_test.go: TestR3", "p/ack_test.go: TestRegressionLostAck", "p/ack_test.go: TestReviewRound2",
		"p/regression7_test.go", "p/regression_batch_test.go", "p/review_test.go",
	}
	if files != 4 || len(problems) != len(want) {
		t.Fatalf("%d files, problems %q; want 4 files and %d problems", files, problems, len(want))
	}
	for i, w := range want {
		if !strings.HasPrefix(problems[i], w) {
			t.Errorf("problem %d is %q, want one about %q", i, problems[i], w)
		}
	}
}

// historyNames walks fsys (skipping hidden directories and testdata) and returns, in
// path order, a problem for each _test.go file or test function named after history,
// and how many _test.go files it read.
func historyNames(fsys fs.FS) (problems []string, files int, err error) {
	fset := token.NewFileSet()
	err = fs.WalkDir(fsys, ".", func(p string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if e.IsDir() {
			if p != "." && (strings.HasPrefix(e.Name(), ".") || e.Name() == "testdata" || e.Name() == "node_modules") {
				return fs.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(p, "_test.go") {
			return nil
		}
		files++
		if historyFile.MatchString(path.Base(p)) {
			problems = append(problems, p+": a file named after a review round; name it after what its tests prove")
		}
		b, err := fs.ReadFile(fsys, p)
		if err != nil {
			return err
		}
		f, err := parser.ParseFile(fset, p, b, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		for _, d := range f.Decls {
			if fn, ok := d.(*ast.FuncDecl); ok && fn.Recv == nil && historyTest.MatchString(fn.Name.Name) {
				problems = append(problems, p+": "+fn.Name.Name+": a test named after history; name it as a sentence about what it proves")
			}
		}
		return nil
	})
	return problems, files, err
}
