package proxier

import (
	"context"
	"encoding/binary"
	"fmt"
	"net/netip"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nftproxy/nftproxy/nft/nftfake"

	"github.com/nftproxy/nftproxy/nft/nftnl"

	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/nftproxy/nftproxy/internal/testutil/liveheap"
	"github.com/nftproxy/nftproxy/internal/testutil/netns"
	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/proxier/model"
	"github.com/nftproxy/nftproxy/proxier/model/benchstate"
	"github.com/nftproxy/nftproxy/proxier/watch/benchapi"
)

// The proxier's benchmarks run the sync loop's own code (checkout, model,
// fragments, Editor, transaction) on the API state of e2e/cmd/bench
// (benchstate); see docs/profiles.md for the commands and results.

var benchConfig = Config{NodeName: "node-0", MasqueradeBit: 14, SyncPeriod: time.Hour, FullSyncPeriod: time.Hour,
	ClusterCIDRs: []netip.Prefix{netip.MustParsePrefix("10.244.0.0/16")},
	ServiceCIDRs: []netip.Prefix{netip.MustParsePrefix("10.96.0.0/12")}}

// benchDualModels are benchstate.Cluster with, for every Service, an IPv6
// ClusterIP (fd00:96::/112) and an IPv6 EndpointSlice svc-i-2 of the same
// shape (fd00:128::/64): a dual-stack cluster.
func benchDualModels(sz benchstate.Size) ([]*model.Service, []*model.EndpointSlice) {
	svcs, v4 := benchstate.Cluster(sz)
	all := make([]*model.EndpointSlice, 0, 2*len(v4))
	for i, es := range v4 {
		svcs[i].ClusterIPs = append(svcs[i].ClusterIPs, benchIPv6(0xfd00_0096, uint32(i+10)))
		es6 := *es
		es6.Name, es6.Family = svcs[i].Name.Name+"-2", nft.IPv6
		es6.Endpoints = slices.Clone(es.Endpoints)
		for j := range es6.Endpoints {
			es6.Endpoints[j].IP = model.IPOf(benchIPv6(0xfd00_0128, uint32(i*sz.Endpoints+j)))
		}
		all = append(all, es, &es6)
	}
	return svcs, all
}

// benchIPv6 is the address prefix32::n.
func benchIPv6(prefix32, n uint32) netip.Addr {
	var a [16]byte
	binary.BigEndian.PutUint32(a[:], prefix32)
	binary.BigEndian.PutUint32(a[12:], n)
	return netip.AddrFrom16(a)
}

// benchDualConfig is benchConfig with the IPv6 CIDRs of benchDualModels.
var benchDualConfig = func() Config {
	c := benchConfig
	c.ClusterCIDRs = append(slices.Clone(c.ClusterCIDRs), netip.MustParsePrefix("fd00:128::/64"))
	c.ServiceCIDRs = append(slices.Clone(c.ServiceCIDRs), netip.MustParsePrefix("fd00:96::/112"))
	return c
}()

// benchProxier is a Proxier whose trackers hold the objects, as after the
// informers synced: its next sync is the first, full one.
func benchProxier(b *testing.B, backend nft.Backend, svcs []*model.Service, slices []*model.EndpointSlice) *Proxier {
	return benchProxierWith(b, benchConfig, map[nft.Family]nft.Backend{nft.IPv4: backend}, svcs, slices)
}

func benchProxierWith(b *testing.B, cfg Config, backends map[nft.Family]nft.Backend, svcs []*model.Service,
	slices []*model.EndpointSlice) *Proxier {
	p, err := New(cfg, Deps{NFT: backends})
	if err != nil {
		b.Fatal(err)
	}
	for _, svc := range svcs {
		p.trackers.Services.Set(svc.Name, svc)
	}
	for _, es := range slices {
		p.trackers.Slices.Set(model.SliceKey{Namespace: es.Service.Namespace, Name: es.Name}, es)
	}
	return p
}

