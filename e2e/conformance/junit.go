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

// Failed reports whether the result is a failure of any kind (failed,
// panicked, interrupted, aborted, timed out).
func (r Result) Failed() bool {
	switch r.Status {
	case "passed", "skipped", "pending", "":
		return false
	}
	return true
}

// Report is a JUnit report of the suite.
type Report struct {
	// Tests are the specs ("[It]" cases) by full text ("[sig-network]
	// Services should ..."): every spec of the suite, those the run's
	// selection left out as skipped without a reason.
	Tests map[string]Result
	// Suite are the suite-level nodes the run ran
	// ([SynchronizedBeforeSuite], [SynchronizedAfterSuite],
	// [ReportAfterSuite] ..., [DeferCleanup (Suite)]), in report order:
	// one that fails fails the run although no test shows it.
	Suite []SuiteNode
}

// SuiteNode is a suite-level node's result.
type SuiteNode struct {
	Name string
	Result
}

// ParseJUnit reads a JUnit report of the suite.
func ParseJUnit(r io.Reader) (Report, error) {
	var doc junitSuites
	if err := xml.NewDecoder(r).Decode(&doc); err != nil {
		return Report{}, fmt.Errorf("JUnit report: %w", err)
	}
	rep := Report{Tests: map[string]Result{}}
	for _, s := range doc.Suites {
		for _, c := range s.Cases {
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
			if name, ok := strings.CutPrefix(c.Name, "[It] "); ok {
				rep.Tests[name] = res
			} else {
				rep.Suite = append(rep.Suite, SuiteNode{Name: c.Name, Result: res})
			}
		}
	}
	if len(rep.Tests) == 0 {
		return Report{}, fmt.Errorf("JUnit report holds no test")
	}
	return rep, nil
}

// ReadJUnit is ParseJUnit of a file.
func ReadJUnit(path string) (Report, error) {
	f, err := os.Open(path)
	if err != nil {
		return Report{}, err
	}
	defer f.Close()
	rep, err := ParseJUnit(f)
	if err != nil {
		return Report{}, fmt.Errorf("%s: %w", path, err)
	}
	return rep, nil
}

// Count is what a run of a selection did, from its report.
type Count struct {
	// Tests is how many tests the report holds, Selected how many of them
	// the selection selects.
	Tests, Selected int
	// Ran is how many selected tests ran: Passed passed, Failed did not.
	Ran, Passed, Failed int
	// SkippedAccepted is how many selected tests skipped themselves for a
	// reason SelfSkips accepts, SkippedRejected for another reason.
	SkippedAccepted, SkippedRejected int
	// NotRun is how many selected tests the run did not get to.
	NotRun int
	// Problems are the run's errors: each selected test that failed, that
	// skipped itself for a reason SelfSkips does not accept, or that did
	// not run (missing from the report, or left out without a reason: an
	// interrupted run), and each suite node that failed.
	Problems []string
}

// OK reports whether every selected test passed or skipped itself for an
// accepted reason, and no suite node failed.
func (c Count) OK() bool { return len(c.Problems) == 0 && c.Selected > 0 }

