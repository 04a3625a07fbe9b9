// Package benchapi is the API state of e2e/cmd/bench as the API server
// returns it, for the benchmarks of the watch layer and the proxier: the
// objects benchstate describes as the watch layer converts them.
package benchapi

import (
	"fmt"
	"time"

	v1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/nftproxy/nftproxy/proxier/model/benchstate"
)

// Objects are the Service and EndpointSlice of Service i: defaulted spec,
// uid, resourceVersion, creation time and their kind (which the protobuf
// encoder writes); no managedFields.
func Objects(sz benchstate.Size, i int) (*v1.Service, *discovery.EndpointSlice) {
	name := fmt.Sprintf("svc-%d", i)
	meta := func(name string, labels map[string]string) metav1.ObjectMeta {
		return metav1.ObjectMeta{Namespace: "bench", Name: name, Labels: labels,
			UID:               types.UID(fmt.Sprintf("6f1c2a4e-0000-4000-8000-%012d", i)),
			ResourceVersion:   fmt.Sprint(100000 + i),
			CreationTimestamp: metav1.NewTime(time.Unix(1_800_000_000, 0))}
	}
	ip := benchstate.ClusterIP(i).String()
	single, cluster := v1.IPFamilyPolicySingleStack, v1.ServiceInternalTrafficPolicyCluster
	svc := &v1.Service{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Service"}, ObjectMeta: meta(name, nil),
		Spec: v1.ServiceSpec{Type: v1.ServiceTypeClusterIP, ClusterIP: ip, ClusterIPs: []string{ip},
			IPFamilies: []v1.IPFamily{v1.IPv4Protocol}, IPFamilyPolicy: &single, InternalTrafficPolicy: &cluster,
			SessionAffinity: v1.ServiceAffinityNone,
			Ports:           []v1.ServicePort{{Name: "http", Port: 80, Protocol: v1.ProtocolTCP}}}}
	pname, port, proto := "http", int32(8080), v1.ProtocolTCP
	es := &discovery.EndpointSlice{TypeMeta: metav1.TypeMeta{APIVersion: "discovery.k8s.io/v1", Kind: "EndpointSlice"},
		ObjectMeta:  meta(name+"-1", map[string]string{discovery.LabelServiceName: name}),
		AddressType: discovery.AddressTypeIPv4,
		Ports:       []discovery.EndpointPort{{Name: &pname, Port: &port, Protocol: &proto}}}
	for j := 0; j < sz.Endpoints; j++ {
		node := fmt.Sprintf("node-%d", (i*sz.Endpoints+j)%100)
		es.Endpoints = append(es.Endpoints, discovery.Endpoint{
			Addresses: []string{benchstate.Endpoint(sz, i, j, 0).String()}, NodeName: &node})
	}
	return svc, es
}
