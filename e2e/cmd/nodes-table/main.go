// Command nodes-table writes the tables of docs/nodes.md from the results
// `make nodes` left (bin/nodes/<suite>/results.json, e2e/nodes): per
// release and package the tests that passed, failed and skipped, why each
// skipped, and how long each part of the run took.
//
//	go run ./e2e/cmd/nodes-table --results bin/nodes --doc docs/nodes.md
//
// The tables replace what is between the doc's markers (<!-- nodes-table -->
// and <!-- /nodes-table -->); without --doc they are printed.
package main

import (
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/nftproxy/nftproxy/e2e/nodes"
)

const (
	beginMarker = "<!-- nodes-table -->"
	endMarker   = "<!-- /nodes-table -->"
)

func main() {
	results := flag.String("results", "bin/nodes", "the directory of the releases' results (NFTPROXY_NODES_OUT)")
	doc := flag.String("doc", "", "the Markdown file whose tables to replace (default: print them)")
	flag.Parse()
	if err := run(*results, *doc); err != nil {
		fmt.Fprintln(os.Stderr, "nodes-table:", err)
		os.Exit(1)
	}
}

func run(dir, doc string) error {
	rs, err := nodes.ReadResults(dir)
	if err != nil {
		return err
	}
	if len(rs) == 0 {
		return fmt.Errorf("no results.json under %s (make nodes)", dir)
	}
	tables := markdown(rs)
	if doc == "" {
		fmt.Print(tables)
		return nil
	}
	b, err := os.ReadFile(doc)
	if err != nil {
		return err
	}
	before, rest, ok := strings.Cut(string(b), beginMarker)
	_, after, ok2 := strings.Cut(rest, endMarker)
	if !ok || !ok2 {
		return fmt.Errorf("%s has no %s … %s", doc, beginMarker, endMarker)
	}
	return os.WriteFile(doc, []byte(before+beginMarker+"\n"+tables+endMarker+after), 0o644)
}

// markdown is the tables: counts per package and release, run times,
// and the skips with their reasons.
func markdown(rs []nodes.ReleaseResults) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Run of %s (UTC). Top-level tests passed / failed / skipped:\n\n", dates(rs))
	b.WriteString("| Package |")
	for _, r := range rs {
		fmt.Fprintf(&b, " %s (%s, nft %s) |", r.Name(), short(r.Kernel), short(r.Tools["nft"]))
	}
	b.WriteString("\n|---|")
	for range rs {
		b.WriteString("---|")
	}
	b.WriteString("\n")
	for _, pkg := range packages(rs) {
		fmt.Fprintf(&b, "| %s |", pkg)
		for _, r := range rs {
			p := find(r, pkg)
			if p == nil {
				b.WriteString(" — |")
				continue
			}
			fmt.Fprintf(&b, " %d / %d / %d", p.Pass, p.Fail, p.Skip)
			if p.Incomplete+len(p.Missing) > 0 {
				fmt.Fprintf(&b, " (%d never ended, %d never ran)", p.Incomplete, len(p.Missing))
			}
			b.WriteString(" |")
		}
		b.WriteString("\n")
	}

	b.WriteString("\nTimes (the guest's, under software emulation, one CPU):\n\n| |")
	for _, r := range rs {
		fmt.Fprintf(&b, " %s |", r.Name())
	}
	b.WriteString("\n|---|")
	for range rs {
		b.WriteString("--:|")
	}
	b.WriteString("\n| QEMU start to `/init` |")
	for _, r := range rs {
		fmt.Fprintf(&b, " %s |", secs(r.Boot))
	}
	b.WriteString("\n| loading the modules |")
	for _, r := range rs {
		fmt.Fprintf(&b, " %s |", secs(r.Setup))
	}
	for _, pkg := range packages(rs) {
		fmt.Fprintf(&b, "\n| %s |", pkg)
		for _, r := range rs {
			if p := find(r, pkg); p != nil {
				fmt.Fprintf(&b, " %s |", secs(p.Elapsed))
			} else {
				b.WriteString(" — |")
			}
		}
	}
	b.WriteString("\n| whole run (boot to power-off) |")
	for _, r := range rs {
		fmt.Fprintf(&b, " %s |", secs(r.Duration))
	}
	b.WriteString("\n")

	b.WriteString("\nWhat skipped, and why (subtests too; the reasons are the tests' own):\n\n")
	for _, r := range rs {
		var lines []string
		for _, p := range r.Packages {
			byReason := map[string][]string{}
			var reasons []string
			for _, t := range p.Tests {
				if t.Action != "skip" {
					continue
				}
				if byReason[t.Reason] == nil {
					reasons = append(reasons, t.Reason)
				}
				byReason[t.Reason] = append(byReason[t.Reason], t.Name)
			}
			for _, reason := range reasons {
				lines = append(lines, fmt.Sprintf("  - %s: %s — %s", p.Package, strings.Join(byReason[reason], ", "), reason))
			}
		}
		fmt.Fprintf(&b, "- **%s**", r.Name())
		if len(lines) == 0 {
			b.WriteString(": none\n")
			continue
		}
		b.WriteString(":\n" + strings.Join(lines, "\n") + "\n")
	}
	var failed []string
	for _, r := range rs {
		for _, p := range r.Packages {
			for _, t := range p.Tests {
				if t.Action == "fail" || t.Action == "incomplete" {
					failed = append(failed, fmt.Sprintf("%s, %s: %s %s", r.Name(), p.Package, t.Name, t.Action))
				}
			}
		}
	}
	if len(failed) > 0 {
		b.WriteString("\nFailed:\n\n- " + strings.Join(failed, "\n- ") + "\n")
	}
	return b.String()
}

// packages are the packages of every release's results, in run order.
func packages(rs []nodes.ReleaseResults) []string {
	var out []string
	for _, r := range rs {
		for _, p := range r.Packages {
			if !slices.Contains(out, p.Package) {
				out = append(out, p.Package)
			}
		}
	}
	return out
}

func find(r nodes.ReleaseResults, pkg string) *nodes.PackageResults {
	for i := range r.Packages {
		if r.Packages[i].Package == pkg {
			return &r.Packages[i]
		}
	}
	return nil
}

// dates is the runs' dates, e.g. "2026-11-28".
func dates(rs []nodes.ReleaseResults) string {
	var ds []string
	for _, r := range rs {
		if d, _, _ := strings.Cut(r.Date, "T"); !slices.Contains(ds, d) {
			ds = append(ds, d)
		}
	}
	return strings.Join(ds, ", ")
}

// short is a version without its Debian revision or flavour: "6.1.0-56-amd64"
// → "6.1.0-56", "1.0.6-2+deb12u2" → "1.0.6".
func short(v string) string {
	if strings.Contains(v, "amd64") {
		return strings.TrimSuffix(v, "-amd64")
	}
	v, _, _ = strings.Cut(v, "-")
	return v
}

func secs(s float64) string {
	d := time.Duration(s * float64(time.Second))
	if d >= time.Minute {
		return d.Round(time.Second).String()
	}
	return d.Round(100 * time.Millisecond).String()
}
