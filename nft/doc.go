// Package nft is nftproxy's model of an nftables table and the ways to
// program it.
//
// A Ruleset is plain data: the complete desired content of one table (chains
// with their rules, sets and maps with their elements). Diff compares the
// state last committed to the kernel with the desired state and returns a
// Transaction holding the minimal operations; an Interface applies a
// Transaction atomically, either to the kernel over netlink (one nfnetlink
// batch, see Netlink) or to the in-memory Fake used by tests.
//
// A restarted nftproxy does not start from nothing: a Loader (Netlink, or
// the Fake) reads the table back, chains carrying a digest of their rules
// instead of the rules (digest.go), and an Editor started from it
// (NewEditorFrom) writes only what differs. That editor builds the desired
// sets in the memory of the sets read back (adoption, edit.go), so that a
// restart does not hold two copies of every element.
//
// Rules are built only from the closed set of phrases in rule.go. Each phrase
// knows the nft text it stands for, the kernel expressions it lowers to, and
// how the Fake evaluates it, so `nft list ruleset` always decompiles what we
// write back into the text our tests expect.
package nft
