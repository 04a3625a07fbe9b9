package testbed

import (
	"bufio"
	"context"
	"fmt"
	"net/netip"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/nftproxy/nftproxy/nft"
)

// What the fault and soak tests share: a load that counts lost
// connections, a proxy's metrics, and nftproxy's tables in a form that can
// be compared with a fresh proxy's.

// Load is a `probe load` running in a pod: new TCP connections at a steady
// rate and long-lived ones, each failure counted.
type Load struct {
	t TB
	p *Process
}

// LoadResult is what a Load counted.
type LoadResult struct {
	Attempted, Answered, Failed, Held, Broken int
	Events                                    []string // the "fail" and "broken" lines
}

// StartLoad opens rate new TCP connections per second from pod to addr and
// holds hold long-lived ones (the servers must run `probe serve --echo`);
// probe is the probe binary (ProbePath).
func StartLoad(t TB, pod *Pod, probe string, addr netip.AddrPort, rate, hold int) *Load {
	t.Helper()
	p := pod.Start(probe, "load", "--addr", addr.String(), "--rate", strconv.Itoa(rate),
		"--hold", strconv.Itoa(hold), "--timeout", "2s")
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := p.WaitForLog(ctx, "ready held="); err != nil {
		t.Fatal(err)
	}
	return &Load{t: t, p: p}
}

var loadSummary = regexp.MustCompile(`summary attempted=(\d+) answered=(\d+) failed=(\d+) held=(\d+) broken=(\d+)`)

// Stop ends the load and returns its counts.
func (l *Load) Stop() LoadResult {
	l.t.Helper()
	l.p.Stop(30 * time.Second)
	log := l.p.Log()
	m := loadSummary.FindStringSubmatch(log)
	if m == nil {
		l.t.Fatalf("probe load printed no summary:\n%s", log)
	}
	n := func(i int) int { v, _ := strconv.Atoi(m[i]); return v }
	r := LoadResult{Attempted: n(1), Answered: n(2), Failed: n(3), Held: n(4), Broken: n(5)}
	sc := bufio.NewScanner(strings.NewReader(log))
	for sc.Scan() {
		if line := sc.Text(); strings.HasPrefix(line, "fail ") || strings.HasPrefix(line, "broken ") {
			r.Events = append(r.Events, line)
		}
	}
	return r
}

// Lost reports whether any new connection failed or long-lived one broke
// (or nothing was attempted), with a summary either way.
func (r LoadResult) Lost() (bool, string) {
	s := fmt.Sprintf("%d new connections attempted, %d failed; %d long-lived, %d broken",
		r.Attempted, r.Failed, r.Held, r.Broken)
	if r.Failed != 0 || r.Broken != 0 || r.Attempted == 0 {
		return true, s + ":\n" + strings.Join(r.Events[:min(len(r.Events), 20)], "\n")
	}
	return false, s
}

// Metric sums the samples of metric name on a proxy's metrics server
// (http://127.0.0.1:10249 in ns) whose labels include every label given
// ("k=v").
func Metric(ns Netns, name string, labels ...string) (float64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	body, err := ns.HTTPGet(ctx, "http://127.0.0.1:10249/metrics")
	if err != nil {
		return 0, err
	}
	return sumSamples(body, name, labels...), nil
}

// FullSyncs reports whether the proxy serving metrics in ns (nftproxy or
// upstream kube-proxy: both export
// kubeproxy_sync_full_proxy_rules_duration_seconds) has done a full sync
// of both families.
func FullSyncs(ns Netns) bool {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	body, err := ns.HTTPGet(ctx, "http://127.0.0.1:10249/metrics")
	if err != nil {
		return false
	}
	for _, fam := range []string{"IPv4", "IPv6"} {
		if sumSamples(body, "kubeproxy_sync_full_proxy_rules_duration_seconds_count", "ip_family="+fam) < 1 {
			return false
		}
	}
	return true
}

// sumSamples sums the samples of metric name in body (Prometheus text)
// whose labels include every label given ("k=v").
func sumSamples(body, name string, labels ...string) float64 {
	var sum float64
	for _, line := range strings.Split(body, "\n") {
		if !strings.HasPrefix(line, name+" ") && !strings.HasPrefix(line, name+"{") {
			continue
		}
		ok := true
		for _, l := range labels {
			k, v, _ := strings.Cut(l, "=")
			ok = ok && strings.Contains(line, k+`="`+v+`"`)
		}
		if f := strings.Fields(line); ok && len(f) >= 2 {
			v, _ := strconv.ParseFloat(f[len(f)-1], 64)
			sum += v
		}
	}
	return sum
}

// Tables returns nftproxy's tables of both families in ns, canonical
// (nft.Canonical) and with the endpoint slots resolved (ResolveSlots).
func Tables(ns Netns) (string, error) {
	var out strings.Builder
	for _, fam := range []string{"ip", "ip6"} {
		listing, err := ns.Exec(context.Background(), "nft", "list", "table", fam, nft.TableName)
		if err != nil {
			return "", fmt.Errorf("list %s table: %w", fam, err)
		}
		out.WriteString(ResolveSlots(nft.Canonical(listing)))
	}
	return out.String(), nil
}

// FirstDifferences lists up to most lines of a that are not in b and of b
// that are not in a, and how many differ in all.
func FirstDifferences(a, b string, most int) string {
	count := func(s string) map[string]int {
		m := map[string]int{}
		for _, l := range strings.Split(s, "\n") {
			m[l]++
		}
		return m
	}
	ca, cb := count(a), count(b)
	var out []string
	for l, n := range ca {
		if cb[l] < n {
			out = append(out, "- "+l)
		}
	}
	for l, n := range cb {
		if ca[l] < n {
			out = append(out, "+ "+l)
		}
	}
	sort.Strings(out)
	return strings.Join(out[:min(len(out), most)], "\n") + fmt.Sprintf("\n(%d lines differ)", len(out))
}

