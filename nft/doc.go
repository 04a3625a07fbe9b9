// Package nft is nftproxy's model of an nftables table: plain data and
// pure functions, no I/O.
//
// A Ruleset is the complete desired content of one table (chains with
// their rules, sets and maps with their elements). Diff compares the state
// last committed to the kernel with the desired state and returns a
// Transaction holding the minimal operations; an Interface applies a
// Transaction atomically. The implementations live beside this package:
// nft/nftnl writes it to the kernel as one nfnetlink batch, nft/nftfake is
// the in-memory fake that refuses what the kernel refuses, and nft/trace
// walks packets through a Ruleset.
//
// A restarted nftproxy does not start from nothing: a Loader reads the
// table back, chains carrying a digest of their rules instead of the rules
// (digest.go), and an Editor started from it (NewEditorFrom) writes only
// what differs. That editor builds the desired sets in the memory of the
// sets read back (adoption, edit.go), so that a restart does not hold two
// copies of every element.
//
// Rules are built only from the closed set of phrases in rule.go. Each
// phrase knows the nft text it stands for; nft/nftnl lowers it to kernel
// expressions and nft/trace evaluates it, so `nft list ruleset` always
// decompiles what we write back into the text our tests expect.
package nft
