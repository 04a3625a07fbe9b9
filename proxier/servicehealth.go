package proxier

// The health check ports of Services with externalTrafficPolicy: Local,
// gathered per family as a sync goes through the Services.

import (
	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/proxier/model"
	"github.com/nftproxy/nftproxy/proxier/servicehealth"
)

// ServiceHealthServer serves the health check node ports of Services
// (proxier/servicehealth.Server).
type ServiceHealthServer interface {
	SyncServices(map[servicehealth.ServiceName]uint16) error
	SyncEndpoints(map[servicehealth.ServiceName]int) error
}

// syncHealthCheck records the health check port and local endpoint count
// of a Service with externalTrafficPolicy: Local.
func (p *Proxier) syncHealthCheck(fs *familyState, name model.ServiceName, svc *model.Service, ports []model.ServicePortState) {
	hc := servicehealth.ServiceName(name)
	if svc == nil || svc.HealthCheckNodePort == 0 || !svc.ExternalLocal || len(ports) == 0 {
		delete(fs.healthPorts, hc)
		delete(fs.healthLocal, hc)
		return
	}
	local := 0
	for _, sp := range ports {
		local = max(local, sp.LocalReady)
	}
	fs.healthPorts[hc], fs.healthLocal[hc] = svc.HealthCheckNodePort, local
}

// syncHealthChecks hands the health check ports to the family's server.
// Ports that cannot be bound are logged by the server and retried on the
// next sync; they do not fail the sync.
func (p *Proxier) syncHealthChecks(f nft.Family, fs *familyState) {
	hc := p.deps.ServiceHealth[f]
	if hc == nil {
		return
	}
	_ = hc.SyncServices(fs.healthPorts)
	_ = hc.SyncEndpoints(fs.healthLocal)
}
