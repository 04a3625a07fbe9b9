// Package nftnl is nftproxy's nf_tables backend: it writes an
// nft.Transaction to the kernel as one nfnetlink batch that the kernel
// commits all-or-nothing (Netlink.Apply), reads the table back for a
// restart (Netlink.Load), rewrites it in place when it cannot build on it,
// lists and deletes other tables (kube-proxy's leftovers), and reports
// other processes' changes to the table (Monitor).
//
// Messages and expressions are encoded here, laid out as nft 1.0.6 lays
// them out, so that `nft list ruleset` prints what we wrote and reloads it;
// the netlink wire format itself (messages, attributes, ACKs) is internal/nlcodec's.
package nftnl