// BenchmarkProxierFullSync times the first sync of a proxier whose
// trackers hold every object: checkout, record, the model and fragment of
// every Service, the Editor, the full-rewrite transaction and its Apply to
// a backend that discards it (the proxier's own cost) or to nftfake.Fake.
// other-family is the IPv6 family of a dual-stack node whose Services are
// all IPv4: what a family without Services costs.
func BenchmarkProxierFullSync(b *testing.B) {
	for _, sz := range benchstate.Sizes {
		svcs, slices := benchstate.Cluster(sz)
		for _, backend := range []string{"discard", "fake", "other-family"} {
			b.Run(sz.String()+"/"+backend, func(b *testing.B) {
				b.ReportAllocs()
				for i := 0; i < b.N; i++ {
					b.StopTimer()
					var be nft.Backend = &nftfake.Discard{}
					if backend == "fake" {
						be = nftfake.New()
					}
					var p *Proxier
					if backend == "other-family" {
						p = benchProxierWith(b, benchConfig, map[nft.Family]nft.Backend{nft.IPv6: be}, svcs, slices)
					} else {
						p = benchProxier(b, be, svcs, slices)
					}
					runtime.GC()
					b.StartTimer()
					if err := p.sync(context.Background()); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// BenchmarkProxierSingleChange times a sync after one endpoint of one
// Service moved (e2e/cmd/bench's single change), the proxier holding every
// Service: it must not grow with their number. The backend discards.
func BenchmarkProxierSingleChange(b *testing.B) {
	for _, sz := range benchstate.Sizes {
		b.Run(sz.String(), func(b *testing.B) {
			svcs, slices := benchstate.Cluster(sz)
			be := &nftfake.Discard{}
			p := benchProxier(b, be, svcs, slices)
			if err := p.sync(context.Background()); err != nil {
				b.Fatal(err)
			}
			be.Ops = 0
			gen := 0
			b.ReportAllocs()
			for b.Loop() {
				gen++
				i := gen * 7919 % sz.Services
				_, es := benchstate.Service(sz, i, gen)
				p.trackers.Slices.Set(model.SliceKey{Namespace: "bench", Name: es.Name}, es)
				if err := p.sync(context.Background()); err != nil {
					b.Fatal(err)
				}
			}
			b.ReportMetric(float64(be.Ops)/float64(b.N), "ops/change")
		})
	}
}

// BenchmarkProxierMemory measures (once per iteration; run with
// -benchtime 1x) the live heap of each stage of the sync loop at each size,
// in MiB: the converted model objects, the trackers holding them, what the
// proxier retains after its first sync (its maps, the Editor's ruleset,
// the fragments and service ports), and everything live while the full
// transaction is being applied (the peak, without the netlink batch: see
// nft.BenchmarkEncodeFullSync). The informer caches come on top (see
// BenchmarkProxierStartup). With NFTPROXY_HEAPPROFILE=<prefix>, heap
// profiles <prefix>-<size>-{retained,apply}.pprof are written at those two
// points.
func BenchmarkProxierMemory(b *testing.B) {
	for _, sz := range benchstate.Sizes {
		b.Run(sz.String(), func(b *testing.B) {
			for b.Loop() {
				h0 := liveheap.Bytes()
				svcs, slices := benchstate.Cluster(sz)
				h1 := liveheap.Bytes()
				var hApply uint64
				be := &nftfake.Discard{OnApply: func(*nft.Transaction) {
					hApply = liveheap.Bytes()
					benchHeapProfile(b, sz, "apply")
				}}
				p := benchProxier(b, be, svcs, slices)
				h2 := liveheap.Bytes()
				if err := p.sync(context.Background()); err != nil {
					b.Fatal(err)
				}
				h3 := liveheap.Bytes()
				benchHeapProfile(b, sz, "retained")
				mib := liveheap.MiB
				b.ReportMetric(mib(h1)-mib(h0), "model-MiB")
				b.ReportMetric(mib(h2)-mib(h1), "trackers-MiB")
				b.ReportMetric(mib(h3)-mib(h2), "proxier-MiB")
				b.ReportMetric(mib(h3)-mib(h0), "retained-MiB")
				b.ReportMetric(mib(hApply)-mib(h0), "at-apply-MiB")
				runtime.KeepAlive(p)
			}
		})
	}
}

func benchHeapProfile(b *testing.B, sz benchstate.Size, point string) {
	prefix := os.Getenv("NFTPROXY_HEAPPROFILE")
	if prefix == "" {
		return
	}
	f, err := os.Create(fmt.Sprintf("%s-%s-%s.pprof", prefix, sz, point))
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	if err := pprof.Lookup("heap").WriteTo(f, 0); err != nil {
		b.Fatal(err)
	}
}

// firstApply signals when its backend's first Apply has returned.
type firstApply struct {
	nft.Backend
	once sync.Once
	done chan struct{}
}

func (f *firstApply) Apply(ctx context.Context, tx *nft.Transaction) error {
	err := f.Backend.Apply(ctx, tx)
	f.once.Do(func() { close(f.done) })
	return err
}

// BenchmarkProxierStartup times Run from start to the end of the first
// sync's Apply, with a fake clientset holding every Service and
// EndpointSlice: the informers' list, conversion, trackers, and the full
// sync (backend: discard). It reports the live heap the informers and the
// proxier add once synced (informer-and-proxier-MiB); the fake clientset's
// own copy of the objects is excluded.
func BenchmarkProxierStartup(b *testing.B) {
	for _, sz := range benchstate.Sizes {
		b.Run(sz.String(), func(b *testing.B) {
			objs := make([]kruntime.Object, 0, 2*sz.Services)
			for i := 0; i < sz.Services; i++ {
				svc, es := benchapi.Objects(sz, i)
				objs = append(objs, svc, es)
			}
			var grown float64
			b.ReportAllocs()
			for i := 0; i < b.N; i++ {
				b.StopTimer()
				client := fake.NewClientset(objs...)
				be := &firstApply{Backend: &nftfake.Discard{}, done: make(chan struct{})}
				p, err := New(benchConfig, Deps{Client: client, NFT: map[nft.Family]nft.Backend{nft.IPv4: be}})
				if err != nil {
					b.Fatal(err)
				}
				h0 := liveheap.Bytes()
				ctx, cancel := context.WithCancel(context.Background())
				stopped := make(chan struct{})
				b.StartTimer()
				go func() { _ = p.Run(ctx); close(stopped) }()
				<-be.done
				b.StopTimer()
				grown = liveheap.MiB(liveheap.Bytes()) - liveheap.MiB(h0)
				benchHeapProfile(b, sz, "startup")
				cancel()
				<-stopped
				runtime.KeepAlive(client)
				b.StartTimer()
			}
			b.ReportMetric(grown, "informer-and-proxier-MiB")
		})
	}
}

// BenchmarkProxierKernelFullSync is the first sync of a proxier into a real
// kernel table (a fresh network namespace, nftnl.Netlink): it reports the
// batch's encode and kernel time, and the process's peak RSS (VmHWM) in MB
// until then. The model objects the process holds stand for the informer
// caches of the real proxy, without client-go's own memory: the RSS is a
// lower bound of the real process's. Then the first proxier is dropped and
// a second one starts on the same objects and table, as after a restart:
// restart-s is its first sync (reading the table back and diffing against
// it), restart-ops the operations it sent (0: nothing rewritten),
// restart-peak-RSS-MB the process's peak from the restart on (VmHWM reset
// through clear_refs). VmHWM is the process's high-water mark, so run one
// size per process:
//
//	go test ./proxier -run '^$' -bench 'KernelFullSync/100kx10$' -benchtime 1x
//
// (GOMEMLIMIT in the environment applies, as it does to the proxy.)
func BenchmarkProxierKernelFullSync(b *testing.B) {
	for _, sz := range benchstate.Sizes {
		b.Run(sz.String(), func(b *testing.B) {
			ns := netns.New(b, "nftproxy-bk")
			for b.Loop() {
				b.StopTimer()
				backend := benchNetlink(b, ns.Fd)
				svcs, slices := benchstate.Cluster(sz)
				p := benchProxier(b, backend, svcs, slices)
				b.StartTimer()
				if err := p.sync(context.Background()); err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				st := backend.LastBatch()
				b.ReportMetric(st.Encode.Seconds()*1000, "encode-ms")
				b.ReportMetric(st.Kernel.Seconds()*1000, "kernel-ms")
				b.ReportMetric(st.KernelCPU.Seconds()*1000, "kernel-cpu-ms")
				b.ReportMetric(float64(st.Bytes)/(1<<20), "batch-MiB")
				b.ReportMetric(peakRSS(b)/1e6, "peak-RSS-MB")

				p = nil // not part of the restart's memory
				runtime.GC()
				debug.FreeOSMemory()
				resetPeakRSS(b)
				restarted := benchNetlink(b, ns.Fd)
				p2 := benchProxier(b, restarted, svcs, slices)
				start := time.Now()
				if err := p2.sync(context.Background()); err != nil {
					b.Fatal(err)
				}
				b.ReportMetric(time.Since(start).Seconds(), "restart-s")
				b.ReportMetric(float64(restarted.ops), "restart-ops")
				b.ReportMetric(peakRSS(b)/1e6, "restart-peak-RSS-MB")
				drop := &nft.Transaction{Family: nft.IPv4, Ops: []nft.Op{{Kind: nft.OpDeleteTable}}}
				if err := restarted.Apply(context.Background(), drop); err != nil {
					b.Fatal(err)
				}
				b.StartTimer()
			}
		})
	}
}

// BenchmarkProxierKernelDualStack times the first sync of a dual-stack
// node into a kernel (a network namespace of its own): every Service of
// benchDualModels in both families' tables, each family's transaction sent
// by its own backend. ns/op is the time until both tables are programmed.
func BenchmarkProxierKernelDualStack(b *testing.B) {
	for _, sz := range benchstate.Sizes[:2] {
		b.Run(sz.String(), func(b *testing.B) {
			ns := netns.New(b, "nftproxy-bd")
			for b.Loop() {
				b.StopTimer()
				v4, v6 := benchNetlink(b, ns.Fd), benchNetlink(b, ns.Fd)
				svcs, slices := benchDualModels(sz)
				p := benchProxierWith(b, benchDualConfig, map[nft.Family]nft.Backend{nft.IPv4: v4, nft.IPv6: v6}, svcs, slices)
				b.StartTimer()
				if err := p.sync(context.Background()); err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				for f, be := range map[nft.Family]*countingNetlink{nft.IPv4: v4, nft.IPv6: v6} {
					st := be.LastBatch()
					b.ReportMetric(st.Kernel.Seconds()*1000, strings.ToLower(f.IPFamily())+"-kernel-ms")
					drop := &nft.Transaction{Family: f, Ops: []nft.Op{{Kind: nft.OpDeleteTable}}}
					if err := be.Apply(context.Background(), drop); err != nil {
						b.Fatal(err)
					}
				}
				b.ReportMetric(peakRSS(b)/1e6, "peak-RSS-MB")
				b.StartTimer()
			}
		})
	}
}

// countingNetlink is nftnl.Netlink (Apply, Load, LastBatch) counting the
// transactions and operations it applies.
type countingNetlink struct {
	*nftnl.Netlink
	ops     int
	applied int // transactions
}

func (c *countingNetlink) Apply(ctx context.Context, tx *nft.Transaction) error {
	c.ops += len(tx.Ops)
	c.applied++
	return c.Netlink.Apply(ctx, tx)
}

func benchNetlink(b *testing.B, nsFd int) *countingNetlink {
	n, err := nftnl.NewNetlink(nftnl.NetlinkOptions{NetNSFd: nsFd})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { n.Close() })
	return &countingNetlink{Netlink: n}
}

// resetPeakRSS sets the process's VmHWM to its current RSS.
func resetPeakRSS(b *testing.B) {
	if err := os.WriteFile("/proc/self/clear_refs", []byte("5"), 0); err != nil {
		b.Fatal(err)
	}
}

// peakRSS is the process's VmHWM in bytes.
func peakRSS(b *testing.B) float64 {
	status, err := os.ReadFile("/proc/self/status")
	if err != nil {
		b.Fatal(err)
	}
	for _, line := range strings.Split(string(status), "\n") {
		if kb, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			var n float64
			fmt.Sscan(strings.TrimSuffix(strings.TrimSpace(kb), " kB"), &n)
			return n * 1024
		}
	}
	b.Fatal("no VmHWM in /proc/self/status")
	return 0
}
