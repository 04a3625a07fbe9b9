package nftnl

import (
	"golang.org/x/sys/unix"

	"github.com/nftproxy/nftproxy/internal/nlcodec"
	"github.com/nftproxy/nftproxy/nft"
)

// This file writes and reads chains: NEWCHAIN, DELCHAIN, the flush of a
// chain's rules, and the chain dump.

// hookNum maps a hook to its number in include/uapi/linux/netfilter.h.
var hookNum = map[nft.Hook]uint32{
	nft.HookPrerouting:  unix.NF_INET_PRE_ROUTING,
	nft.HookInput:       unix.NF_INET_LOCAL_IN,
	nft.HookForward:     unix.NF_INET_FORWARD,
	nft.HookOutput:      unix.NF_INET_LOCAL_OUT,
	nft.HookPostrouting: unix.NF_INET_POST_ROUTING,
}

// newChain writes NEWCHAIN; a base chain carries its type, policy accept and
// hook, in nft's attribute order.
func (b *batch) newChain(c *nft.Chain) {
	m := b.begin(unix.NFT_MSG_NEWCHAIN, flagCreate)
	b.enc.Str(unix.NFTA_CHAIN_TABLE, b.table)
	b.enc.Str(unix.NFTA_CHAIN_NAME, c.Name)
	if c.Base != nil {
		b.enc.Str(unix.NFTA_CHAIN_TYPE, string(c.Base.Type))
		b.enc.BE32(unix.NFTA_CHAIN_POLICY, nfAccept)
		h := b.enc.Nest(unix.NFTA_CHAIN_HOOK)
		b.enc.BE32(unix.NFTA_HOOK_HOOKNUM, hookNum[c.Base.Hook])
		b.enc.BE32(unix.NFTA_HOOK_PRIORITY, uint32(c.Base.Priority))
		b.enc.EndNest(h)
	}
	b.end(m)
}

// chainMsg writes DELCHAIN, or DELRULE with only the chain (flush chain).
func (b *batch) chainMsg(msgType uint16, chain string) {
	m := b.begin(msgType, 0)
	b.enc.Str(unix.NFTA_CHAIN_TABLE, b.table) // == NFTA_RULE_TABLE
	if msgType == unix.NFT_MSG_DELRULE {
		b.enc.Str(unix.NFTA_RULE_CHAIN, chain)
	} else {
		b.enc.Str(unix.NFTA_CHAIN_NAME, chain)
	}
	b.end(m)
}

// Attributes and flags golang.org/x/sys/unix does not name
// (include/uapi/linux/netfilter/nf_tables.h).
const (
	nftaChainFlags  = 10  // NFTA_CHAIN_FLAGS
	nftaHookDevs    = 4   // NFTA_HOOK_DEVS
	nftChainBase    = 1   // NFT_CHAIN_BASE, on every base chain
	nftChainBinding = 0x4 // NFT_CHAIN_BINDING: an anonymous chain of a rule
)

// decodeChain decodes a NEWCHAIN of a chain dump; nil if the chain is not
// in our table. binding reports an anonymous chain of a rule.
func decodeChain(d *nlcodec.Decoder, attrs []byte) (c *nft.Chain, binding bool) {
	var table, name, typ []byte
	var hook []byte
	policy, flags := uint32(nfAccept), uint32(0)
	d.Attrs(attrs, func(t uint16, data []byte) {
		switch t {
		case unix.NFTA_CHAIN_TABLE:
			table = data
		case unix.NFTA_CHAIN_NAME:
			name = data
		case unix.NFTA_CHAIN_TYPE:
			typ = data
		case unix.NFTA_CHAIN_HOOK:
			hook = data
		case unix.NFTA_CHAIN_POLICY:
			policy = d.BE32(data)
		case nftaChainFlags:
			flags = d.BE32(data)
		}
	})
	if nlcodec.String(table) != nft.TableName {
		return nil, false
	}
	binding = flags&nftChainBinding != 0
	c = &nft.Chain{Name: nlcodec.String(name), Loaded: &nft.LoadedRules{}}
	if flags&^nftChainBase != 0 {
		c.Loaded.Foreign = true
	}
	if hook == nil {
		return c, binding
	}
	c.Base = &nft.BaseChain{Type: nft.ChainType(nlcodec.String(typ))}
	var num uint32
	var dev bool
	d.Attrs(hook, func(t uint16, data []byte) {
		switch t {
		case unix.NFTA_HOOK_HOOKNUM:
			num = d.BE32(data)
		case unix.NFTA_HOOK_PRIORITY:
			c.Base.Priority = int32(d.BE32(data))
		case unix.NFTA_HOOK_DEV, nftaHookDevs:
			dev = true
		}
	})
	c.Base.Hook = hookName(num)
	if policy != nfAccept || dev || c.Base.Hook == "" {
		c.Loaded.Foreign = true
	}
	return c, binding
}

func hookName(num uint32) nft.Hook {
	for h, n := range hookNum {
		if n == num {
			return h
		}
	}
	return ""
}
