package dedup

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"sort"
	"strings"
	"testing"
)

// runsAHandler reports whether fd takes a handler function: a parameter of func type
// whose first parameter is a context.Context.
func runsAHandler(fd *ast.FuncDecl) bool {
	for _, p := range fd.Type.Params.List {
		ft, ok := p.Type.(*ast.FuncType)
		if !ok || ft.Params == nil || len(ft.Params.List) == 0 {
			continue
		}
		if sel, ok := ft.Params.List[0].Type.(*ast.SelectorExpr); ok && sel.Sel.Name == "Context" {
			return true
		}
	}
	return false
}

// The package has one lifecycle behind few doors: at most six functions or Handler
// methods run a handler (those that take fn, and Mark).
func TestAtMostSixEntryPointsRunAHandler(t *testing.T) {
	fset := token.NewFileSet()
	pkgs, err := parser.ParseDir(fset, ".", func(fi os.FileInfo) bool { return !strings.HasSuffix(fi.Name(), "_test.go") }, 0)
	if err != nil {
		t.Fatal(err)
	}
	var entries []string
	for _, f := range pkgs["dedup"].Files {
		for _, d := range f.Decls {
			fd, ok := d.(*ast.FuncDecl)
			if !ok || !fd.Name.IsExported() || (!runsAHandler(fd) && fd.Name.Name != "Mark") {
				continue
			}
			if fd.Recv != nil { // only the Handler's methods run it; a store's Mark is a store call
				star, ok := fd.Recv.List[0].Type.(*ast.StarExpr)
				if !ok {
					continue
				}
				if id, isID := star.X.(*ast.Ident); !isID || id.Name != "Handler" {
					continue
				}
			}
			entries = append(entries, fd.Name.Name)
		}
	}
	sort.Strings(entries)
	if len(entries) > 6 {
		t.Fatalf("%d entry points run a handler, want at most 6: %v", len(entries), entries)
	}
	t.Logf("entry points: %v", entries)
}
