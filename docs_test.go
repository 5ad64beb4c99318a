package dedupkit_test

import (
	"bytes"
	"flag"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"unicode"
)

// The design document is docs/design.md; code, tests and docs cite its sections as
// "docs/design.md §n", and Markdown links to it as [design §n](docs/design.md#anchor).
// This test keeps those citations pointing into the repository: none may cite the
// planning contract that lives outside it, every cited section must exist, every
// anchor must be a heading of docs/design.md (by GitHub's slug rules), and no
// relative Markdown link may leave the repository.

const designPath = "docs/design.md"

var (
	// a citation of the planning contract's sections (the class keeps this file out)
	plannedCitation = regexp.MustCompile(`\bD[E]SIGN(?:\.md|[\s/#*]*§)`)
	// docs/design.md §n, the citation may wrap onto a comment's next line
	designCitation = regexp.MustCompile(`docs/design\.md[\s/#*]*§(\d+)`)
	// a Markdown link: its text and its target
	mdLink = regexp.MustCompile(`\[([^\]]*)\]\(([^)\s]+)\)`)
	// a section heading of docs/design.md: "## 3. Store operations"
	sectionHeading = regexp.MustCompile(`^## (\d+)\. `)
	sectionSign    = regexp.MustCompile(`§(\d+)`)
)

// design is what docs/design.md offers to citations.
type design struct {
	sections map[int]string    // section number → its heading's anchor
	anchors  map[string]int    // every heading's anchor → its section (0: outside one)
	text     string            // the file
	headings map[string]string // anchor → heading, for messages
}

func readDesign(t *testing.T) design {
	t.Helper()
	b, err := os.ReadFile(designPath)
	if err != nil {
		t.Fatalf("the design document is missing: %v", err)
	}
	d := design{sections: map[int]string{}, anchors: map[string]int{}, text: string(b), headings: map[string]string{}}
	section, inFence := 0, false
	seen := map[string]int{}
	for _, line := range strings.Split(d.text, "\n") {
		if strings.HasPrefix(line, "```") {
			inFence = !inFence
		}
		if inFence || !strings.HasPrefix(line, "#") {
			continue
		}
		title := strings.TrimLeft(line, "#")
		if !strings.HasPrefix(title, " ") {
			continue
		}
		title = strings.TrimSpace(title)
		anchor := slug(title)
		if n := seen[anchor]; n > 0 { // GitHub numbers repeated anchors
			seen[anchor] = n + 1
			anchor += "-" + strconv.Itoa(n)
		} else {
			seen[anchor] = 1
		}
		if strings.HasPrefix(line, "## ") {
			section = 0
			if m := sectionHeading.FindStringSubmatch(line); m != nil {
				section, _ = strconv.Atoi(m[1])
				if _, dup := d.sections[section]; dup {
					t.Errorf("%s: section %d is defined twice", designPath, section)
				}
				d.sections[section] = anchor
			}
		}
		d.anchors[anchor] = section
		d.headings[anchor] = title
	}
	if len(d.sections) == 0 {
		t.Fatalf("%s has no numbered sections (## n. Title)", designPath)
	}
	return d
}

