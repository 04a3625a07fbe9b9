package nfttest

import (
	"context"
	"testing"

	"github.com/nftproxy/nftproxy/nft"
)

func MustLoad(t testing.TB, fk nft.Loader, f nft.Family) *nft.Ruleset {
	t.Helper()
	rs, err := fk.Load(context.Background(), f)
	if err != nil {
		t.Fatal(err)
	}
	return rs
}
