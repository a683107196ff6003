// Package docscheck holds tests over the repository's Markdown documents:
// docs/compatibility.md must render as the tables it means to be and every
// test it cites must exist, and no document a clone ships may point at files
// outside the repository.
package docscheck

import (
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"testing"
)

// repoRoot walks up from the test's directory to the directory holding go.mod.
func repoRoot(t *testing.T) string {
	t.Helper()
	dir, err := os.Getwd()
	if err != nil {
		t.Fatal(err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			t.Fatal("go.mod not found above the test directory")
		}
		dir = parent
	}
}

var testFuncRe = regexp.MustCompile(`(?m)^func ((?:Test|Fuzz|Benchmark)[A-Z0-9_]\w*)\(`)

// testFuncs maps every Test/Fuzz/Benchmark function name declared in a
// *_test.go file of the module to the package directories (relative to the
// root, slash-separated) that declare it.
func testFuncs(t *testing.T, root string) map[string][]string {
	t.Helper()
	funcs := map[string][]string{}
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			name := d.Name()
			// shared/ is the project's reference material, not module code.
			if path != root && (strings.HasPrefix(name, ".") || name == "testdata" || name == "shared" || name == "bin") {
				return filepath.SkipDir
			}
			return nil
		}
		if !strings.HasSuffix(path, "_test.go") {
			return nil
		}
		src, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(root, filepath.Dir(path))
		if err != nil {
			return err
		}
		for _, m := range testFuncRe.FindAllSubmatch(src, -1) {
			funcs[string(m[1])] = append(funcs[string(m[1])], filepath.ToSlash(rel))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return funcs
}

// splitRow splits a Markdown table row on the pipes that GitHub's renderer
// treats as cell separators: every `|` not preceded by a backslash, inside
// code spans too.
func splitRow(line string) []string {
	line = strings.TrimSpace(line)
	line = strings.TrimPrefix(line, "|")
	if strings.HasSuffix(line, "|") && !strings.HasSuffix(line, `\|`) {
		line = line[:len(line)-1]
	}
	var cells []string
	var cur strings.Builder
	for i := 0; i < len(line); i++ {
		switch {
		case line[i] == '\\' && i+1 < len(line) && line[i+1] == '|':
			cur.WriteString(`\|`)
			i++
		case line[i] == '|':
			cells = append(cells, strings.TrimSpace(cur.String()))
			cur.Reset()
		default:
			cur.WriteByte(line[i])
		}
	}
	return append(cells, strings.TrimSpace(cur.String()))
}

// row is one body row of a Markdown table in docs/compatibility.md.
type row struct {
	line   int
	header []string
	cells  []string
}

var separatorRe = regexp.MustCompile(`^\|(\s*:?-+:?\s*\|)+\s*$`)

// tables returns every body row of every table in the document, with the
// header of its table.
func tables(t *testing.T, text string) []row {
	t.Helper()
	lines := strings.Split(text, "\n")
	var rows []row
	for i := 0; i+1 < len(lines); i++ {
		if !strings.HasPrefix(lines[i], "|") || !separatorRe.MatchString(strings.TrimSpace(lines[i+1])) {
			continue
		}
		header := splitRow(lines[i])
		j := i + 2
		for ; j < len(lines) && strings.HasPrefix(lines[j], "|"); j++ {
			rows = append(rows, row{line: j + 1, header: header, cells: splitRow(lines[j])})
		}
		i = j - 1
	}
	return rows
}

// citation is one test a row names, with the package qualifiers around it.
type citation struct {
	name string
	pkg  string // `pkg.TestX` or `pkg TestX`: the last element of the package path
	dir  string // `TestX (`internal/pkg`)`: the package directory
}

var citationRe = regexp.MustCompile(`(?:([a-z][a-z0-9/]*)[. ])?((?:Test|Fuzz|Benchmark)[A-Z0-9_][A-Za-z0-9_]*)(?:/[^\s,]+)?(?:\s*\(subtests? [^)]*\))?(?:\s*\(((?:internal|cmd|deploy)[a-z0-9/]*)\))?`)

// citations extracts the tests named in a test cell.
func citations(cell string) []citation {
	var out []citation
	for _, m := range citationRe.FindAllStringSubmatch(strings.ReplaceAll(cell, "`", ""), -1) {
		c := citation{name: m[2], pkg: m[1], dir: m[3]}
		out = append(out, c)
	}
	return out
}

// resolves reports whether a citation names a declared test function in the
// package it says (any package when unqualified).
func resolves(c citation, funcs map[string][]string) bool {
	for _, dir := range funcs[c.name] {
		switch {
		case c.dir != "":
			if dir == c.dir {
				return true
			}
		case c.pkg != "":
			if dir == c.pkg || strings.HasSuffix(dir, "/"+c.pkg) {
				return true
			}
		default:
			return true
		}
	}
	return false
}

func readCompat(t *testing.T) (string, string) {
	t.Helper()
	root := repoRoot(t)
	b, err := os.ReadFile(filepath.Join(root, "docs", "compatibility.md"))
	if err != nil {
		t.Fatal(err)
	}
	return root, string(b)
}

