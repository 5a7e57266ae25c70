package sdnzones

import (
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the watcher's Prometheus metrics (prefix pve_inspect_sdn_).
// A nil *Metrics records nothing.
type Metrics struct {
	valid    prometheus.Gauge
	version  prometheus.Gauge
	zones    prometheus.Gauge
	lastRead prometheus.Gauge
	errors   *prometheus.CounterVec
}

// errorReasons are the values of the errors counter's reason label.
var errorReasons = []string{"read", "missing", "parse", "apply"}

// NewMetrics creates the metrics and registers them with reg.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	const ns, sub = "pve_inspect", "sdn"
	m := &Metrics{
		valid: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "config_valid",
			Help: "1 when the last read of the SDN running config was usable; 0 means the last good zones are kept."}),
		version: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "config_version",
			Help: "Version counter of the last usable SDN running config (0: SDN never applied)."}),
		zones: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "zones",
			Help: "Zones from the SDN running config in force in the guard."}),
		lastRead: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub, Name: "config_last_success_timestamp_seconds",
			Help: "Unix time of the last usable read of the SDN running config."}),
		errors: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub, Name: "config_errors_total",
			Help: "Reads of the SDN running config that were not used, by reason (read, missing, parse, apply)."}, []string{"reason"}),
	}
	for _, c := range []prometheus.Collector{m.valid, m.version, m.zones, m.lastRead, m.errors} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("register sdn metrics: %w", err)
		}
	}
	for _, r := range errorReasons {
		m.errors.WithLabelValues(r)
	}
	return m, nil
}

func (m *Metrics) failed(reason string) {
	if m == nil {
		return
	}
	m.valid.Set(0)
	m.errors.WithLabelValues(reason).Inc()
}

func (m *Metrics) parsed(version int64) {
	if m == nil {
		return
	}
	m.version.Set(float64(version))
}

func (m *Metrics) inForce(zones int) {
	if m == nil {
		return
	}
	m.valid.Set(1)
	m.zones.Set(float64(zones))
	m.lastRead.Set(float64(time.Now().UnixNano()) / 1e9)
}
