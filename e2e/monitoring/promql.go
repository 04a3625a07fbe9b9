package monitoring

import (
	"fmt"
	"slices"

	"github.com/prometheus/prometheus/model/labels"
	"github.com/prometheus/prometheus/promql/parser"
)

// Selection is one series selector of a query: the metric it reads, the
// label matchers it reads it with, and the labels the operations above it
// group or match by (by, without, on, ignoring, group_left/right), which
// must exist on the metric for the query to mean what it says.
type Selection struct {
	Metric   string
	Matchers []*labels.Matcher // without the metric name's
	Grouping []string
}

// Selections parses expr (no Grafana variables left) and returns its
// selections.
func Selections(expr string) ([]Selection, error) {
	e, err := parser.ParseExpr(expr)
	if err != nil {
		return nil, fmt.Errorf("parse %q: %w", expr, err)
	}
	var out []Selection
	parser.Inspect(e, func(node parser.Node, path []parser.Node) error {
		vs, ok := node.(*parser.VectorSelector)
		if !ok {
			return nil
		}
		sel := Selection{Metric: vs.Name, Grouping: grouping(path)}
		for _, m := range vs.LabelMatchers {
			if m.Name == labels.MetricName {
				sel.Metric = m.Value
				continue
			}
			sel.Matchers = append(sel.Matchers, m)
		}
		out = append(out, sel)
		return nil
	})
	return out, nil
}

// grouping collects the labels that the aggregations and vector matchings
// on path (a selector's ancestors) name.
func grouping(path []parser.Node) []string {
	var names []string
	for _, n := range path {
		switch n := n.(type) {
		case *parser.AggregateExpr:
			names = append(names, n.Grouping...)
		case *parser.BinaryExpr:
			if vm := n.VectorMatching; vm != nil {
				names = append(names, vm.MatchingLabels...)
				names = append(names, vm.Include...)
			}
		}
	}
	slices.Sort(names)
	return slices.Compact(names)
}

// Inner returns what an alert's expression is made of below its
// thresholds: the operands of comparisons with a number (both operands of
// a comparison of two vectors), of and/or/unless, and of absent(). Each
// returns series when the metrics behind the alert are there, whether or
// not the alert fires; the expression itself is empty while it is quiet.
func Inner(expr string) ([]string, error) {
	e, err := parser.ParseExpr(expr)
	if err != nil {
		return nil, fmt.Errorf("parse %q: %w", expr, err)
	}
	var out []string
	for _, in := range inner(e) {
		out = append(out, in.String())
	}
	return out, nil
}

func inner(e parser.Expr) []parser.Expr {
	switch n := e.(type) {
	case *parser.ParenExpr:
		return inner(n.Expr)
	case *parser.Call:
		if n.Func.Name == "absent" {
			return inner(n.Args[0])
		}
	case *parser.BinaryExpr:
		lScalar, rScalar := n.LHS.Type() == parser.ValueTypeScalar, n.RHS.Type() == parser.ValueTypeScalar
		switch {
		case n.Op.IsComparisonOperator() && rScalar:
			return inner(n.LHS)
		case n.Op.IsComparisonOperator() && lScalar:
			return inner(n.RHS)
		case n.Op.IsComparisonOperator() || n.Op.IsSetOperator():
			return append(inner(n.LHS), inner(n.RHS)...)
		}
	}
	return []parser.Expr{e}
}
