package halt

import (
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
)

// Registerer is where the halt's metrics are registered
// (prometheus.Registerer).
type Registerer = prometheus.Registerer

// metrics are the halt's Prometheus metrics. This package owns them; other
// parts (the lockdown controller) must not register the same names.
type metrics struct {
	halted   *prometheus.GaugeVec
	halts    prometheus.Counter
	failures prometheus.Counter
}

func newMetrics(reg Registerer) (*metrics, error) {
	m := &metrics{
		halted: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Namespace: "pve_inspect",
			Name:      "halted",
			Help:      "1 while a fail-deadly halt is in force (label: its reason); one series with reason=\"\" and value 0 otherwise.",
		}, []string{"reason"}),
		halts: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "pve_inspect",
			Name:      "halts_total",
			Help:      "Fail-deadly halts begun (transitions into the halted state).",
		}),
		failures: prometheus.NewCounter(prometheus.CounterOpts{
			Namespace: "pve_inspect",
			Name:      "halt_failures_total",
			Help:      "Halt attempts that could not prove every unit stopped and masked.",
		}),
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.halted, m.halts, m.failures} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("halt metrics: %w", err)
			}
		}
	}
	return m, nil
}

// setHalted keeps exactly one series: the halt's reason with 1, or "" with 0.
func (m *metrics) setHalted(reason string) {
	m.halted.Reset()
	if reason == "" {
		m.halted.WithLabelValues("").Set(0)
		return
	}
	m.halted.WithLabelValues(reason).Set(1)
}
