package firewall

import (
	"errors"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the guard's Prometheus metrics. Counters of nftables rules
// and the table's rule count are read from the kernel at scrape time.
type metrics struct {
	g          *Guard
	repairs    *prometheus.CounterVec
	brRepairs  *prometheus.CounterVec
	apply      prometheus.Histogram
	lastVerify prometheus.Gauge

	rulesExpected *prometheus.Desc
	rulesPresent  *prometheus.Desc
	mgmtCount     *prometheus.Desc
	mgmtIface     *prometheus.Desc
	dropPackets   *prometheus.Desc
	dropBytes     *prometheus.Desc
	scrapeErr     *prometheus.Desc
	unmapped      *prometheus.Desc
}

func newMetrics(g *Guard) *metrics {
	return &metrics{
		g: g,
		repairs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pve_inspect_guard_repairs_total",
			Help: "Repairs of table inet pve-inspect, by reason (drift kind).",
		}, []string{"reason"}),
		brRepairs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "pve_inspect_guard_bridge_repairs_total",
			Help: "Repairs of the layer-2 table bridge pve-inspect, by reason (drift kind).",
		}, []string{"reason"}),
		apply: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "pve_inspect_guard_apply_duration_seconds",
			Help:    "Time to apply one batch to table inet pve-inspect.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 4, 9),
		}),
		lastVerify: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "pve_inspect_guard_last_verify_success_timestamp_seconds",
			Help: "Unix time of the last verify that found the table as desired.",
		}),
		rulesExpected: prometheus.NewDesc("pve_inspect_guard_rules_expected",
			"Rules the desired table inet pve-inspect has.", nil, nil),
		rulesPresent: prometheus.NewDesc("pve_inspect_guard_rules_present",
			"Rules of the desired table found unchanged in the kernel at scrape time.", nil, nil),
		mgmtCount: prometheus.NewDesc("pve_inspect_guard_management_interfaces",
			"Interfaces carrying a default route (the @mgmt set).", nil, nil),
		mgmtIface: prometheus.NewDesc("pve_inspect_guard_management_interface",
			"1 for each interface in the @mgmt set.", []string{"interface"}, nil),
		dropPackets: prometheus.NewDesc("pve_inspect_guard_rule_drop_packets_total",
			"Packets dropped by each drop rule of the guard, from its nftables counter.", []string{"chain", "rule"}, nil),
		dropBytes: prometheus.NewDesc("pve_inspect_guard_rule_drop_bytes_total",
			"Bytes dropped by each drop rule of the guard, from its nftables counter.", []string{"chain", "rule"}, nil),
		scrapeErr: prometheus.NewDesc("pve_inspect_guard_scrape_error",
			"1 when reading the table at scrape time failed.", nil, nil),
		unmapped: prometheus.NewDesc("pve_inspect_guard_bridge_unmapped_ports",
			"Guest ports of zone bridges without a MAC/IPv4 mapping (DHCP-only until mapped).", nil, nil),
	}
}

func (m *metrics) repair(k DriftKind) { m.repairs.WithLabelValues(string(k)).Inc() }

// repairer counts repairs of the table rs describes.
func (m *metrics) repairer(rs *Ruleset) func(DriftKind) {
	if rs.family() == nftables.TableFamilyBridge {
		return func(k DriftKind) { m.brRepairs.WithLabelValues(string(k)).Inc() }
	}
	return m.repair
}
func (m *metrics) observeApply(d time.Duration) { m.apply.Observe(d.Seconds()) }
func (m *metrics) verified(t time.Time)         { m.lastVerify.Set(float64(t.UnixNano()) / 1e9) }
func (m *metrics) setManagement(_ []string)     {}

// Describe implements prometheus.Collector.
func (m *metrics) Describe(ch chan<- *prometheus.Desc) {
	m.repairs.Describe(ch)
	m.brRepairs.Describe(ch)
	m.apply.Describe(ch)
	m.lastVerify.Describe(ch)
	for _, d := range []*prometheus.Desc{m.rulesExpected, m.rulesPresent, m.mgmtCount, m.mgmtIface, m.dropPackets, m.dropBytes, m.scrapeErr, m.unmapped} {
		ch <- d
	}
}

