// Package trace walks a connection's first packet through nftables rulesets
// the way netfilter does (hooks, base chains in priority order, jumps,
// maps, NAT), and reports the chains it crossed, the verdict and the
// endpoints it could be sent to. Tests use it over nft/nftfake's tables;
// it reads only a Ruleset, so it can trace a table read from the kernel.
package trace

import (
	"github.com/nftproxy/nftproxy/nft"

	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"
)

// Packet is the first packet of a connection, as the tracer sees it.
type Packet struct {
	Src   netip.Addr `json:"src"`
	Dst   netip.Addr `json:"dst"`
	Proto uint8      `json:"proto"`
	DPort uint16     `json:"dport"`
	// SPort is the source port (0: unknown; nothing nftproxy does with a
	// first packet depends on it).
	SPort uint16 `json:"sport,omitempty"`
	Mark  uint32 `json:"mark,omitempty"`
	// Iif is the input interface's name (empty for packets from the node).
	Iif string `json:"iif,omitempty"`
	// FromNode: the packet is sent by a process on the node itself (output
	// hook) instead of arriving on an interface (prerouting hook).
	FromNode bool `json:"fromNode,omitempty"`
}

// Result is what happened to a traced packet.
type Result struct {
	Verdict nft.VerdictKind // VerdictAccept, VerdictDrop, or "reject"
	// DNAT lists every backend the packet could have been sent to (all
	// targets of a random cascade, in rule order, all endpoints of a
	// DNATMap's slot, in bucket order, or of a DNATPick's Service, in
	// number order); empty if not NATed.
	// Tracer.Pick chooses which one the traced packet continues to.
	DNAT []netip.AddrPort
	// To is the backend the traced packet was sent to (invalid if not
	// NATed), and Share the probability of the random choices that sent
	// it there (1 if there were none).
	To         netip.AddrPort
	Share      float64
	Masquerade bool
	// Mark is the packet's mark as it leaves the last hook.
	Mark uint32
	// Service is the comment of the last verdict map element the packet
	// matched: the Service port it belongs to ("default/web:http").
	Service string
	// Reason says why a packet was dropped or rejected: the comment of
	// the rule that did it, or of the map whose element sent it there.
	Reason string
	Path   Path
	// Warnings name the rules the tracer could not evaluate exactly
	// (nft.Opaque phrases, which it lets the packet through).
	Warnings []string
}

// Step is one step of a traced packet: a chain entered (Rule empty), or
// a rule that took a verdict or changed the packet.
type Step struct {
	Chain string `json:"chain"`
	Rule  string `json:"rule,omitempty"` // the rule's text, with its comment
	// Key is the key looked up in a map, and Element the comment of the
	// element found.
	Key     string `json:"key,omitempty"`
	Element string `json:"element,omitempty"`
}

// Path is the steps of a traced packet, in order.
type Path []Step

func (p Path) String() string {
	var b strings.Builder
	in := ""
	for _, s := range p {
		if s.Rule == "" || s.Chain != in {
			// A chain entered, or the one a jump returned to.
			fmt.Fprintf(&b, "chain %s\n", s.Chain)
			in = s.Chain
		}
		switch {
		case s.Rule == "":
		case s.Element != "":
			fmt.Fprintf(&b, "  %s: %s (%s)\n", s.Rule, s.Key, s.Element)
		case s.Key != "":
			fmt.Fprintf(&b, "  %s: %s\n", s.Rule, s.Key)
		default:
			fmt.Fprintf(&b, "  %s\n", s.Rule)
		}
	}
	return b.String()
}

// VerdictReject is the tracer's verdict for a rejected packet.
const VerdictReject nft.VerdictKind = "reject"

