package nft

import (
	"fmt"
	"reflect"
	"strings"
)

// Drift is how a table read back from the kernel (Loader) differs from
// the desired one, object by object: what `nftproxy diff` reports. It
// uses Diff's own comparisons (definitions, element values, rule
// digests), so it is empty exactly when Diff's transaction is, but where a
// changed definition makes Diff rewrite the whole table, Drift names the
// set or chain whose definition differs and compares the rest as usual.
type Drift struct {
	Family   Family `json:"-"`
	IPFamily string // Family as Kubernetes names it, for JSON
	// NoTable: the kernel has no table of this family (or one Load
	// cannot read); everything desired is missing.
	NoTable bool
	Sets    []SetDrift   // by name
	Chains  []ChainDrift // by name
}

// Drift kinds of a set or chain.
const (
	DriftMissing    = "missing"    // desired, not in the kernel
	DriftExtra      = "extra"      // in the kernel, not desired
	DriftDefinition = "definition" // both have it, defined differently
	DriftContent    = "content"    // elements or rules differ
)

// SetDrift is one set or map that differs. The elements are in nft
// syntax (Set.ElementText), sorted.
type SetDrift struct {
	Name string
	Kind string
	// Have and Want are the kernel's and the desired definition, for
	// DriftDefinition.
	Have, Want string
	Missing    []string         `json:",omitempty"` // desired elements the kernel lacks
	Extra      []string         `json:",omitempty"` // kernel elements not desired
	Changed    []ElementChanged `json:",omitempty"` // same key, other value or comment
}

// ElementChanged is an element both have with different values.
type ElementChanged struct {
	Have, Want string
}

// ChainDrift is one chain that differs. The kernel's rules are not
// decoded (Load reads their count and digest), so a chain whose rules
// differ names the count it has and lists the rules desired.
type ChainDrift struct {
	Name       string
	Kind       string
	Have, Want string   // base chain definitions, for DriftDefinition
	HaveRules  int      // rules the kernel's chain holds
	Foreign    bool     `json:",omitempty"` // the kernel's chain has a policy or flags nftproxy never sets
	WantRules  []string `json:",omitempty"` // the desired rules, in nft syntax
	NoDigest   bool     `json:",omitempty"` // the kernel's rules carry no digest (written by someone else)
	DigestDiff bool     `json:",omitempty"` // same count, other rules
}

// Empty reports whether the tables are the same.
func (d *Drift) Empty() bool { return !d.NoTable && len(d.Sets) == 0 && len(d.Chains) == 0 }

// CompareLoaded returns how kernel, a table Load read back (nil: no
// table), differs from desired.
func CompareLoaded(kernel, desired *Ruleset) *Drift {
	d := &Drift{Family: desired.Family, IPFamily: desired.Family.IPFamily()}
	if kernel == nil {
		d.NoTable = true
		kernel = NewRuleset(desired.Family)
	}
	for _, name := range unionKeys(kernel.Sets, desired.Sets) {
		if sd, ok := compareSet(desired.Family, kernel.Sets[name], desired.Sets[name]); ok {
			d.Sets = append(d.Sets, sd)
		}
	}
	for _, name := range unionKeys(kernel.Chains, desired.Chains) {
		if cd, ok := compareChain(desired.Family, kernel.Chains[name], desired.Chains[name]); ok {
			d.Chains = append(d.Chains, cd)
		}
	}
	return d
}

func compareSet(f Family, have, want *Set) (SetDrift, bool) {
	switch {
	case have == nil:
		return SetDrift{Name: want.Name, Kind: DriftMissing, Want: setDefinition(f, want), Missing: elementTexts(want, &want.Elements)}, true
	case want == nil:
		return SetDrift{Name: have.Name, Kind: DriftExtra, Have: setDefinition(f, have), Extra: elementTexts(have, &have.Elements)}, true
	}
	sd := SetDrift{Name: want.Name, Kind: DriftContent}
	if !SameSetDefinition(have, want) {
		sd.Kind, sd.Have, sd.Want = DriftDefinition, setDefinition(f, have), setDefinition(f, want)
	}
	for _, k := range changedKeys(want, &have.Elements) {
		h, w := have.Elements.at(k), want.Elements.at(k)
		switch {
		case h == nil:
			sd.Missing = append(sd.Missing, want.ElementText(*w))
		case w == nil:
			sd.Extra = append(sd.Extra, have.ElementText(*h))
		default:
			sd.Changed = append(sd.Changed, ElementChanged{Have: have.ElementText(*h), Want: want.ElementText(*w)})
		}
	}
	return sd, sd.Kind == DriftDefinition || len(sd.Missing)+len(sd.Extra)+len(sd.Changed) > 0
}

// elementTexts returns the elements of es in nft syntax, sorted by key
// (keys sort as packed, which is the order Diff goes through them).
func elementTexts(s *Set, es *Elements) []string {
	var out []string
	for _, k := range sortedKeys(mapOf(es)) {
		out = append(out, s.ElementText(*es.at(k)))
	}
	return out
}

func mapOf(es *Elements) map[string]struct{} {
	m := make(map[string]struct{}, es.Len())
	for k := range es.each() {
		m[k] = struct{}{}
	}
	return m
}

// setDefinition is the set's definition as one line of nft syntax.
func setDefinition(f Family, s *Set) string {
	bare := *s
	bare.Elements = Elements{}
	return oneLine(NewRuleset(f).dumpSet(&bare))
}

