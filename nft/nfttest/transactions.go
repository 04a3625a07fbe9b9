package nfttest

import (
	"fmt"
	"slices"
	"strings"

	"github.com/nftproxy/nftproxy/nft"
)

// OpCounts summarises a transaction: operations by kind, and elements.
func OpCounts(tx *nft.Transaction) string {
	kinds := map[nft.OpKind]int{}
	for _, op := range tx.Ops {
		if op.Kind == nft.OpAddElements || op.Kind == nft.OpDeleteElements {
			kinds[op.Kind] += len(op.Elements)
		} else {
			kinds[op.Kind]++
		}
	}
	var parts []string
	for k := nft.OpResetTable; k <= nft.OpDeleteElements; k++ {
		if kinds[k] > 0 {
			parts = append(parts, fmt.Sprintf("%s:%d", k, kinds[k]))
		}
	}
	return strings.Join(parts, " ")
}

// RewrittenChains names the chains a transaction flushes or adds rules to.
func RewrittenChains(tx *nft.Transaction) []string {
	seen := map[string]bool{}
	for _, op := range tx.Ops {
		switch op.Kind {
		case nft.OpFlushChain:
			seen[op.Chain.Name] = true
		case nft.OpAddRule:
			seen[op.ChainName] = true
		}
	}
	var out []string
	for n := range seen {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

// FirstDiff says where an nft listing and a Dump first differ.
func FirstDiff(a, b string) string {
	al, bl := strings.Split(a, "\n"), strings.Split(b, "\n")
	for i := range min(len(al), len(bl)) {
		if al[i] != bl[i] {
			return fmt.Sprintf("line %d:\n  nft:  %q\n  Dump: %q", i+1, al[i], bl[i])
		}
	}
	return fmt.Sprintf("%d lines against %d", len(al), len(bl))
}
