package egress

import "sync"

// DefaultOwners is the number of owners (sandboxes and zones the daemon
// did not create) the node totals are sized for when a config leaves it
// out: every node total is Owners times the per-owner share, so that
// many owners at their share all fit.
const DefaultOwners = 64

// Resources of a quota (the resource label of
// pve_inspect_egress_quota_refused_total).
const (
	ResourceDNSUDP  = "dns_udp" // UDP queries in flight at the resolver
	ResourceDNSTCP  = "dns_tcp" // DNS-over-TCP connections at the resolver
	ResourceProxy   = "proxy"   // connections at the proxy
	ResourceLearned = "learned" // elements of the kernel's learned sets
)

// Limits of a quota refusal (the limit label of
// pve_inspect_egress_quota_refused_total).
const (
	LimitOwner = "owner" // the owner's own share
	LimitNode  = "node"  // the node total, more owners at their share than it is sized for
)

// quota bounds what one owner (a sandbox, or a zone the daemon did not
// create) holds at once of a shared resource (queries in flight,
// connections), and what all owners hold together. The owner's share is
// checked first: an owner at its share is refused without touching the
// node total, so it never holds any of the total past its share; the
// total is sized so that its owners all fit at their share.
type quota struct {
	perOwner, node int

	mu    sync.Mutex // guards held and total
	held  map[string]int
	total int
}

func newQuota(perOwner, node int) *quota {
	return &quota{perOwner: perOwner, node: node, held: map[string]int{}}
}

// take reserves one unit for owner. On refusal it returns the limit that
// refused (LimitOwner or LimitNode) and false.
func (q *quota) take(owner string) (limit string, ok bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.held[owner] >= q.perOwner {
		return LimitOwner, false
	}
	if q.total >= q.node {
		return LimitNode, false
	}
	q.held[owner]++
	q.total++
	return "", true
}

// give returns a unit take reserved.
func (q *quota) give(owner string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.held[owner]--; q.held[owner] <= 0 {
		delete(q.held, owner)
	}
	q.total--
}

// inUse returns the units held by owner and by all owners.
func (q *quota) inUse(owner string) (mine, total int) {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.held[owner], q.total
}
