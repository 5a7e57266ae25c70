package sandboxapi

import (
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the sandbox API's Prometheus metrics (prefix pve_inspect_).
type metrics struct {
	sandboxes     *prometheus.GaugeVec
	vms           *prometheus.GaugeVec
	requests      *prometheus.CounterVec
	latency       *prometheus.HistogramVec
	guestErrors   *prometheus.CounterVec
	reaped        prometheus.Counter
	guardRefusals *prometheus.CounterVec
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
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "pve_inspect", Name: "api_requests_total",
			Help: "Sandbox API requests by route pattern and HTTP status code.",
		}, []string{"route", "code"}),
		latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Namespace: "pve_inspect", Name: "api_request_duration_seconds",
			Help:    "Sandbox API request latency by route pattern.",
			Buckets: []float64{.001, .005, .01, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 120, 300},
		}, []string{"route"}),
		guestErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "pve_inspect", Name: "guest_agent_errors_total",
			Help: "Guest agent errors by kind (problem type).",
		}, []string{"kind"}),
		reaped: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "pve_inspect", Name: "reaper_deletions_total",
			Help: "Sandboxes deleted by the TTL reaper.",
		}),
		guardRefusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "pve_inspect", Name: "guard_refusals_total",
			Help: "Sandbox creates refused by the resource guard, by cap.",
		}, []string{"cap"}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.sandboxes, m.vms, m.requests, m.latency, m.guestErrors, m.reaped, m.guardRefusals} {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	for _, s := range []string{StateCreating, StateReady, StateDeleting, StateError} {
		m.sandboxes.WithLabelValues(s)
		m.vms.WithLabelValues(s)
	}
	return m, nil
}
