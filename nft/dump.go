package nft

import (
	"fmt"
	"regexp"
	"sort"
	"strings"
	"time"
)

// Dump returns the ruleset as `nft list table <family> nftproxy` prints it,
// in canonical order: sets and maps by name, then chains by name, elements
// sorted, one per line. Rules keep their order. Canonical(listing) puts a
// kernel listing into the same form, so the two compare as strings.
func (r *Ruleset) Dump() string {
	var b strings.Builder
	fmt.Fprintf(&b, "table %s %s {\n", r.Family, TableName)
	var blocks []string
	for _, name := range r.SortedSetNames() {
		blocks = append(blocks, r.dumpSet(r.Sets[name]))
	}
	names := make([]string, 0, len(r.Chains))
	for n := range r.Chains {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, name := range names {
		blocks = append(blocks, r.dumpChain(r.Chains[name]))
	}
	b.WriteString(strings.Join(blocks, "\n"))
	b.WriteString("}\n")
	return b.String()
}

func (r *Ruleset) dumpSet(s *Set) string {
	var b strings.Builder
	kind := "set"
	if s.IsMap() {
		kind = "map"
	}
	if s.EndpointsProto != 0 {
		fmt.Fprintf(&b, "\t%s %s {\n\t\ttypeof %s\n", kind, s.Name, endpointsTypeofText(r.Family, s.EndpointsProto))
	} else if s.PickProto != 0 {
		fmt.Fprintf(&b, "\t%s %s {\n\t\ttypeof %s\n", kind, s.Name, pickTypeofText(r.Family, s.PickProto, s.PickMod))
	} else {
		fmt.Fprintf(&b, "\t%s %s {\n\t\ttype %s\n", kind, s.Name, s.TypeString())
	}
	if s.Size > 0 {
		fmt.Fprintf(&b, "\t\tsize %d\n", s.Size)
	}
	var flags []string
	if s.EndpointsProto != 0 {
		flags = append(flags, "interval")
	}
	if s.Dynamic {
		flags = append(flags, "dynamic")
	}
	if s.Timeout > 0 {
		flags = append(flags, "timeout")
	}
	if len(flags) > 0 {
		fmt.Fprintf(&b, "\t\tflags %s\n", strings.Join(flags, ","))
	}
	if s.Timeout > 0 {
		fmt.Fprintf(&b, "\t\ttimeout %s\n", DurationText(s.Timeout))
	}
	if s.Counter {
		b.WriteString("\t\tcounter\n")
	}
	if s.Comment != "" {
		fmt.Fprintf(&b, "\t\tcomment %q\n", s.Comment)
	}
	if s.Elements.Len() > 0 {
		elems := make([]string, 0, s.Elements.Len())
		for e := range s.Elements.All() {
			elems = append(elems, s.ElementText(e))
		}
		b.WriteString(elementsBlock(elems))
	}
	b.WriteString("\t}\n")
	return b.String()
}

// elementsBlock formats sorted elements the way nft wraps them, one per line.
func elementsBlock(elems []string) string {
	sort.Strings(elems)
	return "\t\telements = { " + strings.Join(elems, ",\n\t\t\t     ") + " }\n"
}

// ElementText is one element as nft lists it inside "elements = { … }".
func (s *Set) ElementText(e Element) string {
	t := s.ElementKeyText(e)
	if e.Comment != "" {
		t += fmt.Sprintf(" comment %q", e.Comment)
	}
	if v := s.ValueString(e); v != "" {
		t += " : " + v
	}
	return t
}

func (r *Ruleset) dumpChain(c *Chain) string {
	var b strings.Builder
	fmt.Fprintf(&b, "\tchain %s {\n", c.Name)
	if c.Base != nil {
		fmt.Fprintf(&b, "\t\ttype %s hook %s priority %s; policy accept;\n",
			c.Base.Type, c.Base.Hook, PriorityText(c.Base.Hook, c.Base.Priority))
	}
	for _, rule := range c.Rules {
		fmt.Fprintf(&b, "\t\t%s\n", rule.Text(r.Family))
	}
	b.WriteString("\t}\n")
	return b.String()
}

// PriorityText is a base chain priority as nft 1.0.6 prints it: a standard
// name (± up to 10) where that name is defined for the hook, else a number.
// (nft 1.1 names dstnat and srcnat on every hook: Canonical reads both.)
func PriorityText(h Hook, prio int32) string {
	type std struct {
		name string
		prio int32
	}
	names := []std{{"raw", -300}, {"mangle", -150}, {"filter", 0}, {"security", 50}}
	switch h {
	case HookPrerouting:
		names = append(names, std{"dstnat", PriorityDstNAT})
	case HookPostrouting:
		names = append(names, std{"srcnat", PrioritySrcNAT})
	}
	for _, n := range names {
		switch off := prio - n.prio; {
		case off == 0:
			return n.name
		case off > 0 && off <= 10:
			return fmt.Sprintf("%s + %d", n.name, off)
		case off < 0 && off >= -10:
			return fmt.Sprintf("%s - %d", n.name, -off)
		}
	}
	return fmt.Sprint(prio)
}

// DurationText formats a set timeout as nft does ("3h", "10m", "1d2h").
func DurationText(d time.Duration) string {
	s := int64(d / time.Second)
	if s == 0 {
		return "0s"
	}
	var b strings.Builder
	for _, u := range []struct {
		suffix string
		secs   int64
	}{{"d", 86400}, {"h", 3600}, {"m", 60}, {"s", 1}} {
		if n := s / u.secs; n > 0 {
			fmt.Fprintf(&b, "%d%s", n, u.suffix)
			s -= n * u.secs
		}
	}
	return b.String()
}

// Canonical rewrites the listing of one table (`nft list table …`) into the
// form Dump produces: set and map blocks sorted by name, then chain blocks
// sorted by name, set elements sorted one per line. Rule order is kept. It
// understands the subset of nft syntax nftproxy writes. The table's flags
// and its owner's name (`flags owner`, `# progname nftproxy`) say who may
// change the table, not what it holds, and are left out. A base chain's
// priority is written as PriorityText writes it, by name or number as
// nft 1.0.6 does, whichever way the listing's nft wrote it.
func Canonical(listing string) string {
	lines := strings.Split(strings.TrimRight(listing, "\n"), "\n")
	if len(lines) < 2 {
		return listing
	}
	header, _, _ := strings.Cut(lines[0], " #")
	if len(lines) > 2 && strings.HasPrefix(lines[1], "\tflags") {
		lines = lines[1:]
	}
	var sets, chains []string
	var cur []string
	flush := func() {
		if len(cur) == 0 {
			return
		}
		block := canonicalBlock(cur)
		if strings.HasPrefix(strings.TrimSpace(cur[0]), "chain ") {
			chains = append(chains, block)
		} else {
			sets = append(sets, block)
		}
		cur = nil
	}
	for _, l := range lines[1 : len(lines)-1] {
		switch {
		case strings.TrimSpace(l) == "":
			flush()
		case strings.HasPrefix(l, "\t") && !strings.HasPrefix(l, "\t\t") && strings.HasSuffix(l, "{"):
			flush()
			cur = append(cur, l)
		default:
			cur = append(cur, l)
		}
	}
	flush()
	byName := func(blocks []string) {
		sort.Slice(blocks, func(i, j int) bool { return blockName(blocks[i]) < blockName(blocks[j]) })
	}
	byName(sets)
	byName(chains)
	return header + "\n" + strings.Join(append(sets, chains...), "\n") + "}\n"
}

// priorityNames are the standard priorities nft prints by name, on any
// hook (nft 1.1 names dstnat on the output hook, where nft 1.0.6 prints
// -100).
var priorityNames = map[string]int32{"raw": -300, "mangle": -150, "dstnat": PriorityDstNAT,
	"filter": PriorityFilter, "security": 50, "srcnat": PrioritySrcNAT}

// baseChainRE matches a base chain's declaration in a listing.
var baseChainRE = regexp.MustCompile(`^(\t\ttype \S+ hook (\S+) priority )([^;]+)(;.*)$`)

// canonicalPriority writes a base chain's priority as PriorityText does,
// whichever way the listing's nft wrote it ("dstnat - 10" or "-110").
func canonicalPriority(line string) string {
	m := baseChainRE.FindStringSubmatch(line)
	if m == nil {
		return line
	}
	var prio int32
	f := strings.Fields(m[3])
	base, ok := priorityNames[f[0]]
	switch {
	case ok && len(f) == 1:
		prio = base
	case ok && len(f) == 3 && (f[1] == "+" || f[1] == "-"):
		var off int32
		if _, err := fmt.Sscan(f[2], &off); err != nil {
			return line
		}
		if f[1] == "-" {
			off = -off
		}
		prio = base + off
	case !ok && len(f) == 1:
		if _, err := fmt.Sscan(f[0], &prio); err != nil {
			return line
		}
	default:
		return line
	}
	return m[1] + PriorityText(Hook(m[2]), prio) + m[4]
}

func blockName(block string) string {
	f := strings.Fields(block)
	if len(f) < 2 {
		return block
	}
	return f[1]
}

// elementCounter is the counter nft lists in each element of a set
// declared with `counter`: its values are the packet path's, not part of
// the table nftproxy writes (Dump lists the set's `counter` only).
var elementCounter = regexp.MustCompile(` counter packets [0-9]+ bytes [0-9]+`)

// canonicalBlock joins a block's lines, re-wrapping its elements.
func canonicalBlock(lines []string) string {
	var b strings.Builder
	for i := 0; i < len(lines); i++ {
		l := lines[i]
		if !strings.HasPrefix(strings.TrimSpace(l), "elements = {") {
			b.WriteString(canonicalPriority(l))
			b.WriteString("\n")
			continue
		}
		// The block runs to the line ending in "}"; join its lines (a
		// Builder: a map of 10,000 elements spans 10,000 lines).
		var text strings.Builder
		last := strings.TrimSpace(l)
		text.WriteString(last)
		for !strings.HasSuffix(last, "}") && i+1 < len(lines) {
			i++
			last = strings.TrimSpace(lines[i])
			text.WriteString(" ")
			text.WriteString(last)
		}
		body := strings.TrimSuffix(strings.TrimPrefix(text.String(), "elements = {"), "}")
		var elems []string
		for _, e := range strings.Split(body, ",") {
			if e = strings.TrimSpace(e); e != "" {
				e = elementCounter.ReplaceAllString(e, "")
				elems = append(elems, e)
			}
		}
		b.WriteString(elementsBlock(elems))
	}
	return b.String()
}
