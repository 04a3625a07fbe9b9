package staleflows

import (
	"context"
	"net/netip"
	"reflect"
	"testing"
	"time"

	"github.com/nftproxy/nftproxy/conntrack"
	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/proxier/model"
)

var (
	dns = model.ServiceName{Namespace: "kube-system", Name: "dns"}
	web = model.ServiceName{Namespace: "default", Name: "web"}
)

func port(name model.ServiceName, proto uint8, clusterIP string, p uint16, endpoints ...string) model.ServicePortState {
	sp := model.ServicePortState{Name: model.ServicePortName{ServiceName: name, Protocol: proto},
		ClusterIP: netip.MustParseAddr(clusterIP), Port: p}
	for _, e := range endpoints {
		sp.Endpoints = append(sp.Endpoints, netip.MustParseAddrPort(e))
	}
	return sp
}

func fe(proto uint8, addr string, p uint16) conntrack.Frontend {
	return conntrack.Frontend{Proto: proto, Addr: netip.MustParseAddr(addr), Port: p}
}

// TestJobAdd: a UDP port's frontends are recorded before and after, a TCP
// port only when it is new.
func TestJobAdd(t *testing.T) {
	j := NewJob()
	if !j.Empty() {
		t.Fatal("a new job is not empty")
	}
	tcp := port(web, nft.ProtoTCP, "10.96.0.10", 80, "10.244.1.5:8080")
	j.Add(web, []model.ServicePortState{tcp}, []model.ServicePortState{tcp})
	if !j.Empty() {
		t.Fatal("a TCP port that stayed made the job non-empty")
	}
	j.Add(dns, []model.ServicePortState{port(dns, nft.ProtoUDP, "10.96.0.53", 53, "10.244.1.20:5353")},
		[]model.ServicePortState{port(dns, nft.ProtoUDP, "10.96.0.53", 53, "10.244.1.21:5353"),
			port(dns, nft.ProtoTCP, "10.96.0.53", 53, "10.244.1.21:5353")})
	udp := fe(nft.ProtoUDP, "10.96.0.53", 53)
	if want := (conntrack.Frontends{udp: {netip.MustParseAddrPort("10.244.1.20:5353")}}); !reflect.DeepEqual(j.previous, want) {
		t.Errorf("previous = %v, want %v", j.previous, want)
	}
	if want := (conntrack.Frontends{udp: {netip.MustParseAddrPort("10.244.1.21:5353")}}); !reflect.DeepEqual(j.current[dns], want) {
		t.Errorf("current[dns] = %v, want %v", j.current[dns], want)
	}
	if want := []conntrack.Frontend{fe(nft.ProtoTCP, "10.96.0.53", 53)}; !reflect.DeepEqual(j.opened, want) {
		t.Errorf("opened = %v, want %v", j.opened, want)
	}
}

// TestCleanerMergesQueuedJobs: jobs queued while none runs become one
// Reconcile, which looks for the frontends any of them had before and
// judges flows by each Service's latest frontends.
func TestCleanerMergesQueuedJobs(t *testing.T) {
	udp := func(eps ...string) []model.ServicePortState {
		return []model.ServicePortState{port(dns, nft.ProtoUDP, "10.96.0.53", 53, eps...)}
	}
	first, second := NewJob(), NewJob()
	first.Add(dns, udp("10.244.1.20:5353"), udp("10.244.1.21:5353"))
	second.Add(dns, udp("10.244.1.21:5353"), udp("10.244.1.22:5353"))
	fake := &signalling{Fake: conntrack.NewFake(), done: make(chan struct{}, 4)}
	c := New(fake)
	c.Enqueue(nft.IPv4, first, nil)
	c.Enqueue(nft.IPv4, second, nil)
	ctx, cancel := context.WithCancel(context.Background())
	stopped := make(chan struct{})
	go func() { c.Run(ctx); close(stopped) }()
	select {
	case <-fake.done:
	case <-time.After(10 * time.Second):
		t.Fatal("the queued jobs did not run")
	}
	cancel()
	<-stopped
	calls := fake.Reconciles()
	if len(calls) != 1 {
		t.Fatalf("%d Reconciles, want one for the merged jobs", len(calls))
	}
	key := fe(nft.ProtoUDP, "10.96.0.53", 53)
	ap := netip.MustParseAddrPort
	if got, want := calls[0].Previous[key], []netip.AddrPort{ap("10.244.1.20:5353"), ap("10.244.1.21:5353")}; !reflect.DeepEqual(got, want) {
		t.Errorf("previous endpoints = %v, want %v", got, want)
	}
	if got, want := calls[0].Current[key], []netip.AddrPort{ap("10.244.1.22:5353")}; !reflect.DeepEqual(got, want) {
		t.Errorf("current endpoints = %v, want %v", got, want)
	}
}

// signalling tells of each Reconcile once it is done.
type signalling struct {
	*conntrack.Fake
	done chan struct{}
}

func (s *signalling) Reconcile(ctx context.Context, family conntrack.Family, previous conntrack.Frontends,
	current func() conntrack.Frontends, isNodePortAddr func(netip.Addr) bool) (conntrack.Result, error) {
	res, err := s.Fake.Reconcile(ctx, family, previous, current, isNodePortAddr)
	s.done <- struct{}{}
	return res, err
}

func TestNodePortMatcher(t *testing.T) {
	is := NodePortMatcher([]netip.Addr{netip.MustParseAddr("10.10.0.2")}, []netip.Prefix{netip.MustParsePrefix("192.168.0.0/24")})
	for addr, want := range map[string]bool{"10.10.0.2": true, "10.10.0.3": false, "192.168.0.7": true, "127.0.0.1": false} {
		if got := is(netip.MustParseAddr(addr)); got != want {
			t.Errorf("NodePortMatcher(%s) = %v, want %v", addr, got, want)
		}
	}
	loop := NodePortMatcher(nil, []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8")})
	if loop(netip.MustParseAddr("127.0.0.1")) {
		t.Error("a loopback address matches")
	}
}
