package dedupkit_test

import (
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
