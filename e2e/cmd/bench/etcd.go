package main

import (
	"fmt"
	"time"

	v1 "k8s.io/api/core/v1"

	"github.com/nftproxy/nftproxy/e2e/testbed"
)

// populateEtcd writes Services [from, to) (none of them stable or mover)
// straight into etcd (testbed.Bed.Store): creating them through the API
// would take hours at 100,000.
func (b *bench) populateEtcd(from, to int) {
	t0 := time.Now()
	svcs := make([]testbed.StoredService, 0, to-from)
	for i := from; i < to; i++ {
		svcs = append(svcs, testbed.StoredService{Name: svcName(i),
			Ports: []v1.ServicePort{{Name: "http", Port: 80, Protocol: v1.ProtocolTCP}},
			Slice: b.fakeSlice(i, 0)})
	}
	_, err := b.bed.Store(ns, svcs)
	must(b.tb, err)
	must(b.tb, b.bed.WaitRepaired(3*time.Minute))
	fmt.Printf("wrote Services, IPAddresses and EndpointSlices %d..%d (%d endpoints each) into etcd in %v\n",
		from, to-1, b.c.Endpoints, time.Since(t0).Round(100*time.Millisecond))
}
