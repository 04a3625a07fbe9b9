package docs

import (
	"bufio"
	"fmt"
	"go/build"
	"maps"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// module is the import path of the repository's module.
const module = "github.com/nftproxy/nftproxy"

// libraries are the third-party modules architecture.md names in its
// "Depends on" column, by the name it gives them. Another third-party
// import (pflag, yaml, x/sys...) is not listed there.
var libraries = map[string]string{
	"client-go":        "k8s.io/client-go",
	"k8s.io/api":       "k8s.io/api",
	"apimachinery":     "k8s.io/apimachinery",
	"component-base":   "k8s.io/component-base",
	"kube-proxy":       "k8s.io/kube-proxy",
	"klog":             "k8s.io/klog/v2",
	"client_golang":    "github.com/prometheus/client_golang",
	"mdlayher/netlink": "github.com/mdlayher/netlink",
	"google/nftables":  "github.com/google/nftables",
}

// row is one line of the package table: the packages of its first cell
// and what its "Depends on" cell names.
type row struct {
	line      int
	packages  []string
	dependsOn map[string]bool // packages of the module and names of libraries
}

var backticked = regexp.MustCompile("`([^`]+)`")

// packageTable reads the table under "## Packages" in architecture.md.
func packageTable(t *testing.T) []row {
	t.Helper()
	f, err := os.Open("architecture.md")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var rows []row
	in := false
	sc := bufio.NewScanner(f)
	for n := 1; sc.Scan(); n++ {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "## "):
			in = line == "## Packages"
			continue
		case !in || !strings.HasPrefix(line, "| `"):
			continue
		}
		cells := strings.Split(strings.Trim(line, "|"), " | ")
		if len(cells) != 3 {
			t.Fatalf("architecture.md:%d: %d cells, want 3 (package | job | depends on)", n, len(cells))
		}
		r := row{line: n, dependsOn: map[string]bool{}}
		for _, m := range backticked.FindAllStringSubmatch(cells[0], -1) {
			r.packages = append(r.packages, m[1])
		}
		for _, dep := range strings.Split(strings.TrimSpace(cells[2]), ", ") {
			if dep == "—" {
				continue
			}
			if m := backticked.FindStringSubmatch(dep); m != nil {
				r.dependsOn[m[1]] = true
			} else if _, ok := libraries[dep]; ok {
				r.dependsOn[dep] = true
			} else {
				t.Errorf("architecture.md:%d: %q in \"Depends on\" is neither a `package` nor one of %v", n, dep, slices.Sorted(maps.Keys(libraries)))
			}
		}
		rows = append(rows, r)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return rows
}

// modulePackages returns the packages of the module below the repository
// root, by directory relative to it ("proxier/watch"), with their imports
// (tests' left out). e2e/ (its own README) and nested modules are not
// walked.
func modulePackages(t *testing.T) map[string][]string {
	t.Helper()
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	pkgs := map[string][]string{}
	err = filepath.WalkDir(root, func(path string, d os.DirEntry, err error) error {
		if err != nil || !d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(root, path)
		base := d.Name()
		if path != root && (strings.HasPrefix(base, ".") || base == "testdata" || rel == "e2e" || rel == "docs") {
			return filepath.SkipDir
		}
		if _, err := os.Stat(filepath.Join(path, "go.mod")); err == nil && path != root {
			return filepath.SkipDir // a module of its own (deploy/image)
		}
		p, err := build.Default.ImportDir(path, 0)
		if err != nil {
			return nil // no Go files
		}
		pkgs[filepath.ToSlash(rel)] = p.Imports
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return pkgs
}

// TestArchitectureTable: every package of the module has one row in
// docs/architecture.md's table, and each row's "Depends on" names exactly
// the module's packages it imports and the listed libraries it imports.
func TestArchitectureTable(t *testing.T) {
	pkgs := modulePackages(t)
	rows := packageTable(t)
	documented := map[string]int{}
	for _, r := range rows {
		in := map[string]bool{}
		for _, p := range r.packages {
			if prev, ok := documented[p]; ok {
				t.Errorf("architecture.md:%d: %s, already on line %d", r.line, p, prev)
			}
			documented[p] = r.line
			in[p] = true
		}
		want := map[string]bool{}
		for _, p := range r.packages {
			imports, ok := pkgs[p]
			if !ok {
				t.Errorf("architecture.md:%d: no package %s in the module", r.line, p)
				continue
			}
			for _, imp := range imports {
				if dep := dependency(imp); dep != "" && !in[dep] {
					want[dep] = true
				}
			}
		}
		if got := slices.Sorted(maps.Keys(r.dependsOn)); !slices.Equal(got, slices.Sorted(maps.Keys(want))) {
			t.Errorf("architecture.md:%d: %s depends on %s, the table says %s", r.line, strings.Join(r.packages, ", "),
				list(want), list(r.dependsOn))
		}
	}
	for _, p := range slices.Sorted(maps.Keys(pkgs)) {
		if _, ok := documented[p]; !ok {
			t.Errorf("package %s has no row in docs/architecture.md's table", p)
		}
	}
}

// dependency is what the table calls import path imp: a package of the
// module, one of the libraries, or "" (any other).
func dependency(imp string) string {
	if rest, ok := strings.CutPrefix(imp, module+"/"); ok {
		return rest
	}
	for name, path := range libraries {
		if imp == path || strings.HasPrefix(imp, path+"/") {
			return name
		}
	}
	return ""
}

func list(m map[string]bool) string {
	if len(m) == 0 {
		return "—"
	}
	var out []string
	for _, k := range slices.Sorted(maps.Keys(m)) {
		if _, lib := libraries[k]; lib {
			out = append(out, k)
		} else {
			out = append(out, fmt.Sprintf("`%s`", k))
		}
	}
	return strings.Join(out, ", ")
}
