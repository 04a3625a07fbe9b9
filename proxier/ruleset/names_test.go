package ruleset

import (
	"crypto/sha256"
	"encoding/base32"
	"strings"
	"testing"

	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/proxier/model"
)

// TestChainNameIsStable: chain names are in the kernel's table, so they
// must not change across versions (a restart would rewrite every chain).
// They are checked against names written before, and against the
// definition: kind, the first 8 characters of the base32 SHA-256 of
// "<ns>/<name>:<port>/<proto>", and "<ns>/<name>/<proto>/<port>".
func TestChainNameIsStable(t *testing.T) {
	for _, tc := range []struct {
		kind string
		n    model.ServicePortName
		want string
	}{
		{kindService, spName("default", "web", "http", nft.ProtoTCP), "service-OSC5D42R-default/web/tcp/http"},
		{kindService, spName("kube-system", "dns", "dns", nft.ProtoUDP), "service-67REBLX4-kube-system/dns/udp/dns"},
	} {
		if got := ChainName(tc.kind, tc.n); got != tc.want {
			t.Errorf("ChainName(%s, %v) = %q, want %q", tc.kind, tc.n, got, tc.want)
		}
	}
	long := strings.Repeat("n", 63)
	for _, n := range []model.ServicePortName{
		spName("", "", "", nft.ProtoSCTP),
		spName(long, long, long, nft.ProtoTCP), // over the hash's stack buffer
		spName("a", "b", "", nft.ProtoUDP),
	} {
		sum := sha256.Sum256([]byte(n.Namespace + "/" + n.Name + ":" + n.Port + "/" + nft.ProtoName(n.Protocol)))
		want := kindLocal + "-" + base32.StdEncoding.EncodeToString(sum[:])[:8] + "-" +
			n.Namespace + "/" + n.Name + "/" + nft.ProtoName(n.Protocol) + "/" + n.Port
		if got := ChainName(kindLocal, n); got != want {
			t.Errorf("ChainName(%v) = %q, want %q", n, got, want)
		}
	}
}
