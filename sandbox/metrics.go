package sandbox

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// metrics are the engine's Prometheus metrics (prefix pve_inspect_); the
// HTTP layer's request metrics live in sandboxapi.
type metrics struct {
	sandboxes     *prometheus.GaugeVec
	vms           *prometheus.GaugeVec
	reaped        prometheus.Counter
	guardRefusals *prometheus.CounterVec
	sdnApplies    prometheus.Counter
	sdnReapplies  prometheus.Counter
	sdnApplyTime  prometheus.Histogram
	sdnShared     prometheus.Counter
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		sandboxes: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "pve_inspect", Name: "sandboxes",
			Help: "Sandboxes known to the daemon, by state.",
		}, []string{"state"}),
		vms: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "pve_inspect", Name: "sandbox_vms",
			Help: "Sandbox VMs known to the daemon, by their sandbox's state.",
		}, []string{"state"}),
		reaped: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "pve_inspect", Name: "reaper_deletions_total",
			Help: "Sandboxes deleted by the TTL reaper.",
		}),
		guardRefusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "pve_inspect", Name: "guard_refusals_total",
			Help: "Sandbox creates refused by the resource guard, by cap.",
		}, []string{"cap"}),
		sdnApplies: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "pve_inspect", Name: "sdn_applies_total",
			Help: "SDN applies (PUT /cluster/sdn) the engine made; concurrent creates, deletes and pool refills share one.",
		}),
		sdnReapplies: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "pve_inspect", Name: "sdn_reapplies_total",
			Help: "SDN applies made again because an apply that ended OK left a vnet bridge of this node missing (its reload lost to another's).",
		}),
		sdnApplyTime: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: "pve_inspect", Name: "sdn_apply_seconds",
			Help:    "How long the engine's SDN applies took, until the apply task ended; it grows with every DHCP zone of the cluster on every node.",
			Buckets: []float64{0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1200, 1800},
		}),
		sdnShared: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "pve_inspect", Name: "sdn_shared_applies_total",
			Help: "SDN applies the engine left out because another client's apply (another node's daemon) had already committed all of its edits.",
		}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.sandboxes, m.vms, m.reaped, m.guardRefusals, m.sdnApplies, m.sdnReapplies, m.sdnApplyTime, m.sdnShared} {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	for _, s := range []string{apitype.StateCreating, apitype.StateReady, apitype.StateDeleting, apitype.StateError} {
		m.sandboxes.WithLabelValues(s)
		m.vms.WithLabelValues(s)
	}
	return m, nil
}
