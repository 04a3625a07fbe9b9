package nftnl

import (
	"errors"
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/nftproxy/nftproxy/internal/nlcodec"
	"github.com/nftproxy/nftproxy/nft"
)

// This file writes and reads rules: NEWRULE (its expressions are in
// lower.go and expr.go), its userdata (comment and digest), and the rule
// dump Load reads a chain's count, digest and slots from.

// newRule writes NEWRULE (append). The comment travels as rule userdata
// (libnftnl NFTNL_UDATA_RULE_COMMENT = 0), and so does the digest of the
// chain's rules on a chain's first rule (see ruleUserdata).
func (b *batch) newRule(chain string, r nft.Rule, digest *nft.RulesDigest) error {
	m := b.begin(unix.NFT_MSG_NEWRULE, flagCreate|flagAppend)
	b.enc.Str(unix.NFTA_RULE_TABLE, b.table)
	b.enc.Str(unix.NFTA_RULE_CHAIN, chain)
	list := b.enc.Nest(unix.NFTA_RULE_EXPRESSIONS)
	if err := b.lowerRule(r); err != nil {
		return err
	}
	b.enc.EndNest(list)
	if err := b.enc.ruleUserdata(r.Comment, digest); err != nil {
		return err
	}
	b.end(m)
	return nil
}

// ruleUserdata writes a rule's userdata attribute, if it has any: its
// comment, then the digest of its chain's rules (nil: none). The kernel
// caps userdata at NFT_USERDATA_MAXLEN bytes; a digest that does not fit
// next to a long comment is left out, and the chain is then rewritten after
// a restart instead of kept.
func (e *encoder) ruleUserdata(comment string, digest *nft.RulesDigest) error {
	n := 0
	if comment != "" {
		if len(comment) > nft.MaxComment {
			return fmt.Errorf("comment %q: longer than %d bytes", comment, nft.MaxComment)
		}
		n = 2 + len(comment) + 1
	}
	if digest != nil && n+2+len(digest) > unix.NFT_USERDATA_MAXLEN {
		digest = nil
	}
	if digest != nil {
		n += 2 + len(digest)
	}
	if n == 0 || !e.AttrHeader(unix.NFTA_RULE_USERDATA, n) {
		return nil
	}
	if comment != "" {
		e.Buf = append(append(append(e.Buf, udataRuleComment, byte(len(comment)+1)), comment...), 0)
	}
	if digest != nil {
		e.Buf = append(append(e.Buf, udataRuleDigest, byte(len(digest))), digest[:]...)
	}
	e.Pad()
	return nil
}

// ruleDigest returns the digest a rule's userdata carries, if any.
func ruleDigest(ud []byte) (nft.RulesDigest, bool) {
	var d nft.RulesDigest
	for len(ud) >= 2 {
		typ, n := ud[0], int(ud[1])
		if 2+n > len(ud) {
			break
		}
		if typ == udataRuleDigest && n == len(d) {
			copy(d[:], ud[2:2+n])
			return d, true
		}
		ud = ud[2+n:]
	}
	return d, false
}

// ruleComment returns the comment a rule's userdata carries, if any.
func ruleComment(ud []byte) string {
	for len(ud) >= 2 {
		typ, n := ud[0], int(ud[1])
		if 2+n > len(ud) {
			break
		}
		if typ == udataRuleComment {
			return nlcodec.String(ud[2 : 2+n])
		}
		ud = ud[2+n:]
	}
	return ""
}

