package fuzzstate

// The seeds are written field by field in Decode's order: one byte per
// field, a pool's value chosen by its index.

// svcSeed is a Service: indexes into namespaces, names, the ClusterIP
// blocks; fams 0 IPv4, 1 IPv6, 2 both; ports (name, proto, port, node
// port) or, with many, ManyPorts; flags 1 externalTrafficPolicy Local, 2
// internalTrafficPolicy Local, 4 a health check port; an affinity
// timeout; external and load balancer IPs (family, number); ranges.
type svcSeed struct {
	ns, name, v4, v6, fams byte
	ports                  [][4]byte
	many                   bool
	flags, affinity        byte
	external, lb           [][2]byte
	ranges                 []byte
}

func (s svcSeed) bytes() []byte {
	b := []byte{s.ns, s.name, s.v4, s.v6, s.fams, byte(len(s.ports))}
	if s.many {
		b[len(b)-1] = 4
	}
	for _, p := range s.ports {
		b = append(b, p[:]...)
	}
	b = append(b, s.flags, s.affinity, byte(len(s.external)))
	for _, a := range s.external {
		b = append(b, a[:]...)
	}
	b = append(b, byte(len(s.lb)))
	for _, a := range s.lb {
		b = append(b, a[:]...)
	}
	return append(append(b, byte(len(s.ranges))), s.ranges...)
}

// sliceSeed is an EndpointSlice: its family (0 IPv4, 1 IPv6), name, the
// index of its Service (gone: a missing Service of namespace gone);
// ports (name, proto, port), manyPorts for ManyPorts more, and endpoints
// (address, conditions: 1 ready, 2 serving, 4 terminating; node; hints: 1
// a zone, 2 a node, then the zone and node) or, with many, ManyEndpoints.
type sliceSeed struct {
	fam, name, svc byte
	gone           *byte
	ports          [][3]byte
	manyPorts      bool
	endpoints      [][]byte
	many           bool
}

func (s sliceSeed) bytes() []byte {
	b := []byte{s.fam, s.name, s.svc}
	if s.gone != nil {
		b = []byte{s.fam, s.name, 200, *s.gone}
	}
	b = append(b, byte(len(s.ports)))
	for _, p := range s.ports {
		b = append(b, p[:]...)
	}
	if s.manyPorts {
		b = append(b, 255)
	} else {
		b = append(b, 0)
	}
	if s.many {
		return append(b, 8)
	}
	b = append(b, byte(len(s.endpoints)))
	for _, e := range s.endpoints {
		b = append(b, e...)
	}
	return b
}

func seed(zone byte, svcs []svcSeed, slices []sliceSeed) []byte {
	b := []byte{zone, byte(len(svcs))}
	for _, s := range svcs {
		b = append(b, s.bytes()...)
	}
	b = append(b, byte(len(slices)))
	for _, s := range slices {
		b = append(b, s.bytes()...)
	}
	return b
}

// Seeds are inputs for Decode that reach the cases issue 15 lists: invalid
// input the watch layer cannot catch (the same endpoint in two slices, a
// slice without its Service and the reverse, Services sharing frontends),
// many ports and endpoints, names at their length limits, and every
// feature that shapes a Service's rules.
func Seeds() [][]byte {
	ready, readyHere := []byte{0, 3, 0, 0}, []byte{1, 3, 1, 0}
	gone := byte(1)
	return [][]byte{
		{},
		// default/web, dual-stack, http 80/TCP with a NodePort; two IPv4
		// slices listing endpoint 1 (once here, once on n2), an IPv6 one.
		seed(0, []svcSeed{{ns: 0, name: 0, v4: 1, v6: 1, fams: 2, ports: [][4]byte{{1, 0, 0, 1}}}},
			[]sliceSeed{
				{fam: 0, name: 0, svc: 0, ports: [][3]byte{{1, 0, 4}}, endpoints: [][]byte{readyHere, {2, 3, 2, 0}}},
				{fam: 0, name: 1, svc: 0, ports: [][3]byte{{1, 0, 4}}, endpoints: [][]byte{{1, 3, 2, 0}, {3, 6, 3, 0}}},
				{fam: 1, name: 2, svc: 0, ports: [][3]byte{{1, 0, 4}}, endpoints: [][]byte{ready}},
			}),
		// ManyPorts, and a slice with a port for each; a slice with
		// ManyEndpoints.
		seed(0, []svcSeed{{ns: 0, name: 1, v4: 2, fams: 0, many: true}, {ns: 0, name: 0, v6: 2, fams: 1, ports: [][4]byte{{1, 0, 0, 0}}}},
			[]sliceSeed{{fam: 0, svc: 0, manyPorts: true, endpoints: [][]byte{ready, readyHere}},
				{fam: 1, svc: 1, ports: [][3]byte{{1, 0, 4}}, many: true}}),
		// Names at their limits, local policies, affinity, external and
		// load balancer IPs with source ranges; endpoints local and
		// remote, terminating, with hints; a slice of a gone Service; a
		// Service without slices.
		seed(0, []svcSeed{
			{ns: 2, name: 2, v4: 3, v6: 3, fams: 2, ports: [][4]byte{{3, 0, 0, 1}, {2, 1, 1, 2}},
				flags: 7, affinity: 2, external: [][2]byte{{0, 1}, {1, 1}}, lb: [][2]byte{{0, 0}, {1, 0}}, ranges: []byte{0, 3}},
			{ns: 1, name: 1, v4: 4, fams: 0, ports: [][4]byte{{2, 1, 1, 0}}},
		}, []sliceSeed{
			{fam: 0, svc: 0, ports: [][3]byte{{3, 0, 4}, {2, 1, 1}},
				endpoints: [][]byte{readyHere, {2, 6, 1, 0}, {3, 3, 2, 3, 0, 0}, {4, 3, 3, 1, 1}}},
			{fam: 1, svc: 0, ports: [][3]byte{{3, 0, 4}}, endpoints: [][]byte{readyHere, {2, 3, 2, 0}}},
			{fam: 0, name: 3, gone: &gone, ports: [][3]byte{{1, 0, 4}}, endpoints: [][]byte{ready}},
		}),
		// Two Services sharing a ClusterIP, a port and a NodePort, and
		// an external IP that is the other's load balancer IP.
		seed(1, []svcSeed{
			{ns: 0, name: 0, v4: 5, fams: 0, ports: [][4]byte{{1, 0, 0, 1}}, external: [][2]byte{{0, 3}}},
			{ns: 1, name: 0, v4: 5, fams: 0, ports: [][4]byte{{2, 0, 0, 1}}, lb: [][2]byte{{0, 0}}},
		}, []sliceSeed{
			{fam: 0, svc: 0, ports: [][3]byte{{1, 0, 4}}, endpoints: [][]byte{ready}},
			{fam: 0, svc: 1, ports: [][3]byte{{2, 0, 4}}, endpoints: [][]byte{{5, 3, 2, 0}}},
		}),
	}
}