// slug is the anchor GitHub gives a Markdown heading: lower case, punctuation other
// than '-' and '_' dropped, each space a '-'.
func slug(heading string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(heading) {
		switch {
		case r == ' ':
			b.WriteByte('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

func TestSlug(t *testing.T) {
	for heading, want := range map[string]string{
		"3. Store operations":                  "3-store-operations",
		"5. Running a handler: outcomes":       "5-running-a-handler-outcomes",
		"Where the code differs from the plan": "where-the-code-differs-from-the-plan",
		"Key strategies (`keys/`)":             "key-strategies-keys",
		"Request/reply":                        "requestreply",
	} {
		if got := slug(heading); got != want {
			t.Errorf("slug(%q) = %q, want %q", heading, got, want)
		}
	}
}

// sourceFiles returns the repository's Go and Markdown files.
func sourceFiles(t *testing.T) []string {
	t.Helper()
	var files []string
	err := filepath.WalkDir(".", func(path string, e fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if e.IsDir() {
			if path != "." && (strings.HasPrefix(e.Name(), ".") || e.Name() == "node_modules") {
				return filepath.SkipDir
			}
			return nil
		}
		if strings.HasSuffix(path, ".go") || strings.HasSuffix(path, ".md") {
			files = append(files, filepath.ToSlash(path))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

func lineOf(text string, at int) int { return strings.Count(text[:at], "\n") + 1 }

func TestDesignCitations(t *testing.T) {
	d := readDesign(t)
	files := sourceFiles(t)
	cited := 0
	for _, path := range files {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		text := string(b)
		for _, m := range plannedCitation.FindAllStringIndex(text, -1) {
			t.Errorf("%s:%d: %q cites the planning contract, outside the repository; cite %s §n", path, lineOf(text, m[0]), text[m[0]:m[1]], designPath)
		}
		for _, m := range designCitation.FindAllStringSubmatchIndex(text, -1) {
			cited++
			n, _ := strconv.Atoi(text[m[2]:m[3]])
			if _, ok := d.sections[n]; !ok {
				t.Errorf("%s:%d: %s §%d: no such section", path, lineOf(text, m[0]), designPath, n)
			}
		}
		if strings.HasSuffix(path, ".md") {
			cited += checkLinks(t, d, path, text)
		}
	}
	if cited == 0 {
		t.Errorf("no citation of %s found: is the pattern still right?", designPath)
	}
	// the design document's own references to its sections
	for _, m := range sectionSign.FindAllStringSubmatchIndex(d.text, -1) {
		n, _ := strconv.Atoi(d.text[m[2]:m[3]])
		if _, ok := d.sections[n]; !ok {
			t.Errorf("%s:%d: §%d: no such section", designPath, lineOf(d.text, m[0]), n)
		}
	}
}

// checkLinks checks the relative links of a Markdown file: none leaves the
// repository, and a link into docs/design.md names an existing anchor and, when its
// text cites §n, an anchor inside section n. It returns how many links go to the
// design document.
func checkLinks(t *testing.T, d design, path, text string) int {
	t.Helper()
	n := 0
	for _, m := range mdLink.FindAllStringSubmatchIndex(text, -1) {
		label, target := text[m[2]:m[3]], text[m[4]:m[5]]
		if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
			continue
		}
		file, anchor, _ := strings.Cut(target, "#")
		where := path
		if file != "" {
			where = filepath.ToSlash(filepath.Clean(filepath.Join(filepath.Dir(path), file)))
			if where == ".." || strings.HasPrefix(where, "../") || filepath.IsAbs(file) {
				t.Errorf("%s:%d: link %q points outside the repository", path, lineOf(text, m[0]), target)
				continue
			}
		}
		if where != designPath {
			continue
		}
		n++
		if anchor != "" {
			if _, ok := d.anchors[anchor]; !ok {
				t.Errorf("%s:%d: link %q: %s has no heading with anchor #%s", path, lineOf(text, m[0]), target, designPath, anchor)
				continue
			}
		}
		for _, s := range sectionSign.FindAllStringSubmatch(label, -1) {
			sec, _ := strconv.Atoi(s[1])
			if _, ok := d.sections[sec]; !ok {
				t.Errorf("%s:%d: link [%s]: %s has no section %d", path, lineOf(text, m[0]), label, designPath, sec)
			} else if anchor != "" && d.anchors[anchor] != sec {
				t.Errorf("%s:%d: link [%s](%s): #%s (%q) is not in section %d", path, lineOf(text, m[0]), label, target, anchor, d.headings[anchor], sec)
			}
		}
	}
	return n
}

// The README is read in five minutes: at most this many lines.
const readmeMaxLines = 300

func TestReadmeLength(t *testing.T) {
	b, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	if n := bytes.Count(b, []byte("\n")); n > readmeMaxLines {
		t.Errorf("README.md has %d lines, more than %d: move the detail to docs/", n, readmeMaxLines)
	}
}

// docFiles are the Markdown files whose links TestLinks checks.
func docFiles(t *testing.T) []string {
	t.Helper()
	files := []string{"README.md", "CHANGELOG.md"}
	docs, err := filepath.Glob("docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	return append(files, docs...)
}

// Every relative link in README.md, CHANGELOG.md and docs/*.md resolves to a file or
// folder of the repository, and every #anchor to a heading of its target.
func TestLinks(t *testing.T) {
	anchors := anchorCache{}
	checked := 0
	for _, path := range docFiles(t) {
		b, err := os.ReadFile(path)
		if err != nil {
			t.Fatal(err)
		}
		problems, n := linkProblems(path, string(b), anchors.of)
		checked += n
		for _, p := range problems {
			t.Error(p)
		}
	}
	if checked < 20 {
		t.Errorf("only %d relative links checked: is the pattern still right?", checked)
	}
}

// The checker finds what it is for: a missing file, a missing anchor in another
// file and in the same one, and a link out of the repository; a link in a code
// block and an external link are not links to check.
func TestLinksCheckerFindsBrokenLinks(t *testing.T) {
	text := "# Top\n\n## A heading, with `code`\n\n" +
		"[ok](docs/design.md) [ok](#top) [ok](#a-heading-with-code) [ok](docs/) [ok](https://example.com/x#y)\n" +
		"[bad file](docs/nothing.md) [bad anchor](docs/design.md#nothing) [bad own](#nothing) [out](../x.md)\n" +
		"```\n[in code](nothing.md)\n```\n"
	problems, _ := linkProblems("README.md", text, anchorCache{}.of)
	want := []string{"docs/nothing.md", "docs/design.md#nothing", "#nothing", "../x.md"}
	if len(problems) != len(want) {
		t.Fatalf("%d problems, want %d: %q", len(problems), len(want), problems)
	}
	for i, w := range want {
		if !strings.Contains(problems[i], fmt.Sprintf("%q", w)) {
			t.Errorf("problem %d is %q, want one about %q", i, problems[i], w)
		}
	}
}

// anchorCache holds the heading anchors of each Markdown file read.
type anchorCache map[string]map[string]bool

func (c anchorCache) of(path string) (map[string]bool, error) {
	if a, ok := c[path]; ok {
		return a, nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	a := headingAnchors(string(b))
	if c != nil {
		c[path] = a
	}
	return a, nil
}

// headingAnchors returns the anchors GitHub gives the headings of a Markdown text
// (outside code blocks): the slug, and slug-n for its repeats.
func headingAnchors(text string) map[string]bool {
	anchors, seen, inFence := map[string]bool{}, map[string]int{}, false
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(line, "```") {
			inFence = !inFence
		}
		title := strings.TrimLeft(line, "#")
		if inFence || !strings.HasPrefix(line, "#") || !strings.HasPrefix(title, " ") {
			continue
		}
		anchor := slug(strings.TrimSpace(title))
		if n := seen[anchor]; n > 0 {
			seen[anchor] = n + 1
			anchor += "-" + strconv.Itoa(n)
		} else {
			seen[anchor] = 1
		}
		anchors[anchor] = true
	}
	return anchors
}

// linkProblems checks the relative links of the Markdown file path, whose text is
// given, outside code blocks: each names a file or folder inside the repository, and
// its #anchor, if any, a heading of the Markdown file it names. It returns the
// problems found and how many links it checked.
func linkProblems(path, text string, anchorsOf func(string) (map[string]bool, error)) (problems []string, checked int) {
	lines := strings.Split(text, "\n")
	inFence := false
	for i, line := range lines {
		if strings.HasPrefix(line, "```") {
			inFence = !inFence
		}
		if inFence {
			continue
		}
		for _, m := range mdLink.FindAllStringSubmatch(line, -1) {
			target := m[2]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			checked++
			at := fmt.Sprintf("%s:%d: link %q", path, i+1, target)
			file, anchor, _ := strings.Cut(target, "#")
			where := path
			if file != "" {
				where = filepath.ToSlash(filepath.Clean(filepath.Join(filepath.Dir(path), file)))
				if where == ".." || strings.HasPrefix(where, "../") || filepath.IsAbs(file) {
					problems = append(problems, at+" points outside the repository")
					continue
				}
				if _, err := os.Stat(where); err != nil {
					problems = append(problems, at+": no such file or folder "+where)
					continue
				}
			}
			if anchor == "" {
				continue
			}
			if !strings.HasSuffix(where, ".md") {
				problems = append(problems, at+": an anchor into "+where+", which is not Markdown")
				continue
			}
			var anchors map[string]bool
			if where == path {
				anchors = headingAnchors(text)
			} else {
				a, err := anchorsOf(where)
				if err != nil {
					problems = append(problems, at+": "+err.Error())
					continue
				}
				anchors = a
			}
			if !anchors[anchor] {
				problems = append(problems, at+": "+where+" has no heading with anchor #"+anchor)
			}
		}
	}
	return problems, checked
}

var update = flag.Bool("update", false, "TestReadmeCode: rewrite the README's Go blocks from the functions they name")

// readmeCode marks a Go block of the README with the functions it shows:
// "<!-- code: FILE NAME... -->" on the line before the block. An Example's body is
// shown; any other function whole, with its doc comment.
var readmeCode = regexp.MustCompile(`^<!-- code: (\S+)((?: \w+)+) -->$`)

// Every Go block of the README is the code of the functions it names, so that the
// README's code compiles and, through the Examples, runs. -update rewrites the
// blocks from the functions.
func TestReadmeCode(t *testing.T) {
	b, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(string(b), "\n")
	var out []string
	blocks := 0
	for i := 0; i < len(lines); i++ {
		line := lines[i]
		out = append(out, line)
		if line != "```go" {
			continue
		}
		blocks++
		end := i + 1
		for end < len(lines) && lines[end] != "```" {
			end++
		}
		if end == len(lines) {
			t.Fatalf("README.md:%d: the Go block does not end", i+1)
		}
		var m []string
		if i > 0 {
			m = readmeCode.FindStringSubmatch(lines[i-1])
		}
		if m == nil {
			t.Errorf("README.md:%d: a Go block without a <!-- code: FILE NAME... --> line before it", i+1)
			out = append(out, lines[i+1:end]...)
			i = end - 1
			continue
		}
		want, err := functionsCode(m[1], strings.Fields(m[2]))
		if err != nil {
			t.Errorf("README.md:%d: %v", i, err)
			out = append(out, lines[i+1:end]...)
			i = end - 1
			continue
		}
		got := strings.Join(lines[i+1:end], "\n")
		if got != want && !*update {
			t.Errorf("README.md:%d: the block differs from %s%s (go test . -run TestReadmeCode -update rewrites it):\n--- README\n%s\n--- %s\n%s", i+1, m[1], m[2], got, m[1], want)
		}
		out = append(out, want)
		i = end - 1
	}
	if blocks == 0 {
		t.Error("README.md has no Go block: is the pattern still right?")
	}
	if *update {
		if err := os.WriteFile("README.md", []byte(strings.Join(out, "\n")), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// functionsCode returns the code of the named functions of a Go file, one after
// another: an Example's body, one tab less indented; another function's
// declaration with its doc comment.
func functionsCode(path string, names []string) (string, error) {
	src, err := os.ReadFile(path)
	if err != nil {
		return "", err
	}
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, path, src, parser.ParseComments)
	if err != nil {
		return "", err
	}
	var parts []string
	for _, name := range names {
		var fn *ast.FuncDecl
		for _, d := range f.Decls {
			if d, ok := d.(*ast.FuncDecl); ok && d.Recv == nil && d.Name.Name == name {
				fn = d
			}
		}
		if fn == nil {
			return "", fmt.Errorf("%s has no function %s", path, name)
		}
		off := func(p token.Pos) int { return fset.Position(p).Offset }
		if strings.HasPrefix(name, "Example") {
			body := strings.Trim(string(src[off(fn.Body.Lbrace)+1:off(fn.Body.Rbrace)]), "\n")
			var b strings.Builder
			for i, l := range strings.Split(body, "\n") {
				if i > 0 {
					b.WriteByte('\n')
				}
				b.WriteString(strings.TrimPrefix(l, "\t"))
			}
			parts = append(parts, b.String())
			continue
		}
		start := fn.Pos()
		if fn.Doc != nil {
			start = fn.Doc.Pos()
		}
		parts = append(parts, string(src[off(start):off(fn.End())]))
	}
	return strings.Join(parts, "\n\n"), nil
}