var (
	endpointsMapHeader = regexp.MustCompile(`^\tmap (endpoints-[a-z]+-\d+) \{$`)
	endpointsElement   = regexp.MustCompile(`(\d+)-(\d+) : (\S+ \. \d+)`)
	dnatFromSlot       = regexp.MustCompile(`numgen random mod 65536 (?:offset (\d+) )?map @(endpoints-[a-z]+-\d+)`)
	pickMapHeader      = regexp.MustCompile(`^\tmap endpoints-([a-z]+)-n\d+-\d+ \{$`)
	pickChainHeader    = regexp.MustCompile(`^\tchain pick-[a-z]+-\d+-\d+ \{$`)
	pickElement        = regexp.MustCompile(`(\S+) \. (\d+) \. (\d+) : (\S+ \. \d+)`)
	gotoPick           = regexp.MustCompile(`(\S+) \. ([a-z]+) \. (\d+)((?: comment "[^"]*")?) : goto pick-[a-z]+-\d+-\d+`)
)

// ResolveSlots rewrites a canonical listing so that it says which endpoints
// each chain's DNAT rule picks from, not where in the shared endpoints maps
// they are: every `numgen random mod 65536 [offset N] map @M` becomes the
// bucket ranges of its slot (N/65536) in map M, relative to the slot, and
// the endpoints maps themselves are left out. A proxy that read its table
// back keeps the slots it found, a fresh one assigns its own: resolved,
// their tables compare equal. So do tables with more or fewer endpoints
// maps: a proxy keeps the maps its most slots needed (emptied slots are
// reused), a fresh one makes those its Services need now.
//
// Likewise, a ClusterIP port's element of service-ips that goes to the
// chain of a pick map becomes the endpoints it has there
// (`: pick tcp{0:10.244.1.11 . 8080, …}`), and the pick maps and their
// chains are left out: which of the maps of its number of endpoints a
// port is in depends on the order the proxy met the Services.
func ResolveSlots(listing string) string {
	return resolvePicks(resolveEndpointSlots(listing))
}

func resolveEndpointSlots(listing string) string {
	slots := map[string][]string{} // "map/slot" → "lo-hi:endpoint"
	var kept []string
	inMap := ""
	for _, line := range strings.Split(listing, "\n") {
		if m := endpointsMapHeader.FindStringSubmatch(line); m != nil {
			inMap = m[1]
			if n := len(kept); n > 0 && kept[n-1] == "" {
				kept = kept[:n-1] // the blank line between the map and what precedes it
			}
			continue
		}
		if inMap != "" {
			for _, e := range endpointsElement.FindAllStringSubmatch(line, -1) {
				lo, _ := strconv.Atoi(e[1])
				hi, _ := strconv.Atoi(e[2])
				key := fmt.Sprintf("%s/%d", inMap, lo/nft.EndpointBuckets)
				base := lo / nft.EndpointBuckets * nft.EndpointBuckets
				slots[key] = append(slots[key], fmt.Sprintf("%d-%d:%s", lo-base, hi-base, e[3]))
			}
			if line == "\t}" {
				inMap = ""
			}
			continue
		}
		kept = append(kept, line)
	}
	return dnatFromSlot.ReplaceAllStringFunc(strings.Join(kept, "\n"), func(s string) string {
		m := dnatFromSlot.FindStringSubmatch(s)
		offset, _ := strconv.Atoi(m[1])
		key := fmt.Sprintf("%s/%d", m[2], offset/nft.EndpointBuckets)
		ranges := append([]string(nil), slots[key]...)
		sort.Strings(ranges)
		proto := strings.Split(m[2], "-")[1]
		return fmt.Sprintf("numgen random mod 65536 map %s{%s}", proto, strings.Join(ranges, ", "))
	})
}

// resolvePicks: see ResolveSlots.
func resolvePicks(listing string) string {
	picks := map[string][]string{} // "proto addr . port" → "i:endpoint"
	var kept []string
	inMap, inChain := "", false
	for _, line := range strings.Split(listing, "\n") {
		switch {
		case inChain:
			inChain = line != "\t}"
			continue
		case inMap != "":
			for _, e := range pickElement.FindAllStringSubmatch(line, -1) {
				key := inMap + " " + e[1] + " . " + e[2]
				picks[key] = append(picks[key], e[3]+":"+e[4])
			}
			if line == "\t}" {
				inMap = ""
			}
			continue
		}
		if m := pickMapHeader.FindStringSubmatch(line); m != nil {
			inMap = m[1]
		} else if pickChainHeader.MatchString(line) {
			inChain = true
		} else {
			kept = append(kept, line)
			continue
		}
		if n := len(kept); n > 0 && kept[n-1] == "" {
			kept = kept[:n-1] // the blank line between the block and what precedes it
		}
	}
	return gotoPick.ReplaceAllStringFunc(strings.Join(kept, "\n"), func(s string) string {
		m := gotoPick.FindStringSubmatch(s)
		eps := append([]string(nil), picks[m[2]+" "+m[1]+" . "+m[3]]...)
		sort.Strings(eps)
		return fmt.Sprintf("%s . %s . %s%s : pick %s{%s}", m[1], m[2], m[3], m[4], m[2], strings.Join(eps, ", "))
	})
}