// Check counts a report against the selection of its run. names are every
// test the run should have found (nil: those of the report); a name the
// report lacks is a problem when selected.
func Check(sel Selection, rep Report, names []string) Count {
	if names == nil {
		names = slices.Collect(maps.Keys(rep.Tests))
	}
	slices.Sort(names)
	c := Count{Tests: len(rep.Tests)}
	selected := sel.Matcher()
	for _, n := range names {
		if !selected(n) {
			continue
		}
		c.Selected++
		r, ok := rep.Tests[n]
		switch {
		case !ok:
			c.NotRun++
			c.Problems = append(c.Problems, n+": not in the report")
		case r.Status == "passed":
			c.Ran++
			c.Passed++
		case r.Failed():
			c.Ran++
			c.Failed++
			c.Problems = append(c.Problems, fmt.Sprintf("%s: %s: %s", n, r.Status, r.Message))
		case r.Message == "":
			c.NotRun++
			c.Problems = append(c.Problems, fmt.Sprintf("%s: %s without a reason: the run did not get to it", n, r.Status))
		case AcceptedSkip(n, r.Message) != "":
			c.SkippedAccepted++
		default:
			c.SkippedRejected++
			c.Problems = append(c.Problems, fmt.Sprintf("%s: skipped itself (%q), a reason SelfSkips does not accept", n, r.Message))
		}
	}
	for _, s := range rep.Suite {
		if s.Failed() {
			c.Problems = append(c.Problems, fmt.Sprintf("suite node %s: %s: %s", s.Name, s.Status, s.Message))
		}
	}
	if c.Selected == 0 {
		c.Problems = append(c.Problems, "the selection selects no test of the report")
	}
	return c
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

// Run is what a run of a set with one proxy records beside its JUnit
// report (run-PROXY.json): what it selected on this machine and how ginkgo
// ended.
type Run struct {
	Selection Selection `json:"selection"`
	// Ginkgo is ginkgo's error ("exit status 1"), "" when it exited 0.
	Ginkgo string `json:"ginkgo,omitempty"`
	// SuiteSeconds is how long ginkgo ran.
	SuiteSeconds float64 `json:"suiteSeconds"`
}

// Column is one proxy's run of a set.
type Column struct {
	Proxy  string
	Report Report
	Run    Run
}

// Count is Check of the column's report against its run's selection.
func (c Column) Count() Count { return Check(c.Run.Selection, c.Report, nil) }

// Table is the Markdown table of docs/conformance.md for a set: a row per
// test of the set's focus that a column's report holds (a report lists
// every test of the suite, those its run left out as skipped without a
// reason), sorted by name; a column per proxy; a last column with why a
// test did not run: the reason of the skip that left it out (the run's
// selection) or the reason the test gave when it skipped itself, and
// whether SelfSkips accepts it. Before it, the counts per proxy.
func Table(set Set, cols []Column) string {
	focus := regexp.MustCompile(set.Focus())
	names := map[string]bool{}
	for _, c := range cols {
		for name := range c.Report.Tests {
			if focus.MatchString(name) {
				names[name] = true
			}
		}
	}
	sorted := slices.Sorted(maps.Keys(names))

	var b strings.Builder
	for _, c := range cols {
		n := c.Count()
		ginkgo := "ginkgo exited 0"
		if c.Run.Ginkgo != "" {
			ginkgo = "**ginkgo: " + c.Run.Ginkgo + "**"
		}
		suite := "suite nodes passed"
		for _, s := range c.Report.Suite {
			if s.Failed() {
				suite = "**suite node " + s.Name + " " + s.Status + "**"
				break
			}
		}
		fmt.Fprintf(&b, "- %s: %d selected of %d; %d ran: %d passed, %d failed; %d skipped themselves for an accepted reason, %d for another; %d not run; %s, %s\n",
			c.Proxy, n.Selected, len(sorted), n.Ran, n.Passed, n.Failed, n.SkippedAccepted, n.SkippedRejected, n.NotRun, ginkgo, suite)
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
	matchers := make([]func(string) bool, len(cols))
	for i, c := range cols {
		matchers[i] = c.Run.Selection.Matcher()
	}
	for _, n := range sorted {
		fmt.Fprintf(&b, "| %s |", escapeCell(n))
		reason := ""
		for i, c := range cols {
			r := c.Report.Tests[n]
			selected := matchers[i](n)
			b.WriteString(" " + cell(r, selected) + " |")
			switch {
			case reason != "":
			case !selected:
				reason = c.Run.Selection.SkipReason(n)
			case r.Status == "skipped" && r.Message != "":
				reason = "the test skips itself: " + r.Message
				if why := AcceptedSkip(n, r.Message); why != "" {
					reason += " (accepted: " + why + ")"
				} else {
					reason += " (**not accepted**)"
				}
			}
		}
		fmt.Fprintf(&b, " %s |\n", escapeCell(reason))
	}
	return b.String()
}

// cell is a result as the table shows it: "—" for a test the run did not
// select, "**not run**" for one it selected and did not get to.
func cell(r Result, selected bool) string {
	switch {
	case !selected:
		return "—"
	case r.Status == "passed":
		return "passed"
	case r.Failed():
		return "**failed**"
	case r.Message != "":
		return "skipped"
	}
	return "**not run**"
}

// escapeCell keeps a test name or message from breaking the table.
func escapeCell(s string) string {
	return strings.NewReplacer("|", `\|`, "\n", " ").Replace(s)
}

// markers delimit the generated table of a set in a doc: on the IPv4-first
// bridge (docs/conformance.md) named by the set, on another cluster
// (docs/cnis.md) by its name and the set.
func markers(cluster Cluster, set Set) (begin, end string) {
	name := string(set)
	if !cluster.bridgeIPv4() {
		name = cluster.Name() + " " + name
	}
	return "<!-- BEGIN " + name + " table: generated by e2e/cmd/conformance-table; do not edit -->",
		"<!-- END " + name + " table -->"
}

// ReplaceTable returns doc with the text between the set's markers replaced
// by table; a doc without the markers is an error, so a table never lands
// where nobody looks for it.
func ReplaceTable(doc string, cluster Cluster, set Set, table string) (string, error) {
	begin, end := markers(cluster, set)
	i := strings.Index(doc, begin)
	j := strings.Index(doc, end)
	if i < 0 || j < i {
		return "", fmt.Errorf("no %q ... %q markers", begin, end)
	}
	return doc[:i+len(begin)] + "\n" + table + doc[j:], nil
}
