package lockdown

import (
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the lockdown controller's Prometheus metrics (prefix
// pve_inspect_lockdown_). Halts are counted by package lockdown/halt.
// A nil *Metrics records nothing.
type Metrics struct {
	enabled    prometheus.Gauge
	enforced   prometheus.Gauge
	failClosed prometheus.Gauge
	blanked    prometheus.Gauge
	lastAssert prometheus.Gauge
	latency    prometheus.Histogram
	reconciles *prometheus.CounterVec
	blanks     prometheus.Counter
	reloads    prometheus.Counter
}

// LatencyBuckets are the marker-to-enforced histogram's buckets, in seconds:
// from a millisecond up to the reference design's 75 s worst case.
var LatencyBuckets = []float64{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 75, 120}

// NewMetrics creates the metrics and registers them with reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	const ns, sub = "pve_inspect", "lockdown"
	m := &Metrics{
		enabled: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "enabled",
			Help: "1 when the lockdown marker file is present (or cannot be checked)."}),
		enforced: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "enforced",
			Help: "1 when the lockdown is proven in force: rules committed and verified, resolver blanked, dnsmasq reloaded."}),
		failClosed: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "fail_closed",
			Help: "1 when the blanket forward drop is on (lockdown asked for, no default route)."}),
		blanked: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "resolver_blanked",
			Help: "1 when the SDN resolver file holds only the lockdown comment line."}),
		lastAssert: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "last_assert_timestamp_seconds",
			Help: "Unix time of the last reconcile that brought the node to the state the marker asks for."}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: ns, Subsystem: sub, Name: "marker_to_enforced_seconds",
			Help:    "Time from the file system event that showed the marker to the lockdown proven in force.",
			Buckets: LatencyBuckets}),
		reconciles: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "reconciles_total",
			Help: "Reconciles by result (converged or failed)."}, []string{"result"}),
		blanks: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "resolver_blanks_total",
			Help: "Times the resolver file was (re)written to the lockdown comment line; more than one per lockdown means something rewrote it."}),
		reloads: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "dnsmasq_signals_total",
			Help: "SIGHUPs sent to SDN dnsmasq processes."}),
	}
	for _, c := range []prometheus.Collector{m.enabled, m.enforced, m.failClosed, m.blanked, m.lastAssert, m.latency, m.reconciles, m.blanks, m.reloads} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register lockdown metrics: %w", err)
		}
	}
	m.reconciles.WithLabelValues("converged")
	m.reconciles.WithLabelValues("failed")
	return m, nil
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// observe records a published state and, when non-zero, a latency.
func (m *Metrics) observe(s State, latency time.Duration) {
	if m == nil {
		return
	}
	m.enabled.Set(b2f(s.Marker))
	m.enforced.Set(b2f(s.Enforced))
	m.failClosed.Set(b2f(s.FailClosed))
	m.blanked.Set(b2f(s.ResolverBlanked))
	if !s.LastAssert.IsZero() {
		m.lastAssert.Set(float64(s.LastAssert.UnixNano()) / 1e9)
	}
	if latency > 0 {
		m.latency.Observe(latency.Seconds())
	}
	if s.Converged {
		m.reconciles.WithLabelValues("converged").Inc()
	} else {
		m.reconciles.WithLabelValues("failed").Inc()
	}
}

func (m *Metrics) resolverBlanked() {
	if m != nil {
		m.blanks.Inc()
	}
}

func (m *Metrics) reloaded(n int) {
	if m != nil {
		m.reloads.Add(float64(n))
	}
}
