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

// Denials counts refused names and connections per owner (sandbox) and
// keeps the last ones readable.
type Denials struct {
	total *prometheus.CounterVec
	now   func() time.Time

	mu     sync.Mutex // guards recent
	recent map[string][]Denial
}

// NewDenials returns a recorder; Collector exports its counter.
func NewDenials() *Denials {
	return &Denials{
		total: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "pve_inspect", Subsystem: "egress", Name: "denied_total",
			Help: "Names and connections refused by the egress policy, by sandbox (node-default for zones the daemon did not create) and reason.",
		}, []string{"sandbox", "reason"}),
		now:    time.Now,
		recent: map[string][]Denial{},
	}
}

// Collector is the prometheus collector of the denial counter.
func (d *Denials) Collector() prometheus.Collector { return d.total }

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

// Forget drops owner's recent denials (its sandbox is gone); the counter
// series stays until restart, as counters do.
func (d *Denials) Forget(owner string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.recent, owner)
}
