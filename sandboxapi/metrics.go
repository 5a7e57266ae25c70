package sandboxapi

import (
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the HTTP layer's Prometheus metrics (prefix pve_inspect_);
// the engine's (sandboxes, VMs, reaper, guard) live in package sandbox.
type metrics struct {
	requests    *prometheus.CounterVec
	latency     *prometheus.HistogramVec
	guestErrors *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
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
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.requests, m.latency, m.guestErrors} {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return m, nil
}
