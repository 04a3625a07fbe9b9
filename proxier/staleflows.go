package proxier

import (
	"github.com/nftproxy/nftproxy/nft"
	"github.com/nftproxy/nftproxy/proxier/staleflows"
)

// cleanConntrack hands the conntrack cleanup of a sync to the cleaner. It
// does nothing (not even a dump) when no UDP or SCTP port changed and no
// TCP frontend was added.
func (p *Proxier) cleanConntrack(f nft.Family, fs *familyState, job *staleflows.Job) {
	if p.cleaner == nil || job.Empty() {
		return
	}
	p.cleaner.Enqueue(f, job, staleflows.NodePortMatcher(fs.cfg.NodePorts.Addresses, fs.cfg.NodePorts.CIDRs))
}

// committing tells the cleaner, before a sync applies its transaction,
// the frontends its rules will have (job; nil when the transaction
// failed), so that a cleanup running meanwhile does not take the flows
// those rules make for stale (staleflows.Cleaner.Committing).
func (p *Proxier) committing(f nft.Family, job *staleflows.Job) {
	if p.cleaner != nil && (job == nil || !job.Empty()) {
		p.cleaner.Committing(f, job)
	}
}
