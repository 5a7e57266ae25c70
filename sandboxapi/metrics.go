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
	// quotaRefusals counts refusals of a quota by owner (countRefusal).
	quotaRefusals *prometheus.CounterVec
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
		quotaRefusals: newQuotaRefusals(),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.requests, m.latency, m.guestErrors, m.quotaRefusals} {
			if err := reg.Register(c); err != nil {
				return nil, err
			}
		}
	}
	return m, nil
}

// newQuotaRefusals is pve_inspect_api_quota_refusals_total{owner,quota}:
// the requests refused by a quota (429 too-many-requests past a share,
// 503 past a node total, whose quota is named node-*), by the owner
// ("-" for sandboxes and tokens bound to no owner) and the quota.
func newQuotaRefusals() *prometheus.CounterVec {
	return prometheus.NewCounterVec(prometheus.CounterOpts{
		Namespace: "pve_inspect", Name: "api_quota_refusals_total",
		Help: "Sandbox API requests refused by a quota (429 past an owner's or token's share, 503 past the node total: quota node-*), by owner and quota.",
	}, []string{"owner", "quota"})
}

// countRefusal counts one refusal of quota for owner ("" counts as "-",
// the owner of the sandboxes created without one).
func (m *metrics) countRefusal(owner, quota string) {
	m.quotaRefusals.WithLabelValues(ownerLabel(owner), quota).Inc()
}

// ownerLabel is owner as a label and a quota key: "" is "-".
func ownerLabel(owner string) string {
	if owner == "" {
		return "-"
	}
	return owner
}
