package servicehealth

import (
	"net"
	"net/netip"
	"slices"

	"k8s.io/klog/v2"
)

// bindHosts returns the hosts each health check port is bound on: the local
// addresses inside prefixes (those of network's family), or [""] (every
// address) when there is no such prefix or one of them is zero-length.
//
// As upstream, when the local addresses cannot be listed it falls back to
// every address rather than serve no health check at all; when none
// matches, no listener is opened (and an error is logged here, once).
func bindHosts(network string, prefixes []netip.Prefix, interfaceAddrs func() ([]net.Addr, error)) []string {
	all := []string{""}
	var want []netip.Prefix
	for _, p := range prefixes {
		if !familyMatches(network, p.Addr()) {
			continue
		}
		if p.Bits() == 0 {
			return all
		}
		want = append(want, p.Masked())
	}
	if len(want) == 0 {
		return all
	}

	addrs, err := interfaceAddrs()
	if err != nil {
		klog.ErrorS(err, "Failed to list local addresses; health check ports will listen on all of them", "nodePortAddresses", want)
		return all
	}
	var hosts []string
	for _, a := range addrs {
		ip, ok := addrIP(a)
		if !ok || !familyMatches(network, ip) {
			continue
		}
		for _, p := range want {
			if p.Contains(ip) {
				hosts = append(hosts, ip.String())
				break
			}
		}
	}
	slices.Sort(hosts)
	hosts = slices.Compact(hosts)
	if len(hosts) == 0 {
		klog.ErrorS(nil, "No local address matches nodePortAddresses; health check ports will not be served", "nodePortAddresses", want)
	}
	return hosts
}

// familyMatches tells whether ip is of network's family ("tcp": both).
func familyMatches(network string, ip netip.Addr) bool {
	switch network {
	case "tcp4":
		return ip.Is4()
	case "tcp6":
		return ip.Is6()
	default:
		return true
	}
}

// addrIP is the IP of a net.InterfaceAddrs result (*net.IPNet on Linux,
// *net.IPAddr elsewhere), IPv4-mapped addresses unmapped.
func addrIP(a net.Addr) (netip.Addr, bool) {
	var ip net.IP
	switch v := a.(type) {
	case *net.IPNet:
		ip = v.IP
	case *net.IPAddr:
		ip = v.IP
	default:
		return netip.Addr{}, false
	}
	addr, ok := netip.AddrFromSlice(ip)
	return addr.Unmap(), ok
}
