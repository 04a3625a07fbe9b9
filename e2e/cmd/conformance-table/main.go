// Command conformance-table writes the table of docs/conformance.md from the
// JUnit reports of `make conformance` (e2e/conformance): a row per test, a
// column per proxy, and why a test did not run.
//
//	go run ./e2e/cmd/conformance-table --set conformance \
//	    --junit nftproxy=bin/conformance/junit-nftproxy.xml \
//	    --junit kube-proxy=bin/conformance/junit-kube-proxy.xml \
//	    --doc docs/conformance.md
//
// The table replaces what is between the doc's markers for the set; without --doc it is
// printed. With --print-selection it prints the set's ginkgo --focus and
// --skip instead (to run the same selection by hand).
package main

import (
	"flag"
	"fmt"
	"os"
	"strings"

	"github.com/nftproxy/nftproxy/e2e/conformance"
)

type junitFlags []string

func (j *junitFlags) String() string     { return strings.Join(*j, ",") }
func (j *junitFlags) Set(v string) error { *j = append(*j, v); return nil }

func main() {
	var junits junitFlags
	set := flag.String("set", string(conformance.SetConformance), "the tests the reports' runs selected: conformance or sig-network")
	doc := flag.String("doc", "", "the Markdown file whose table to replace (default: print the table)")
	flag.Var(&junits, "junit", "PROXY=FILE: a proxy's JUnit report (repeatable, in column order)")
	selection := flag.Bool("print-selection", false, "print the set's ginkgo --focus and --skip, one a line, and exit")
	flag.Parse()
	if *selection {
		s := conformance.Set(*set)
		fmt.Printf("--focus=%s\n--skip=%s\n", s.Focus(), s.SkipPattern())
		return
	}
	if err := run(conformance.Set(*set), junits, *doc); err != nil {
		fmt.Fprintln(os.Stderr, "conformance-table:", err)
		os.Exit(1)
	}
}

func run(set conformance.Set, junits []string, doc string) error {
	if set != conformance.SetConformance && set != conformance.SetNetwork {
		return fmt.Errorf("--set %q: want %s or %s", set, conformance.SetConformance, conformance.SetNetwork)
	}
	if len(junits) == 0 {
		return fmt.Errorf("no --junit")
	}
	var cols []conformance.Column
	for _, j := range junits {
		proxy, file, ok := strings.Cut(j, "=")
		if !ok {
			return fmt.Errorf("--junit %q: want PROXY=FILE", j)
		}
		res, err := conformance.ReadJUnit(file)
		if err != nil {
			return err
		}
		cols = append(cols, conformance.Column{Proxy: proxy, Results: res})
	}
	table := conformance.Table(set, cols)
	if doc == "" {
		fmt.Print(table)
		return nil
	}
	old, err := os.ReadFile(doc)
	if err != nil {
		return err
	}
	updated, err := conformance.ReplaceTable(string(old), set, table)
	if err != nil {
		return fmt.Errorf("%s: %w", doc, err)
	}
	return os.WriteFile(doc, []byte(updated), 0o644)
}
