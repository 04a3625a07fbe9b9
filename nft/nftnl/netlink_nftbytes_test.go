package nftnl

import (
	"github.com/nftproxy/nftproxy/internal/nlcodec"
	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/nft/nfttest"

	"encoding/binary"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestNetlinkBytesMatchNft loads a ruleset that uses every phrase and set
// shape with `nft --debug=mnl -f` and checks that our batch for the same
// ruleset carries the same messages, attribute for attribute and in the
// same order. Differences that do not reach the kernel are normalised away:
// how elements are split across messages, and set IDs (replaced by the set
// they name), an interval end at key 0 nft writes ahead of an endpoints
// map's first range, and the digest of a chain's rules that our first rule of each
// chain carries in its userdata (digest.go; nft writes none) — which must
// be there, exactly once per chain with rules. This is the guard against
// bytecode `nft list` cannot decompile (kubernetes #135705).
//
// nftproxy writes what nft 1.0.6 writes. What other releases' nft write
// besides, which no nft needs to list our tables, is normalised away too
// (canonicalBatch, stripTypeofOfTypeSets): the typeof in the userdata of
// sets declared by type (1.1 writes its own), 1.1's order of a chain's
// attributes,
// its version in the table's userdata, 0.9.8's host-order res_id in
// BATCH_BEGIN and BATCH_END. nft 0.9.8 cannot load the ruleset
// (nfttest.NftLacks): the test skips there, naming what it lacks.
func TestNetlinkBytesMatchNft(t *testing.T) {
	for _, f := range []nft.Family{nft.IPv4, nft.IPv6} {
		t.Run(f.String(), func(t *testing.T) {
			ns := newTestNS(t)
			rs := nfttest.EveryPhraseRuleset(f)
			ns.requireNftReads(t, rs.Dump())
			out := ns.mustNft(t, rs.Dump(), "--debug=mnl", "-f", "-")
			theirs, err := parseMnlDump(out)
			if err != nil {
				t.Fatal(err)
			}
			if n := pickKeyTypesAsOurs(t, rs, theirs); n == 0 {
				t.Errorf("nft wrote no pick map")
			}
			tx := nft.Diff(nft.NewRuleset(f), rs)
			tx.Ops = append([]nft.Op{{Kind: nft.OpResetTable}}, tx.Ops...)
			b, err := encodeTransaction(tx, batchOptions{firstSeq: 1})
			if err != nil {
				t.Fatal(err)
			}
			ours := splitMessages(b.enc.Buf)
			th, theirDigests := canonicalBatch(t, theirs, stripTypeofOfTypeSets(rs))
			// nft opens an interval map whose first range starts above 0
			// with an interval end at key 0 (segtree's "nothing below");
			// the rbtree matches nothing below the first range without it,
			// so we do not write it.
			th = slices.DeleteFunc(th, func(l string) bool { return strings.HasSuffix(l, "element 1{3=00000001 1{1=00000000}}") })
			ou, ourDigests := canonicalBatch(t, ours, stripTypeofOfTypeSets(rs))
			if len(theirDigests) != 0 {
				t.Errorf("nft wrote rule digests: %v", theirDigests)
			}
			for name, c := range rs.Chains {
				if want := nft.DigestRules(f, c.Rules); len(c.Rules) > 0 && ourDigests[name] != string(want[:]) {
					t.Errorf("chain %s: first rule carries digest %x, want %x", name, ourDigests[name], want)
				}
			}
			if len(ourDigests) != len(rs.Chains)-countEmpty(rs) {
				t.Errorf("%d rule digests for %d chains with rules", len(ourDigests), len(rs.Chains)-countEmpty(rs))
			}
			if len(th) < 40 {
				t.Fatalf("only %d messages parsed from nft's debug output", len(th))
			}
			compareBatches(t, th, ou)
			t.Logf("%d messages (elements counted singly) equal", len(th))
			if t.Failed() {
				dir := t.TempDir()
				os.WriteFile(filepath.Join(dir, "nft-mnl.txt"), []byte(out), 0o644)
				t.Logf("nft's debug output kept in %s", dir)
			}
		})
	}
}

// pickKeyTypesAsOurs rewrites, in nft's NEWSET of each pick map of rs, the
// key type nft writes (integer for the numgen field) to the one we write
// (setKeyMagic: mark, which nft 0.9.8 needs to list the map), and returns
// how many it rewrote. A key type that is neither is left for the
// comparison to report.
func pickKeyTypesAsOurs(t *testing.T, rs *nft.Ruleset, msgs [][]byte) int {
	t.Helper()
	n := 0
	for _, m := range msgs {
		if len(m) < nlcodec.HeaderLen+4 || binary.NativeEndian.Uint16(m[4:]) != unix.NFNL_SUBSYS_NFTABLES<<8|unix.NFT_MSG_NEWSET {
			continue
		}
		attrs := &nla{kids: parseNLAs(m[20:])}
		name, kt := attrs.child(unix.NFTA_SET_NAME), attrs.child(unix.NFTA_SET_KEY_TYPE)
		if name == nil || kt == nil || len(kt.data) != 4 {
			continue
		}
		s := rs.Sets[strings.TrimRight(string(name.data), "\x00")]
		if s == nil || s.PickProto == 0 {
			continue
		}
		if binary.BigEndian.Uint32(kt.data) == typeMagic(s.Key) {
			binary.BigEndian.PutUint32(kt.data, setKeyMagic(s)) // kt.data is a slice of m
			n++
		}
	}
	return n
}

func compareBatches(t *testing.T, theirs, ours []string) {
	t.Helper()
	count := func(ls []string) map[string]int {
		m := map[string]int{}
		for _, l := range ls {
			m[l]++
		}
		return m
	}
	th, ou := count(theirs), count(ours)
	for l, n := range th {
		if ou[l] != n {
			t.Errorf("nft wrote %d×, we wrote %d×:\n%s", n, ou[l], l)
		}
	}
	for l, n := range ou {
		if _, ok := th[l]; !ok {
			t.Errorf("we wrote %d×, nft never:\n%s", n, l)
		}
	}
}

var (
	ansiRE     = regexp.MustCompile(`\x1b\[[0-9;]*m`)
	mnlLenRE   = regexp.MustCompile(`^\|\s+(\d{10})\s+\|\s+\| message length`)
	mnlTypeRE  = regexp.MustCompile(`^\| (\d{5}) \| ([RMAE-]{4}) \|`)
	mnlSeqRE   = regexp.MustCompile(`^\|\s+(\d{10})\s+\|\s+\|\s*sequence number`)
	mnlAttrRE  = regexp.MustCompile(`^\|(\d{5})\|([NB-]{2})\|(\d{5})\|`)
	mnlBytesRE = regexp.MustCompile(`^\| ([0-9a-f]{2}) ([0-9a-f]{2}) ([0-9a-f]{2}) ([0-9a-f]{2})  \|`)
)

// parseMnlDump rebuilds the messages of the batch from libmnl's
// mnl_nlmsg_fprintf output (`nft --debug=mnl`): a header block, then one
// line per 4 bytes, attribute headers printed as |len|flags|type|. Only the
// R/M/A/E message flags are printed; the others come back as zero.
func parseMnlDump(out string) ([][]byte, error) {
	var msgs [][]byte
	var cur []byte
	flush := func() {
		if cur != nil {
			binary.NativeEndian.PutUint32(cur, uint32(len(cur)))
			msgs = append(msgs, cur)
		}
		cur = nil
	}
	for _, line := range strings.Split(out, "\n") {
		line = ansiRE.ReplaceAllString(line, "")
		if mnlLenRE.MatchString(line) {
			flush()
			cur = make([]byte, nlcodec.HeaderLen)
			continue
		}
		if cur == nil {
			continue
		}
		if m := mnlTypeRE.FindStringSubmatch(line); m != nil {
			typ, _ := strconv.Atoi(m[1])
			var flags uint16
			for i, bit := range []uint16{unix.NLM_F_REQUEST, unix.NLM_F_MULTI, unix.NLM_F_ACK, unix.NLM_F_ECHO} {
				if m[2][i] != '-' {
					flags |= bit
				}
			}
			binary.NativeEndian.PutUint16(cur[4:], uint16(typ))
			binary.NativeEndian.PutUint16(cur[6:], flags)
		} else if m := mnlSeqRE.FindStringSubmatch(line); m != nil {
			seq, _ := strconv.Atoi(m[1])
			binary.NativeEndian.PutUint32(cur[8:], uint32(seq))
		} else if m := mnlAttrRE.FindStringSubmatch(line); m != nil {
			l, _ := strconv.Atoi(m[1])
			typ, _ := strconv.Atoi(m[3])
			if m[2][0] == 'N' {
				typ |= unix.NLA_F_NESTED
			}
			if m[2][1] == 'B' {
				typ |= unix.NLA_F_NET_BYTEORDER
			}
			cur = binary.NativeEndian.AppendUint16(cur, uint16(l))
			cur = binary.NativeEndian.AppendUint16(cur, uint16(typ))
		} else if m := mnlBytesRE.FindStringSubmatch(line); m != nil {
			for _, h := range m[1:] {
				v, _ := strconv.ParseUint(h, 16, 8)
				cur = append(cur, byte(v))
			}
		}
	}
	flush()
	// Keep the batch: from BATCH_BEGIN to BATCH_END.
	for i, m := range msgs {
		if binary.NativeEndian.Uint16(m[4:]) == unix.NFNL_MSG_BATCH_BEGIN {
			for j := i; j < len(msgs); j++ {
				if binary.NativeEndian.Uint16(msgs[j][4:]) == unix.NFNL_MSG_BATCH_END {
					return msgs[i : j+1], nil
				}
			}
		}
	}
	return nil, fmt.Errorf("no batch in nft's debug output:\n%s", out)
}

// splitMessages splits an encoded batch into its messages.
func splitMessages(b []byte) [][]byte {
	var out [][]byte
	for len(b) >= nlcodec.HeaderLen {
		l := int(binary.NativeEndian.Uint32(b))
		out = append(out, b[:l])
		b = b[pad4(l):]
	}
	return out
}

// nla is a decoded attribute; nested ones are decoded recursively.
type nla struct {
	typ  uint16 // without NLA_F_NESTED
	data []byte
	kids []*nla // nil unless nested
}

func parseNLAs(b []byte) []*nla {
	var out []*nla
	for len(b) >= 4 {
		l := int(binary.NativeEndian.Uint16(b))
		t := binary.NativeEndian.Uint16(b[2:])
		if l < 4 || l > len(b) {
			break
		}
		a := &nla{typ: t &^ (unix.NLA_F_NESTED | unix.NLA_F_NET_BYTEORDER), data: b[4:l]}
		if t&unix.NLA_F_NESTED != 0 {
			a.kids = parseNLAs(a.data)
			if a.kids == nil {
				a.kids = []*nla{}
			}
		}
		out = append(out, a)
		b = b[min(pad4(l), len(b)):]
	}
	return out
}

func (a *nla) child(t uint16) *nla {
	for _, k := range a.kids {
		if k.typ == t {
			return k
		}
	}
	return nil
}

// String prints the attribute and, in order, its children.
func (a *nla) String() string {
	if a.kids == nil {
		return fmt.Sprintf("%d=%s", a.typ, printable(a.data))
	}
	parts := make([]string, len(a.kids))
	for i, k := range a.kids {
		parts[i] = k.String()
	}
	return fmt.Sprintf("%d{%s}", a.typ, strings.Join(parts, " "))
}

func printable(b []byte) string {
	if len(b) > 1 && b[len(b)-1] == 0 && !slices.ContainsFunc(b[:len(b)-1], func(c byte) bool { return c < 32 || c > 126 }) {
		return strconv.Quote(string(b[:len(b)-1]))
	}
	return hex.EncodeToString(b)
}

type decodedMsg struct {
	typ, flags uint16
	nfgen      []byte
	attrs      *nla
}

func countEmpty(rs *nft.Ruleset) int {
	n := 0
	for _, c := range rs.Chains {
		if len(c.Rules) == 0 {
			n++
		}
	}
	return n
}

// stripRuleDigest removes the rules digest TLV from a NEWRULE's userdata
// attribute (and the attribute if nothing else is left), and returns it.
func stripRuleDigest(m decodedMsg) (string, bool) {
	ud := m.attrs.child(unix.NFTA_RULE_USERDATA)
	if ud == nil {
		return "", false
	}
	var kept []byte
	digest, found := "", false
	for b := ud.data; len(b) >= 2 && 2+int(b[1]) <= len(b); b = b[2+int(b[1]):] {
		if b[0] == udataRuleDigest {
			digest, found = string(b[2:2+int(b[1])]), true
			continue
		}
		kept = append(kept, b[:2+int(b[1])]...)
	}
	ud.data = kept
	if len(kept) == 0 {
		m.attrs.kids = slices.DeleteFunc(m.attrs.kids, func(a *nla) bool { return a == ud })
	}
	return digest, found
}

// decodeMessages decodes each message's header and attributes.
func decodeMessages(t *testing.T, raw [][]byte) []decodedMsg {
	t.Helper()
	var msgs []decodedMsg
	for _, m := range raw {
		if len(m) < nlcodec.HeaderLen+4 {
			t.Fatalf("short message %x", m)
		}
		msgs = append(msgs, decodedMsg{
			typ:   binary.NativeEndian.Uint16(m[4:]),
			flags: binary.NativeEndian.Uint16(m[6:]) & (unix.NLM_F_REQUEST | unix.NLM_F_MULTI | unix.NLM_F_ACK | unix.NLM_F_ECHO),
			nfgen: slices.Clone(m[16:20]),
			attrs: &nla{kids: parseNLAs(m[20:])},
		})
	}
	return msgs
}

// canonicalBatch turns a batch into one line per message (one per element
// for element messages), with set IDs replaced by set names and rule
// digests taken out; it returns the digests by chain.
// normalize, if given, is applied to each message first.
func canonicalBatch(t *testing.T, raw [][]byte, normalize ...func(decodedMsg)) ([]string, map[string]string) {
	t.Helper()
	msgs := decodeMessages(t, raw)
	for _, m := range msgs {
		for _, f := range normalize {
			f(m)
		}
		// nft 0.9.8 writes BATCH_BEGIN's and BATCH_END's res_id,
		// NFNL_SUBSYS_NFTABLES, in host byte order, which the kernel
		// accepts ("old nft").
		if (m.typ == unix.NFNL_MSG_BATCH_BEGIN || m.typ == unix.NFNL_MSG_BATCH_END) && m.nfgen[2] != 0 &&
			binary.NativeEndian.Uint16(m.nfgen[2:]) == unix.NFNL_SUBSYS_NFTABLES {
			binary.BigEndian.PutUint16(m.nfgen[2:], unix.NFNL_SUBSYS_NFTABLES)
		}
	}
	const (
		newSet     = unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_NEWSET
		newSetElem = unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_NEWSETELEM
		newTable   = unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_NEWTABLE
		delTable   = unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_DELTABLE
		newRule    = unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_NEWRULE
		newChain   = unix.NFNL_SUBSYS_NFTABLES<<8 | unix.NFT_MSG_NEWCHAIN
	)
	// Label set IDs by the set they name.
	labels := map[string]string{} // hex ID -> label
	for _, m := range msgs {
		if m.typ == newSet {
			id := hex.EncodeToString(m.attrs.child(unix.NFTA_SET_ID).data)
			labels[id] = "set:" + strings.TrimRight(string(m.attrs.child(unix.NFTA_SET_NAME).data), "\x00")
		}
	}
	relabel := func(a *nla) {
		if a == nil {
			return
		}
		if l, ok := labels[hex.EncodeToString(a.data)]; ok {
			a.data = append([]byte(l), 0)
		} else {
			a.data = []byte("unknown-set-id:" + hex.EncodeToString(a.data) + "\x00")
		}
	}

	var out []string
	digests := map[string]string{}
	tables := 0
	for _, m := range msgs {
		head := fmt.Sprintf("type=%d flags=%#x nfgen=%x", m.typ, m.flags, m.nfgen)
		switch m.typ {
		case delTable:
			continue // our reset writes add+delete+add; nft's load only add
		case newTable:
			// The add before our reset's delete carries no flags: it must
			// not touch those of a table that exists. The add that
			// creates the table is the one to compare.
			if m.attrs.child(unix.NFTA_TABLE_FLAGS) == nil {
				continue
			}
			// nft 1.1.7 records its version and build in the table's
			// userdata (nftproxy writes none), for an older nft listing
			// the table to say it may miss something.
			m.attrs.kids = slices.DeleteFunc(m.attrs.kids, func(a *nla) bool { return a.typ == nftaTableUserdata })
			if tables++; tables > 1 {
				t.Errorf("more than one add of the table with flags")
			}
		case newSet:
			relabel(m.attrs.child(unix.NFTA_SET_ID))
		case newChain:
			// nft 1.1 writes NFTA_CHAIN_FLAGS before NFTA_CHAIN_TYPE,
			// 1.0.6 after; the kernel reads them by type.
			slices.SortStableFunc(m.attrs.kids, func(a, b *nla) int { return int(a.typ) - int(b.typ) })

		case newRule:
			if d, ok := stripRuleDigest(m); ok {
				chain := strings.TrimRight(string(m.attrs.child(unix.NFTA_RULE_CHAIN).data), "\x00")
				if _, dup := digests[chain]; dup {
					t.Errorf("chain %s: more than one rule carries a digest", chain)
				}
				digests[chain] = d
			}
			for _, e := range m.attrs.child(unix.NFTA_RULE_EXPRESSIONS).kids {
				if string(e.child(unix.NFTA_EXPR_NAME).data) == "lookup\x00" {
					relabel(e.child(unix.NFTA_EXPR_DATA).child(unix.NFTA_LOOKUP_SET_ID))
				}
			}
		case newSetElem:
			relabel(m.attrs.child(unix.NFTA_SET_ELEM_LIST_SET_ID))
			list := m.attrs.child(unix.NFTA_SET_ELEM_LIST_ELEMENTS)
			rest := &nla{kids: slices.DeleteFunc(slices.Clone(m.attrs.kids), func(a *nla) bool { return a == list })}
			for _, e := range list.kids {
				e.typ = 1
				out = append(out, head+" "+rest.String()+" element "+e.String())
			}
			continue
		}
		out = append(out, head+" "+m.attrs.String())
	}
	return out, digests
}

// NFTA_TABLE_USERDATA is not in golang.org/x/sys/unix.
const nftaTableUserdata = 6

// stripTypeofOfTypeSets removes the typeof of key and data from the
// userdata of the NEWSETs of rs's sets declared by type (not typeof): nft
// records one for some of them, and each release its own (1.0.6 for a
// concatenation, 1.1 for every set, with more in it), from which no
// release lists a set declared by type (the listing tests show each lists
// ours as Dump says).
func stripTypeofOfTypeSets(rs *nft.Ruleset) func(decodedMsg) {
	return func(m decodedMsg) {
		name, ud := setUdata(m)
		if s := rs.Sets[name]; ud == nil || s == nil || s.PickProto != 0 || s.EndpointsProto != 0 {
			return
		}
		ud.data = slices.Concat(slices.DeleteFunc(udataTLVs(ud.data), isTypeofTLV)...)
	}
}

// setUdata returns the name and userdata attribute of a NEWSET.
func setUdata(m decodedMsg) (string, *nla) {
	if m.typ != unix.NFNL_SUBSYS_NFTABLES<<8|unix.NFT_MSG_NEWSET {
		return "", nil
	}
	name := m.attrs.child(unix.NFTA_SET_NAME)
	if name == nil {
		return "", nil
	}
	return strings.TrimRight(string(name.data), "\x00"), m.attrs.child(unix.NFTA_SET_USERDATA)
}

// udataTLVs splits userdata into its TLVs (type, length, value).
func udataTLVs(b []byte) [][]byte {
	var out [][]byte
	for ; len(b) >= 2 && 2+int(b[1]) <= len(b); b = b[2+int(b[1]):] {
		out = append(out, b[:2+int(b[1])])
	}
	return out
}

func isTypeofTLV(tlv []byte) bool { return tlv[0] == udataSetKeyTypeof || tlv[0] == udataSetDataTypeof }
