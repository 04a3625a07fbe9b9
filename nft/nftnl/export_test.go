package nftnl

import "github.com/nftproxy/nftproxy/nft"

// EncodeForBench encodes tx into one netlink batch as Netlink.Apply does,
// for the benchmarks of package nft_test (encode_bench_test.go), which
// build their transactions with proxier/ruleset: package nft cannot import
// it. It returns the batch's size in bytes and messages.
func EncodeForBench(tx *nft.Transaction) (bytes, messages int, err error) {
	b, err := encodeTransaction(tx, batchOptions{firstSeq: 1, endFlags: flagAck})
	if err != nil {
		return 0, 0, err
	}
	return len(b.enc.Buf), len(b.owners), nil
}
