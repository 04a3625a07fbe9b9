package nft

import (
	"fmt"
	"net/netip"
)

// editorSets are the shared sets the fragments of editorTest use.
func editorSets() []*Set {
	return []*Set{
		{Name: "ips", Key: []DataType{TypeIPv4Addr}},
		{Name: "dispatch", Key: []DataType{TypeIPv4Addr, TypeInetProto, TypeInetService}, Data: []DataType{TypeVerdict}},
	}
}

// svcFragment is a Service-like fragment: a chain DNATing to its backends,
// a dispatch element, and one shared element per backend in "ips".
func svcFragment(i int, backends []int) *Fragment {
	chain := fmt.Sprintf("svc-%d", i)
	vip := netip.AddrFrom4([4]byte{10, 96, 0, byte(i)})
	fr := &Fragment{Chains: []*Chain{{Name: chain}}}
	for j, b := range backends {
		to := netip.AddrPortFrom(netip.AddrFrom4([4]byte{10, 244, 0, byte(b)}), 8080)
		ph := []Phrase{MatchL4Proto{ProtoTCP}}
		if left := len(backends) - j; left > 1 {
			ph = append(ph, MatchRandom{Mod: uint32(left)})
		}
		fr.Chains[0].Rules = append(fr.Chains[0].Rules, Rule{Phrases: append(ph, DNAT{To: to})})
		fr.Elements = append(fr.Elements, SetElement{"ips", Element{Key: []Datum{Addr(to.Addr())}}})
	}
	if len(backends) > 0 {
		fr.Elements = append(fr.Elements, SetElement{"dispatch", Element{
			Key:     []Datum{Addr(vip), Int(uint32(ProtoTCP)), Int(80)},
			Verdict: &Verdict{Kind: VerdictGoto, Chain: chain}, Comment: chain}})
	} else {
		fr.Chains = nil
	}
	return fr
}