// Tracer walks packets through rulesets (a Fake's, or a table read back), hook by hook, the way
// netfilter does for a first packet: prerouting (or output), then input or
// forward, then postrouting, base chains in priority order. A packet from
// the node to one of its own addresses (or a loopback one) then comes back
// in on lo and crosses input too; the prerouting hook it also crosses
// then is not traced (its NAT is decided, and nftproxy's prerouting
// filter rules look for frontends it no longer has, or for LoadBalancer
// IPs, which a node's own traffic to them reaches before DNAT, in output).
type Tracer struct {
	Rulesets map[nft.Family]*nft.Ruleset
	// LocalAddrs are the node's own addresses: a packet whose destination
	// (after DNAT) is one of them goes to the input hook, not forward.
	LocalAddrs []netip.Addr
	// Pick chooses which rule of a random cascade the traced packet takes:
	// the Pick-th random match (from 0) succeeds, the others fail, so
	// Pick ≥ N-1 takes the last, unguarded rule of an N-rule cascade. A
	// DNATMap sends it to the endpoint of the Pick-th range of buckets
	// (the last if there are fewer).
	Pick int
}

// New returns a tracer over rulesets, one per family, on a node with the
// local addresses given.
func New(rulesets map[nft.Family]*nft.Ruleset, local ...netip.Addr) *Tracer {
	return &Tracer{Rulesets: rulesets, LocalAddrs: local}
}

type traceState struct {
	f       nft.Family
	pkt     Packet
	dnat    bool
	res     Result
	depth   int
	draws   int    // random matches evaluated so far
	chain   string // the chain being evaluated
	mapNote string // the comment of the last verdict map that matched
}

// step records a rule of the current chain.
func (st *traceState) step(r nft.Rule, key, element string) {
	st.res.Path = append(st.res.Path, Step{Chain: st.chain, Rule: r.Text(st.f), Key: key, Element: element})
}

// Trace sends p through the rulesets.
func (t *Tracer) Trace(p Packet) Result {
	f := nft.IPv4
	if p.Dst.Is6() && !p.Dst.Is4In6() {
		f = nft.IPv6
	}
	st := &traceState{f: f, pkt: p, res: Result{Verdict: nft.VerdictAccept, Share: 1}}
	rs := t.Rulesets[f]
	first := nft.HookPrerouting
	if p.FromNode {
		first = nft.HookOutput
	}
	hooks := []nft.Hook{first}
	if !p.FromNode {
		hooks = append(hooks, nft.HookForward)
	}
	hooks = append(hooks, nft.HookPostrouting)
	if p.FromNode {
		hooks = append(hooks, nft.HookInput) // only if the packet stays on the node (below)
	}
	for i, h := range hooks {
		if h == nft.HookForward && t.isLocal(st.pkt.Dst) {
			hooks[i] = nft.HookInput
			h = nft.HookInput
		}
		if p.FromNode && h == nft.HookInput {
			if !t.isLocal(st.pkt.Dst) && !st.pkt.Dst.IsLoopback() {
				break
			}
			st.pkt.Iif = "lo"
		}
		if v := t.runHook(rs, h, st); v == nft.VerdictDrop || v == VerdictReject {
			st.res.Verdict = v
			return st.res
		}
	}
	if st.dnat {
		st.res.To = netip.AddrPortFrom(st.pkt.Dst, st.pkt.DPort)
	}
	st.res.Mark = st.pkt.Mark
	return st.res
}

func (t *Tracer) isLocal(a netip.Addr) bool {
	for _, l := range t.LocalAddrs {
		if l == a {
			return true
		}
	}
	return false
}

// runHook runs the base chains of a hook in priority order; it returns the
// first drop or reject.
func (t *Tracer) runHook(rs *nft.Ruleset, h nft.Hook, st *traceState) nft.VerdictKind {
	if rs == nil {
		return nft.VerdictAccept
	}
	var chains []*nft.Chain
	for _, c := range rs.Chains {
		if c.Base != nil && c.Base.Hook == h {
			chains = append(chains, c)
		}
	}
	sort.Slice(chains, func(i, j int) bool { return chains[i].Base.Priority < chains[j].Base.Priority })
	for _, c := range chains {
		// As the kernel does, the first NAT of a kind ends the hook's
		// NAT chains: after a DNAT, prerouting and output ones; after a
		// masquerade, postrouting ones.
		if c.Base.Type == nft.ChainNAT && (h != nft.HookPostrouting && st.dnat || h == nft.HookPostrouting && st.res.Masquerade) {
			continue
		}
		if v := t.runChain(rs, c, st); v == nft.VerdictDrop || v == VerdictReject {
			return v
		}
	}
	return nft.VerdictAccept
}

