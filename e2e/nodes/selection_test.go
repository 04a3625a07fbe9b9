package nodes

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"unicode"

	"github.com/nftproxy/nftproxy/internal/testutil/kubebin"
)

// kernelPackages are the packages whose kernel tests TestKernelTests runs
// on every release, in the order a node runs them.
var kernelPackages = []string{
	"nft/nftnl",
	"conntrack",
	"proxier",
	"proxier/ruleset",
	"proxier/localnodeport",
	"proxier/leftovers",
	"cmd/nftproxy",
}

// kernelMarkers are the functions whose callers are kernel tests: every
// test that programs the kernel does it in a namespace of its own
// (internal/testutil/netns).
var kernelMarkers = map[string]bool{"netns.New": true, "netns.Require": true}

// kernelTests returns the top-level tests of the package in dir (its
// _test.go files, both packages) that reach a kernelMarker, directly or
// through the functions and methods of those files. Methods are told
// apart by name only (no types): a test that calls a helper method of
// that name counts, which can only add a test, never lose one.
func kernelTests(dir string) ([]string, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*_test.go"))
	if err != nil {
		return nil, err
	}
	fset := token.NewFileSet()
	// calls: function or method name → the names it refers to.
	calls := map[string]map[string]bool{}
	var tests []string
	for _, file := range files {
		f, err := parser.ParseFile(fset, file, nil, parser.SkipObjectResolution)
		if err != nil {
			return nil, err
		}
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Body == nil {
				continue
			}
			name := fn.Name.Name
			if fn.Recv != nil {
				name = "." + name
			} else if isTestFunc(fn) {
				tests = append(tests, name)
			}
			refs := calls[name]
			if refs == nil {
				refs = map[string]bool{}
				calls[name] = refs
			}
			ast.Inspect(fn.Body, func(n ast.Node) bool {
				switch e := n.(type) {
				case *ast.SelectorExpr:
					if x, ok := e.X.(*ast.Ident); ok {
						refs[x.Name+"."+e.Sel.Name] = true
					}
					refs["."+e.Sel.Name] = true
				case *ast.Ident:
					refs[e.Name] = true
				}
				return true
			})
		}
	}
	reaches := map[string]bool{}
	for changed := true; changed; {
		changed = false
		for name, refs := range calls {
			if reaches[name] {
				continue
			}
			for ref := range refs {
				if kernelMarkers[ref] || reaches[ref] {
					reaches[name], changed = true, true
					break
				}
			}
		}
	}
	var kernel []string
	for _, name := range tests {
		if reaches[name] {
			kernel = append(kernel, name)
		}
	}
	slices.Sort(kernel)
	return kernel, nil
}

// isTestFunc says whether fn is a top-level test: TestXxx(t *testing.T).
func isTestFunc(fn *ast.FuncDecl) bool {
	name, ok := strings.CutPrefix(fn.Name.Name, "Test")
	if !ok || name != "" && unicode.IsLower(rune(name[0])) {
		return false
	}
	params := fn.Type.Params.List
	if len(params) != 1 {
		return false
	}
	star, ok := params[0].Type.(*ast.StarExpr)
	if !ok {
		return false
	}
	sel, ok := star.X.(*ast.SelectorExpr)
	return ok && sel.Sel.Name == "T"
}

// runPattern is the -test.run pattern that selects exactly tests.
func runPattern(tests []string) string {
	return "^(" + strings.Join(tests, "|") + ")$"
}

func TestKernelTestSelection(t *testing.T) {
	root := kubebin.RepoRoot()
	for _, pkg := range kernelPackages {
		tests, err := kernelTests(filepath.Join(root, pkg))
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: %d kernel tests: %s", pkg, len(tests), strings.Join(tests, " "))
		if len(tests) == 0 {
			t.Errorf("%s: no kernel test found", pkg)
		}
	}
	for _, tc := range []struct {
		pkg       string
		in, notIn []string
	}{
		// Through newTestNS, a helper of the package.
		{"nft/nftnl", []string{"TestNetlinkTableOps", "TestKernelErrnos"}, []string{"TestDecodeReportsMalformed", "TestParseReplies"}},
		// Through a method of a helper type.
		{"conntrack", []string{"TestReconcileKernel", "TestCreateMatchesConntrackList"}, []string{"TestStale", "TestEncodeParse"}},
		{"proxier", []string{"TestKernelFirstSyncInPieces"}, []string{"TestFirstSyncInPieces"}},
		{"cmd/nftproxy", []string{"TestDiffAgainstKernel", "TestDumpLoadsInNft", "TestExplainAgainstKernel"}, []string{"TestNoProgramExecuted"}},
	} {
		tests, err := kernelTests(filepath.Join(root, tc.pkg))
		if err != nil {
			t.Fatal(err)
		}
		for _, name := range tc.in {
			if !slices.Contains(tests, name) {
				t.Errorf("%s: %s is not taken for a kernel test", tc.pkg, name)
			}
		}
		for _, name := range tc.notIn {
			if slices.Contains(tests, name) {
				t.Errorf("%s: %s is taken for a kernel test", tc.pkg, name)
			}
		}
	}
	if got, want := runPattern([]string{"TestA", "TestB"}), "^(TestA|TestB)$"; got != want {
		t.Errorf("runPattern = %q, want %q", got, want)
	}
}
