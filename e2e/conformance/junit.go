package conformance

import (
	"encoding/xml"
	"fmt"
	"io"
	"maps"
	"os"
	"regexp"
	"slices"
	"strings"
)

// Result is one test's outcome in a JUnit report.
type Result struct {
	// Status is ginkgo's spec state: passed, failed, skipped, pending,
	// panicked, interrupted, aborted, timedout.
	Status string
	// Message is a skip's reason ("" for a test the run did not select) or
	// the first line of a failure.
	Message string
	// Seconds is how long the test ran.
	Seconds float64
}

// Ran reports whether the test ran (passed or not), rather than being
// skipped or left out by the run's selection.
func (r Result) Ran() bool { return r.Status != "skipped" && r.Status != "pending" && r.Status != "" }

// junitSuites is the part of the report upstream's framework writes
// (junit_01.xml under --report-dir, ginkgo's JUnit format with labels left
// out of the names) that we read.
type junitSuites struct {
	Suites []struct {
		Cases []struct {
			Name    string  `xml:"name,attr"`
			Status  string  `xml:"status,attr"`
			Time    float64 `xml:"time,attr"`
			Skipped *struct {
				Message string `xml:"message,attr"`
			} `xml:"skipped"`
			Failure *struct {
				Message string `xml:"message,attr"`
				Text    string `xml:",chardata"`
			} `xml:"failure"`
			Error *struct {
				Message string `xml:"message,attr"`
				Text    string `xml:",chardata"`
			} `xml:"error"`
		} `xml:"testcase"`
	} `xml:"testsuite"`
}

// ParseJUnit reads a JUnit report of the suite and returns each test's
// result by its full text ("[sig-network] Services should ..."). Suite nodes
// ([SynchronizedBeforeSuite], [ReportAfterSuite], ...) are left out: only
// "[It]" cases are tests.
func ParseJUnit(r io.Reader) (map[string]Result, error) {
	var doc junitSuites
	if err := xml.NewDecoder(r).Decode(&doc); err != nil {
		return nil, fmt.Errorf("JUnit report: %w", err)
	}
	results := map[string]Result{}
	for _, s := range doc.Suites {
		for _, c := range s.Cases {
			name, ok := strings.CutPrefix(c.Name, "[It] ")
			if !ok {
				continue
			}
			res := Result{Status: c.Status, Seconds: c.Time}
			switch {
			case c.Skipped != nil:
				// "skipped" for a test left out by --focus/--skip,
				// "skipped - REASON" for one that called Skip.
				res.Message = strings.TrimPrefix(strings.TrimPrefix(c.Skipped.Message, "skipped"), " - ")
			case c.Failure != nil:
				res.Message = firstLine(c.Failure.Message, c.Failure.Text)
			case c.Error != nil:
				res.Message = firstLine(c.Error.Message, c.Error.Text)
			}
			results[name] = res
		}
	}
	if len(results) == 0 {
		return nil, fmt.Errorf("JUnit report holds no test")
	}
	return results, nil
}

// ReadJUnit is ParseJUnit of a file.
func ReadJUnit(path string) (map[string]Result, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	res, err := ParseJUnit(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return res, nil
}

// firstLine is the first non-empty line of the first non-empty text.
func firstLine(texts ...string) string {
	for _, t := range texts {
		for _, l := range strings.Split(t, "\n") {
			if l = strings.TrimSpace(l); l != "" {
				return l
			}
		}
	}
	return ""
}

// Column is one proxy's results.
type Column struct {
	Proxy   string
	Results map[string]Result
}

// Table is the Markdown table of docs/conformance.md: a row per test of the
// set's focus that a column knows (a report lists every test of the suite,
// those its run left out as skipped without a reason), sorted by name; a
// column per proxy; a last column with why a test did not run: the reason
// of the Skips entry that covers it (SetNetwork) or the test's own Skip.
// Before it, a count per proxy.
func Table(set Set, cols []Column) string {
	focus := regexp.MustCompile(set.Focus())
	names := map[string]bool{}
	for _, c := range cols {
		for name := range c.Results {
			if focus.MatchString(name) {
				names[name] = true
			}
		}
	}
	sorted := slices.Sorted(maps.Keys(names))

	var b strings.Builder
	for _, c := range cols {
		counts := map[string]int{}
		for _, n := range sorted {
			counts[cell(c.Results[n])]++
		}
		fmt.Fprintf(&b, "- %s: %d passed, %d failed, %d skipped, %d not run (of %d)\n", c.Proxy,
			counts["passed"], counts["**failed**"], counts["skipped"], counts["—"], len(sorted))
	}
	b.WriteString("\n| Test |")
	for _, c := range cols {
		b.WriteString(" " + c.Proxy + " |")
	}
	b.WriteString(" Why not run |\n|---|")
	for range cols {
		b.WriteString("---|")
	}
	b.WriteString("---|\n")
	for _, n := range sorted {
		fmt.Fprintf(&b, "| %s |", escapeCell(n))
		reason := ""
		if set == SetNetwork {
			reason = SkipReason(n)
		}
		for _, c := range cols {
			r := c.Results[n]
			b.WriteString(" " + cell(r) + " |")
			if reason == "" && r.Status == "skipped" && r.Message != "" {
				reason = "the test skips itself: " + r.Message
			}
		}
		fmt.Fprintf(&b, " %s |\n", escapeCell(reason))
	}
	return b.String()
}

// cell is a result as the table shows it.
func cell(r Result) string {
	switch r.Status {
	case "passed":
		return "passed"
	case "":
		return "—"
	case "skipped", "pending":
		if r.Message == "" {
			return "—" // not selected by that run
		}
		return "skipped"
	default:
		return "**failed**"
	}
}

// escapeCell keeps a test name or message from breaking the table.
func escapeCell(s string) string {
	return strings.NewReplacer("|", `\|`, "\n", " ").Replace(s)
}

// markers delimit the generated table of a set in docs/conformance.md.
func markers(set Set) (begin, end string) {
	return "<!-- BEGIN " + string(set) + " table: generated by e2e/cmd/conformance-table; do not edit -->",
		"<!-- END " + string(set) + " table -->"
}

// ReplaceTable returns doc with the text between the set's markers replaced
// by table; a doc without the markers is an error, so a table never lands
// where nobody looks for it.
func ReplaceTable(doc string, set Set, table string) (string, error) {
	begin, end := markers(set)
	i := strings.Index(doc, begin)
	j := strings.Index(doc, end)
	if i < 0 || j < i {
		return "", fmt.Errorf("no %q ... %q markers", begin, end)
	}
	return doc[:i+len(begin)] + "\n" + table + doc[j:], nil
}