// runChain evaluates a chain; "" means the chain ended without a verdict.
func (t *Tracer) runChain(rs *nft.Ruleset, c *nft.Chain, st *traceState) nft.VerdictKind {
	st.depth++
	outer := st.chain
	defer func() { st.depth--; st.chain = outer }()
	if st.depth > 16 {
		st.res.Warnings = append(st.res.Warnings, "loop at chain "+c.Name)
		return nft.VerdictDrop
	}
	st.chain = c.Name
	st.res.Path = append(st.res.Path, Step{Chain: c.Name})
	for i, r := range c.Rules {
		if v, done := t.runRule(rs, r, st); done {
			if st.draws > 0 {
				// A random cascade took this rule; the rules after it
				// were possible outcomes too.
				for _, later := range c.Rules[i+1:] {
					if to, ok := dnatTarget(later); ok {
						st.res.DNAT = append(st.res.DNAT, to)
					}
				}
			}
			return v
		}
	}
	return ""
}

// runRule evaluates a rule; done reports a final verdict for the chain.
func (t *Tracer) runRule(rs *nft.Ruleset, r nft.Rule, st *traceState) (nft.VerdictKind, bool) {
	for _, p := range r.Phrases {
		switch p := p.(type) {
		case nft.VerdictPhrase:
			st.step(r, "", "")
			return t.applyVerdict(rs, r, p.Verdict, st)
		case nft.VmapLookup:
			return t.vmap(rs, r, p, st)
		case nft.RejectTCPReset:
			if st.pkt.Proto != nft.ProtoTCP {
				return "", false
			}
			return st.final(r, VerdictReject)
		case nft.Reject:
			return st.final(r, VerdictReject)
		case nft.MatchRandom:
			if !t.draw(r, p, st) {
				return "", false
			}
		case nft.DNATMap:
			return t.dnatMap(rs, r, p, st)
		case nft.DNATPick:
			return t.dnatPick(rs, r, p, st)
		case nft.DNAT:
			st.res.DNAT = append(st.res.DNAT, p.To)
			st.pkt.Dst, st.pkt.DPort, st.dnat = p.To.Addr(), p.To.Port(), true
			st.step(r, "", "")
			return nft.VerdictAccept, true
		case nft.Masquerade:
			st.res.Masquerade = true
			st.step(r, "", "")
			return nft.VerdictAccept, true
		case nft.MatchFibLocal:
			a := st.pkt.Dst
			if p.Field == nft.FieldSrcAddr {
				a = st.pkt.Src
			}
			if !t.isLocal(a) {
				return "", false
			}
		case nft.UpdateSet:
			// The tracer does not learn clients: a dynamic set holds what
			// the table holds, so a first packet takes no sticky rule.
		case nft.SetMarkBits:
			st.pkt.Mark |= p.Bits
		case nft.ToggleMarkBits:
			st.pkt.Mark ^= p.Bits
		case nft.Opaque:
			st.res.Warnings = append(st.res.Warnings, fmt.Sprintf(
				"chain %s: rule %q has expressions nftproxy does not decode; assumed to let the packet through", st.chain, r.Text(st.f)))
		default:
			if !st.match(rs, p) {
				return "", false
			}
		}
	}
	return "", false
}

// final ends the packet's way with rule r's verdict.
func (st *traceState) final(r nft.Rule, v nft.VerdictKind) (nft.VerdictKind, bool) {
	st.step(r, "", "")
	st.res.Reason = r.Comment
	if st.res.Reason == "" {
		st.res.Reason = st.mapNote
	}
	return v, true
}

// draw evaluates a random match of a cascade. Every backend of a cascade
// is a possible outcome: the rule's target is noted, and the rule taken
// only on the Pick-th draw; Share follows the odds.
func (t *Tracer) draw(r nft.Rule, p nft.MatchRandom, st *traceState) bool {
	st.draws++
	odds := 1 / float64(max(p.Mod, 1))
	if st.draws-1 != t.Pick {
		if to, ok := dnatTarget(r); ok {
			st.res.DNAT = append(st.res.DNAT, to)
		}
		st.res.Share *= 1 - odds
		return false
	}
	st.res.Share *= odds
	return true
}