// Collect implements prometheus.Collector; it reads the kernel's table on a
// connection of its own, so a scrape never waits for an apply.
func (m *metrics) Collect(ch chan<- prometheus.Metric) {
	m.repairs.Collect(ch)
	m.brRepairs.Collect(ch)
	m.apply.Collect(ch)
	m.lastVerify.Collect(ch)
	desired, br := m.g.shapes()
	mgmt := m.g.Management()
	ch <- prometheus.MustNewConstMetric(m.mgmtCount, prometheus.GaugeValue, float64(len(mgmt)))
	for _, n := range mgmt {
		ch <- prometheus.MustNewConstMetric(m.mgmtIface, prometheus.GaugeValue, 1, n)
	}
	if desired == nil {
		return
	}
	ch <- prometheus.MustNewConstMetric(m.rulesExpected, prometheus.GaugeValue, float64(desired.RuleCount()))
	m.g.metricsMu.Lock()
	counters, present, err := readCounters(m.g.mrd, desired)
	if br != nil && err == nil {
		var bc []RuleCounter
		bc, _, err = readCounters(m.g.mrd, br)
		counters = append(counters, bc...)
	}
	m.g.metricsMu.Unlock()
	if br != nil {
		ch <- prometheus.MustNewConstMetric(m.unmapped, prometheus.GaugeValue, float64(len(m.g.UnmappedPorts())))
	}
	failed := 0.0
	if err != nil {
		failed = 1
	}
	ch <- prometheus.MustNewConstMetric(m.scrapeErr, prometheus.GaugeValue, failed)
	if err != nil {
		return
	}
	ch <- prometheus.MustNewConstMetric(m.rulesPresent, prometheus.GaugeValue, float64(present))
	for _, c := range counters {
		if !c.Drop {
			continue
		}
		ch <- prometheus.MustNewConstMetric(m.dropPackets, prometheus.CounterValue, float64(c.Packets), c.Chain, c.Rule)
		ch <- prometheus.MustNewConstMetric(m.dropBytes, prometheus.CounterValue, float64(c.Bytes), c.Chain, c.Rule)
	}
}

// Collector returns the guard's Prometheus collector.
func (g *Guard) Collector() prometheus.Collector { return g.met }

// RuleCounter is the kernel counter of one rule of the table.
type RuleCounter struct {
	Chain   string
	Rule    string // the rule's comment
	Drop    bool   // the rule's verdict is drop (or a jump to egress_drop)
	Packets uint64
	Bytes   uint64
}

// readCounters reads every rule's counter from the kernel, and how many of
// the desired rules are present unchanged.
func readCounters(rd *tableReader, desired *Ruleset) ([]RuleCounter, int, error) {
	if rd == nil {
		return nil, 0, errors.New("read counters: guard closed")
	}
	// counters are in the rules: no set's members are read
	k, err := readKernelTableWith(rd, desired.family(), func(string) bool { return false })
	if err != nil {
		return nil, 0, err
	}
	return countersOf(k, desired)
}

func countersOf(k *kernelTable, desired *Ruleset) ([]RuleCounter, int, error) {
	var out []RuleCounter
	present := 0
	for _, c := range desired.Chains {
		got := k.rules[c.Name]
		want := map[string]*RuleSpec{}
		for _, r := range c.Rules {
			want[r.Comment] = r
		}
		for _, r := range got {
			rc := RuleCounter{Chain: c.Name, Rule: ruleComment(r)}
			for _, e := range r.Exprs {
				switch v := e.(type) {
				case *expr.Counter:
					rc.Packets, rc.Bytes = v.Packets, v.Bytes
				case *expr.Verdict:
					// a jump to egress_drop drops: the packets are
					// counted on the jumping rule (egress-none, -deny,
					// -allowlist), not again on egress_drop's own drop
					rc.Drop = (v.Kind == expr.VerdictDrop && c.Name != chainEgressDrop) ||
						(v.Kind == expr.VerdictJump && v.Chain == chainEgressDrop)
				}
			}
			out = append(out, rc)
			if w, ok := want[rc.Rule]; ok && len(diffRules(desired.family(), &ChainSpec{Name: c.Name, Rules: []*RuleSpec{w}}, []*nftables.Rule{r}, k.unknownExprs, desired.norm)) == 0 {
				present++
			}
		}
	}
	return out, present, nil
}