// TestCompatibilityRowsHaveHeaderCellCount fails on a row whose unescaped `|`
// (for example inside a code span such as `a|b`) splits it into more cells than
// its table's header, which GitHub renders as a broken row.
func TestCompatibilityRowsHaveHeaderCellCount(t *testing.T) {
	_, text := readCompat(t)
	rows := tables(t, text)
	if len(rows) < 300 {
		t.Fatalf("found %d table rows in docs/compatibility.md, want at least 300 (parser broken?)", len(rows))
	}
	for _, r := range rows {
		if len(r.cells) != len(r.header) {
			t.Errorf("docs/compatibility.md:%d: %d cells, header has %d (escape | inside cells as \\|): %.80s",
				r.line, len(r.cells), len(r.header), strings.Join(r.cells, " | "))
		}
	}
}

// TestCompatibilityCitedTestsExist fails on every test a row's test column
// names that no *_test.go file in the module declares (in the package the
// citation names, when it names one).
func TestCompatibilityCitedTestsExist(t *testing.T) {
	root, text := readCompat(t)
	funcs := testFuncs(t, root)
	if _, ok := funcs["TestCompatibilityCitedTestsExist"]; !ok {
		t.Fatal("the scan of *_test.go files did not find this test itself")
	}
	cited := 0
	for _, r := range tables(t, text) {
		col := -1
		for i, h := range r.header {
			if h == "test" {
				col = i
			}
		}
		if col < 0 || col >= len(r.cells) {
			continue
		}
		for _, c := range citations(r.cells[col]) {
			cited++
			if !resolves(c, funcs) {
				where := "the module"
				if c.dir != "" {
					where = c.dir
				} else if c.pkg != "" {
					where = "package " + c.pkg
				}
				have := append([]string(nil), funcs[c.name]...)
				sort.Strings(have)
				t.Errorf("docs/compatibility.md:%d cites %s, not declared in %s (declared in %v)", r.line, c.name, where, have)
			}
		}
	}
	if cited < 300 {
		t.Fatalf("found %d cited tests, want at least 300 (parser broken?)", cited)
	}
}

// TestCitationParsing pins the citation forms the document uses.
func TestCitationParsing(t *testing.T) {
	cases := map[string][]citation{
		"`e2e.TestA`, `TestB`": {{name: "TestA", pkg: "e2e"}, {name: "TestB"}},
		"TestShmName (`internal/kvwrap`), TestOpenRefuses (`internal/kvcopy`)": {
			{name: "TestShmName", dir: "internal/kvwrap"}, {name: "TestOpenRefuses", dir: "internal/kvcopy"}},
		"`cmd/lmcache TestUpstreamLogLineShape`":                    {{name: "TestUpstreamLogLineShape", pkg: "cmd/lmcache"}},
		"`deploy.TestFleetFromManifests` (subtest `BuildIdentity`)": {{name: "TestFleetFromManifests", pkg: "deploy"}},
		"TestPythonInterop/gen3, FuzzDecode (`internal/kvwrap`)":    {{name: "TestPythonInterop"}, {name: "FuzzDecode", dir: "internal/kvwrap"}},
		"—": nil,
	}
	for in, want := range cases {
		got := citations(in)
		if len(got) != len(want) {
			t.Errorf("citations(%q) = %+v, want %+v", in, got, want)
			continue
		}
		for i := range got {
			if got[i] != want[i] {
				t.Errorf("citations(%q)[%d] = %+v, want %+v", in, i, got[i], want[i])
			}
		}
	}
	if got := splitRow("| a | `x\\|y` | c |"); len(got) != 3 || got[1] != "`x\\|y`" {
		t.Errorf("splitRow escaped pipe: %q", got)
	}
	if got := splitRow("| a | `x|y` | c |"); len(got) != 4 {
		t.Errorf("splitRow unescaped pipe: %q, want 4 cells", got)
	}
}

// TestDocsStayInsideTheRepository fails when README.md, ARCHITECTURE.md,
// BENCHMARKS.md or a document under docs/ points at files outside the
// repository (the project's shared spec and research notes are not part of
// a clone).
func TestDocsStayInsideTheRepository(t *testing.T) {
	root := repoRoot(t)
	files := []string{"README.md", "ARCHITECTURE.md", "BENCHMARKS.md"}
	docs, err := filepath.Glob(filepath.Join(root, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	if len(docs) == 0 {
		t.Fatal("no docs/*.md found")
	}
	for _, d := range docs {
		rel, _ := filepath.Rel(root, d)
		files = append(files, rel)
	}
	// The notes were once cited as "research 10.3" or "research §14" and by
	// file name (research/mp_server.md); a reader of a clone has neither.
	outside := regexp.MustCompile(`\.\./shared|shared/research|shared/spec|research/[a-z_]+\.md|\bresearch (§|[0-9])`)
	for _, f := range files {
		b, err := os.ReadFile(filepath.Join(root, f))
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range strings.Split(string(b), "\n") {
			if m := outside.FindString(line); m != "" {
				t.Errorf("%s:%d refers to %q, outside the repository", f, i+1, m)
			}
		}
	}
}