// vmap looks the packet up in a verdict map and applies what it finds.
func (t *Tracer) vmap(rs *nft.Ruleset, r nft.Rule, p nft.VmapLookup, st *traceState) (nft.VerdictKind, bool) {
	s := rs.Sets[p.Map]
	if s == nil {
		st.res.Warnings = append(st.res.Warnings, fmt.Sprintf("chain %s: map %s does not exist", st.chain, p.Map))
		return "", false
	}
	fields := st.fields(p.Fields)
	e, ok := s.Elements.Get(fields)
	if !ok || e.Verdict == nil {
		return "", false
	}
	st.step(r, s.KeyString(fields), e.Comment)
	if e.Comment != "" {
		st.res.Service = e.Comment
	}
	st.mapNote = s.Comment
	return t.applyVerdict(rs, r, *e.Verdict, st)
}

// dnatMap runs a DNATMap phrase of rule r. Every endpoint of the Service
// is a possible outcome, as in a cascade; the traced packet takes the
// Pick-th range.
func (t *Tracer) dnatMap(rs *nft.Ruleset, r nft.Rule, p nft.DNATMap, st *traceState) (nft.VerdictKind, bool) {
	if st.pkt.Proto != p.Proto {
		return "", false
	}
	targets, shares := slotShares(rs.Sets[p.Map], p.Slot)
	if len(targets) == 0 {
		return "", false
	}
	i := min(t.Pick, len(targets)-1)
	return t.dnatTo(r, targets, i, shares[i], st)
}

// dnatTo sends the traced packet to targets[i], one of the outcomes of
// rule r, taken with probability share.
func (t *Tracer) dnatTo(r nft.Rule, targets []netip.AddrPort, i int, share float64, st *traceState) (nft.VerdictKind, bool) {
	to := targets[i]
	st.res.DNAT = append(st.res.DNAT, targets...)
	st.res.Share *= share
	st.pkt.Dst, st.pkt.DPort, st.dnat = to.Addr(), to.Port(), true
	st.step(r, fmt.Sprintf("%v of %v", to, targets), "")
	return nft.VerdictAccept, true
}

// dnatPick runs a DNATPick phrase of rule r: the elements of the packet's
// destination and port for each number below Mod are the possible
// outcomes, each drawn with probability 1/Mod (a number without an
// element does not match, and the packet goes on to the next rule); the
// traced packet takes the Pick-th.
func (t *Tracer) dnatPick(rs *nft.Ruleset, r nft.Rule, p nft.DNATPick, st *traceState) (nft.VerdictKind, bool) {
	s := rs.Sets[p.Map]
	if st.pkt.Proto != p.Proto || s == nil {
		return "", false
	}
	var targets []netip.AddrPort
	for k := range p.Mod {
		e, ok := s.Elements.Get([]nft.Datum{nft.Addr(st.pkt.Dst), nft.Int(uint32(st.pkt.DPort)), nft.Int(k)})
		if ok && len(e.Data) == 2 {
			targets = append(targets, netip.AddrPortFrom(e.Data[0].Addr, uint16(e.Data[1].Int)))
		}
	}
	if len(targets) == 0 {
		return "", false
	}
	return t.dnatTo(r, targets, min(t.Pick, len(targets)-1), 1/float64(p.Mod), st)
}

// slotShares returns the endpoints of a slot of an endpoints map in bucket
// order, each with the share of the slot's buckets it holds.
func slotShares(s *nft.Set, slot uint16) ([]netip.AddrPort, []float64) {
	targets := nft.SlotEndpoints(s, slot)
	shares := make([]float64, len(targets))
	for e := range s.Elements.All() {
		if nft.ElementSlot(e) != uint32(slot) {
			continue
		}
		to := netip.AddrPortFrom(e.Data[0].Addr, uint16(e.Data[1].Int))
		if i := slices.Index(targets, to); i >= 0 {
			shares[i] += float64(max(e.End, e.Key[0].Int)-e.Key[0].Int+1) / nft.EndpointBuckets
		}
	}
	return targets, shares
}