func compareChain(f Family, have, want *Chain) (ChainDrift, bool) {
	switch {
	case have == nil:
		return ChainDrift{Name: want.Name, Kind: DriftMissing, Want: baseText(want.Base), WantRules: ruleTexts(f, want.Rules)}, true
	case want == nil:
		return ChainDrift{Name: have.Name, Kind: DriftExtra, Have: baseText(have.Base), HaveRules: haveCount(have)}, true
	}
	cd := ChainDrift{Name: want.Name, Kind: DriftContent, HaveRules: haveCount(have)}
	if have.Loaded != nil {
		cd.Foreign, cd.NoDigest = have.Loaded.Foreign, have.Loaded.Count > 0 && !have.Loaded.HasDigest
	}
	if !reflect.DeepEqual(have.Base, want.Base) || cd.Foreign {
		cd.Kind, cd.Have, cd.Want = DriftDefinition, baseText(have.Base), baseText(want.Base)
	}
	sameRules := sameRules(f, have, want)
	if !sameRules {
		cd.WantRules = ruleTexts(f, want.Rules)
		cd.DigestDiff = cd.HaveRules == len(want.Rules) && !cd.NoDigest
	}
	return cd, cd.Kind == DriftDefinition || !sameRules
}

func haveCount(c *Chain) int {
	if c.Loaded != nil {
		return c.Loaded.Count
	}
	return len(c.Rules)
}

func ruleTexts(f Family, rules []Rule) []string {
	out := make([]string, len(rules))
	for i, r := range rules {
		out[i] = r.Text(f)
	}
	return out
}

// baseText is a base chain's definition as nft lists it, "" for a
// regular chain.
func baseText(b *BaseChain) string {
	if b == nil {
		return ""
	}
	return fmt.Sprintf("type %s hook %s priority %s", b.Type, b.Hook, PriorityText(b.Hook, b.Priority))
}

// oneLine joins the lines of a block of nft syntax with "; ".
func oneLine(block string) string {
	var parts []string
	for _, l := range strings.Split(block, "\n") {
		if l = strings.TrimSpace(l); l != "" {
			parts = append(parts, l)
		}
	}
	return strings.Join(parts, " ")
}

// Text is the drift as `nftproxy diff` prints it: one paragraph per set
// or chain, headed by what differs, the elements and rules in nft syntax
// below it ("-" the kernel has, "+" desired), "" when there is none.
func (d *Drift) Text() string {
	var b strings.Builder
	table := fmt.Sprintf("table %s %s", d.Family, TableName)
	if d.NoTable {
		fmt.Fprintf(&b, "%s: missing in the kernel\n", table)
	}
	for _, s := range d.Sets {
		writeSetDrift(&b, table, s)
	}
	for _, c := range d.Chains {
		writeChainDrift(&b, table, c)
	}
	return b.String()
}

func writeSetDrift(b *strings.Builder, table string, s SetDrift) {
	switch s.Kind {
	case DriftMissing:
		fmt.Fprintf(b, "%s: %s missing\n\t+ %s\n", table, s.Name, s.Want)
	case DriftExtra:
		fmt.Fprintf(b, "%s: %s extra\n\t- %s\n", table, s.Name, s.Have)
	case DriftDefinition:
		fmt.Fprintf(b, "%s: %s definition differs\n\t- %s\n\t+ %s\n", table, s.Name, s.Have, s.Want)
	default:
		fmt.Fprintf(b, "%s: %s elements differ:%s\n", table, s.Name, counts(
			len(s.Missing), "missing", len(s.Extra), "extra", len(s.Changed), "changed"))
	}
	for _, e := range s.Extra {
		fmt.Fprintf(b, "\t- element %s\n", e)
	}
	for _, e := range s.Changed {
		fmt.Fprintf(b, "\t- element %s\n\t+ element %s\n", e.Have, e.Want)
	}
	for _, e := range s.Missing {
		fmt.Fprintf(b, "\t+ element %s\n", e)
	}
}

// counts is ", 1 missing, 2 extra" for the counts that are not zero.
func counts(kv ...any) string {
	var out string
	for i := 0; i+1 < len(kv); i += 2 {
		if n := kv[i].(int); n > 0 {
			out += fmt.Sprintf(" %d %s,", n, kv[i+1])
		}
	}
	return strings.TrimSuffix(out, ",")
}

func writeChainDrift(b *strings.Builder, table string, c ChainDrift) {
	switch c.Kind {
	case DriftMissing:
		fmt.Fprintf(b, "%s: chain %s missing\n", table, c.Name)
	case DriftExtra:
		fmt.Fprintf(b, "%s: chain %s extra, with %s\n", table, c.Name, ruleCount(c.HaveRules))
	case DriftDefinition:
		how := ""
		if c.Foreign {
			how = " (a policy or flags nftproxy never sets)"
		}
		fmt.Fprintf(b, "%s: chain %s definition differs%s\n\t- %s\n\t+ %s\n", table, c.Name, how, orRegular(c.Have), orRegular(c.Want))
	default:
		why := fmt.Sprintf("the kernel has %s, %s desired", ruleCount(c.HaveRules), ruleCount(len(c.WantRules)))
		if c.DigestDiff {
			why = fmt.Sprintf("the kernel has %s as desired, other ones (digest differs)", ruleCount(c.HaveRules))
		} else if c.NoDigest && c.HaveRules == len(c.WantRules) {
			why = fmt.Sprintf("the kernel has %s without nftproxy's digest (written by another program)", ruleCount(c.HaveRules))
		}
		fmt.Fprintf(b, "%s: chain %s rules differ: %s; desired:\n", table, c.Name, why)
	}
	for _, r := range c.WantRules {
		fmt.Fprintf(b, "\t+ %s\n", r)
	}
}

func ruleCount(n int) string {
	if n == 1 {
		return "1 rule"
	}
	return fmt.Sprintf("%d rules", n)
}

func orRegular(base string) string {
	if base == "" {
		return "regular chain"
	}
	return base
}