// loadRules counts the rules of chain c and takes the digest from the
// first, with a dump of its own. A dump of the whole table costs the
// kernel O(rules²): every resumed dump callback walks the table's rules
// from the first to where it stopped; per chain it is linear, most of it
// the kernel serialising their expressions (docs/code-figures.md).
func (n *Netlink) loadRules(f nft.Family, c *nft.Chain) error {
	req := func(e *encoder) {
		e.Str(unix.NFTA_RULE_TABLE, nft.TableName)
		e.Str(unix.NFTA_RULE_CHAIN, c.Name)
	}
	if err := n.dump(unix.NFT_MSG_GETRULE, f, req, func(attrs []byte) error {
		first := c.Loaded.Count == 0
		var d nlcodec.Decoder
		var r nft.Rule
		d.Attrs(attrs, func(typ uint16, data []byte) {
			switch {
			case typ == unix.NFTA_RULE_USERDATA:
				if first {
					c.Loaded.Digest, c.Loaded.HasDigest = ruleDigest(data)
				}
				if n.opts.Rules {
					r.Comment = ruleComment(data)
				}
			case typ == unix.NFTA_RULE_EXPRESSIONS:
				if s, ok := exprsSlot(&d, data); ok {
					c.Loaded.Slots = append(c.Loaded.Slots, s)
				}
				if n.opts.Rules {
					r.Phrases = raiseRule(f, decodeExprs(&d, data))
				}
			}
		})
		c.Loaded.Count++
		if n.opts.Rules {
			c.Rules = append(c.Rules, r)
		}
		return d.Err()
	}); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("%w: chain %s is gone", errLoadRaced, c.Name)
		}
		return fmt.Errorf("chain %s: %w", c.Name, err)
	}
	return nil
}

// exprsSlot finds the endpoints slot of a rule's expressions: a numgen
// random mod EndpointBuckets whose offset starts a slot, then a lookup,
// as lowerDNATMap writes them.
func exprsSlot(d *nlcodec.Decoder, exprs []byte) (nft.EndpointsSlot, bool) {
	var s nft.EndpointsSlot
	numgen, found := false, false
	d.Attrs(exprs, func(_ uint16, expr []byte) {
		var name, data []byte
		d.Attrs(expr, func(t uint16, v []byte) {
			switch t {
			case unix.NFTA_EXPR_NAME:
				name = v
			case unix.NFTA_EXPR_DATA:
				data = v
			}
		})
		switch nlcodec.String(name) {
		case "numgen":
			mod, offset := uint32(0), uint32(0)
			d.Attrs(data, func(t uint16, v []byte) {
				switch t {
				case unix.NFTA_NG_MODULUS:
					mod = d.BE32(v)
				case unix.NFTA_NG_OFFSET:
					offset = d.BE32(v)
				}
			})
			numgen = mod == nft.EndpointBuckets && offset%nft.EndpointBuckets == 0 && offset/nft.EndpointBuckets < nft.EndpointsSlots
			s.Slot = uint16(offset / nft.EndpointBuckets)
		case "lookup":
			if numgen && !found {
				d.Attrs(data, func(t uint16, v []byte) {
					if t == unix.NFTA_LOOKUP_SET {
						s.Map, found = nlcodec.String(v), true
					}
				})
			}
		}
	})
	return s, found
}

// Verdict codes (include/uapi/linux/netfilter.h, nf_tables.h): NF_DROP,
// NF_ACCEPT and the negative NFT_* codes, sent as a big-endian u32.
const (
	nfDrop   = 0
	nfAccept = 1
)

func verdictCode(k nft.VerdictKind) uint32 {
	var code int32
	switch k {
	case nft.VerdictAccept:
		code = nfAccept
	case nft.VerdictDrop:
		code = nfDrop
	case nft.VerdictReturn:
		code = unix.NFT_RETURN
	case nft.VerdictJump:
		code = unix.NFT_JUMP
	case nft.VerdictGoto:
		code = unix.NFT_GOTO
	default:
		code = unix.NFT_BREAK // not produced by nftproxy
	}
	return uint32(code)
}

// decodeVerdict decodes NFTA_DATA_VERDICT. A code nftproxy never writes
// comes back as a kind that equals no verdict of ours.
func decodeVerdict(d *nlcodec.Decoder, attrs []byte) nft.Verdict {
	var vd nft.Verdict
	code := int32(-1000)
	d.Attrs(attrs, func(t uint16, v []byte) {
		switch t {
		case unix.NFTA_VERDICT_CODE:
			code = int32(d.BE32(v))
		case unix.NFTA_VERDICT_CHAIN:
			vd.Chain = nlcodec.String(v)
		}
	})
	for _, k := range []nft.VerdictKind{nft.VerdictAccept, nft.VerdictDrop, nft.VerdictReturn, nft.VerdictJump, nft.VerdictGoto} {
		if int32(verdictCode(k)) == code {
			vd.Kind = k
			return vd
		}
	}
	vd.Kind = nft.VerdictKind(fmt.Sprintf("verdict(%d)", code))
	return vd
}