// dnatTarget is the destination of the rule's DNAT phrase, if it has one.
func dnatTarget(r nft.Rule) (netip.AddrPort, bool) {
	for _, p := range r.Phrases {
		if d, ok := p.(nft.DNAT); ok {
			return d.To, true
		}
	}
	return netip.AddrPort{}, false
}

func (t *Tracer) applyVerdict(rs *nft.Ruleset, r nft.Rule, v nft.Verdict, st *traceState) (nft.VerdictKind, bool) {
	switch v.Kind {
	case nft.VerdictDrop:
		st.res.Reason = r.Comment
		if st.res.Reason == "" {
			st.res.Reason = st.mapNote
		}
		return v.Kind, true
	case nft.VerdictJump, nft.VerdictGoto:
		if rs.Chains[v.Chain] == nil {
			st.res.Warnings = append(st.res.Warnings, fmt.Sprintf("chain %s: %s to chain %s, which does not exist", st.chain, v.Kind, v.Chain))
			return "", false
		}
	}
	switch v.Kind {
	case nft.VerdictJump:
		if r := t.runChain(rs, rs.Chains[v.Chain], st); r != "" {
			return r, true
		}
		return "", false
	case nft.VerdictGoto:
		return t.runChain(rs, rs.Chains[v.Chain], st), true
	case nft.VerdictReturn:
		return "", true
	}
	return v.Kind, true
}

func (st *traceState) fields(fields []nft.Field) []nft.Datum {
	out := make([]nft.Datum, len(fields))
	for i, fd := range fields {
		switch fd {
		case nft.FieldSrcAddr:
			out[i] = nft.Addr(st.pkt.Src)
		case nft.FieldDstAddr:
			out[i] = nft.Addr(st.pkt.Dst)
		case nft.FieldL4Proto:
			out[i] = nft.Int(uint32(st.pkt.Proto))
		case nft.FieldDstPort:
			out[i] = nft.Int(uint32(st.pkt.DPort))
		case nft.FieldSrcPort:
			out[i] = nft.Int(uint32(st.pkt.SPort))
		}
	}
	return out
}

func (st *traceState) match(rs *nft.Ruleset, p nft.Phrase) bool {
	switch p := p.(type) {
	case nft.MatchPrefix:
		a := st.pkt.Src
		if p.Field == nft.FieldDstAddr {
			a = st.pkt.Dst
		}
		return p.Prefix.Contains(a) != p.Negate
	case nft.MatchSet:
		s := rs.Sets[p.Set]
		return s.Elements.Has(st.fields(p.Fields)) != p.Negate
	case nft.MatchL4Proto:
		return st.pkt.Proto == p.Proto
	case nft.MatchCtStateNew:
		return true // the tracer follows first packets only
	case nft.MatchCtStatusDNAT:
		return st.dnat
	case nft.MatchCtDirection:
		return !p.Reply // a first packet is the connection's original direction
	case nft.MatchMarkBits:
		return st.pkt.Mark&p.Mask != 0
	case nft.MatchIifname:
		ok := st.pkt.Iif == p.Name || (p.Prefix && strings.HasPrefix(st.pkt.Iif, p.Name))
		return ok != p.Negate
	}
	panic(fmt.Sprintf("nft: tracer cannot evaluate %T", p))
}

// maxOutcomes bounds Outcomes: a Service has at most this many endpoints
// in a random choice before the tracer gives up listing them.
const maxOutcomes = 4096

// Outcomes traces p once per way its random choices can go, and returns
// each distinct outcome with its probability in Share (their shares add
// up to 1). A packet that meets no random choice has one outcome.
func (t *Tracer) Outcomes(p Packet) []Result {
	pick := t.Pick
	defer func() { t.Pick = pick }()
	var out []Result
	total := 0.0
	for t.Pick = 0; t.Pick < maxOutcomes && total < 1-1e-9; t.Pick++ {
		res := t.Trace(p)
		if len(out) > 0 && res.To == out[len(out)-1].To {
			break // Pick beyond the last choice repeats it
		}
		out = append(out, res)
		total += res.Share
	}
	return out
}
