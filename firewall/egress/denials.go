package egress

import (
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Reasons a name or connection is refused (the reason label of
// pve_inspect_egress_denied_total).
const (
	ReasonName    = "name"    // DNS query for a name the policy does not allow
	ReasonMode    = "mode"    // DNS query from a zone in mode none
	ReasonSNI     = "sni"     // TLS server name not allowed
	ReasonHost    = "host"    // HTTP Host not allowed
	ReasonPeek    = "peek"    // first bytes were neither TLS nor HTTP with a name
	ReasonAddress = "address" // a packet the kernel dropped: a denied CIDR, an address no name gave, anything from a none zone
	ReasonQuota   = "quota"   // past a per-sandbox quota: DNS queries or connections at once, learned addresses
)

// Denial is one refused name or connection.
type Denial struct {
	Time   time.Time `json:"time"`
	Reason string    `json:"reason"`
	// Name is the refused name (DNS, SNI or Host), if any.
	Name string `json:"name,omitempty"`
	// Dest is the destination of a refused connection: address:port, or
	// the address alone for a packet the kernel dropped.
	Dest string `json:"dest,omitempty"`
}

// keepDenials is how many recent denials are kept per owner.
const keepDenials = 32

// Denials counts refused names and connections per owner (a sandbox, or
// "zone:<id>" for a zone the daemon did not create) and keeps the last
// ones readable; it also counts the quota refusals per owner, resource and
// limit. What it holds of an owner (recent denials, counter series) is
// dropped with the owner's instance (Forget): a sandbox deleted, a pool
// member claimed.
type Denials struct {
	total   *prometheus.CounterVec
	refused *prometheus.CounterVec
	now     func() time.Time

	mu     sync.Mutex // guards recent
	recent map[string][]Denial
}

// NewDenials returns a recorder; Collector exports its counter.
func NewDenials() *Denials {
	return &Denials{
		total: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "pve_inspect", Subsystem: "egress", Name: "denied_total",
			Help: "Names and connections refused by the egress policy, by sandbox (zone:<id> for zones the daemon did not create) and reason.",
		}, []string{"sandbox", "reason"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "pve_inspect", Subsystem: "egress", Name: "quota_refused_total",
			Help: "Queries, connections and learned-set elements refused past a quota, by owner (sandbox, or zone:<id> for zones the daemon did not create), resource and limit (owner: its own share; node: the node total).",
		}, []string{"owner", "resource", "limit"}),
		now:    time.Now,
		recent: map[string][]Denial{},
	}
}

// Collector is the prometheus collector of the denial and quota refusal
// counters.
func (d *Denials) Collector() prometheus.Collector { return collectors{d.total, d.refused} }

// collectors is several collectors as one.
type collectors []prometheus.Collector

func (cs collectors) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range cs {
		c.Describe(ch)
	}
}

func (cs collectors) Collect(ch chan<- prometheus.Metric) {
	for _, c := range cs {
		c.Collect(ch)
	}
}

// Refuse counts one quota refusal of owner's resource by limit
// (LimitOwner or LimitNode), and records it as a denial with reason
// ReasonQuota (den's reason is set).
func (d *Denials) Refuse(owner, resource, limit string, den Denial) {
	d.refused.WithLabelValues(owner, resource, limit).Inc()
	den.Reason = ReasonQuota
	d.Record(owner, den)
}

// Record counts one denial for owner and keeps it among the recent ones.
func (d *Denials) Record(owner string, den Denial) {
	d.Add(owner, den.Reason, 1)
	d.Remember(owner, den)
}

// Add counts n denials for owner with reason, keeping none of them among
// the recent ones (the kernel's drops: counted exactly, their
// destinations remembered separately).
func (d *Denials) Add(owner, reason string, n uint64) {
	if n > 0 {
		d.total.WithLabelValues(owner, reason).Add(float64(n))
	}
}

// Remember keeps den among owner's recent denials without counting it.
func (d *Denials) Remember(owner string, den Denial) {
	den.Time = d.now().UTC()
	d.mu.Lock()
	defer d.mu.Unlock()
	r := append(d.recent[owner], den)
	if len(r) > keepDenials {
		r = slices.Clone(r[len(r)-keepDenials:])
	}
	d.recent[owner] = r
}

// Recent returns owner's last denials, oldest first.
func (d *Denials) Recent(owner string) []Denial {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.recent[owner])
}

// Forget drops everything kept of owner: its recent denials and its
// series of both counters (its sandbox is gone, or a new instance of it
// begins: a pool member claimed). A scrape no longer shows the owner;
// rate() over the deleted series ends with it.
func (d *Denials) Forget(owner string) {
	d.total.DeletePartialMatch(prometheus.Labels{"sandbox": owner})
	d.refused.DeletePartialMatch(prometheus.Labels{"owner": owner})
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.recent, owner)
}
