package deb

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"gopkg.in/yaml.v3"

	"github.com/pve-inspect/pve-inspect/firewall"
	"github.com/pve-inspect/pve-inspect/lockdown"
	"github.com/pve-inspect/pve-inspect/lockdown/halt"
	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitest"
)

// alertRules is the part of a Prometheus rule file the test reads.
type alertRules struct {
	Groups []struct {
		Name  string `yaml:"name"`
		Rules []struct {
			Alert       string            `yaml:"alert"`
			Expr        string            `yaml:"expr"`
			For         string            `yaml:"for"`
			Labels      map[string]string `yaml:"labels"`
			Annotations map[string]string `yaml:"annotations"`
		} `yaml:"rules"`
	} `yaml:"groups"`
}

// promOwn are series Prometheus itself makes for every target.
var promOwn = map[string][]string{"up": {"job", "instance"}}

var descRE = regexp.MustCompile(`fqName: "([^"]+)".*variableLabels: \{([^}]*)\}`)

// daemonMetrics returns every metric name the daemon's parts register,
// with their variable labels: the guard's collector, the halt's and the
// lockdown's metrics, registered as the daemon does (daemon.Run).
func daemonMetrics(t *testing.T) map[string][]string {
	t.Helper()
	g, err := firewall.New(firewall.Config{})
	if err != nil {
		t.Fatalf("guard: %v", err)
	}
	t.Cleanup(func() { _ = g.Close() })
	reg := prometheus.NewRegistry()
	if err := reg.Register(g.Collector()); err != nil {
		t.Fatal(err)
	}
	if _, err := halt.New(halt.Config{StateFile: filepath.Join(t.TempDir(), "halted")}, nil, reg); err != nil {
		t.Fatal(err)
	}
	if _, err := lockdown.NewMetrics(reg); err != nil {
		t.Fatal(err)
	}
	// The sandbox engine's metrics, its per-sandbox collector among them
	// (described below: it has no series without sandboxes).
	rec := &describing{Registerer: reg}
	if _, err := sandbox.New(sandbox.Options{Node: "n1", Proxmox: apitest.NewProxmox(nil, nil), Guests: apitest.NewGuests().Dial,
		StateDir: t.TempDir(), Registerer: rec}); err != nil {
		t.Fatal(err)
	}
	// Describe what was registered: the guard's collector and the halt's
	// vectors (which Gather would omit before their first observation).
	ch := make(chan *prometheus.Desc, 100)
	go func() {
		g.Collector().Describe(ch)
		for _, c := range rec.collectors {
			c.Describe(ch)
		}
		close(ch)
	}()
	out := map[string][]string{}
	add := func(d *prometheus.Desc) {
		m := descRE.FindStringSubmatch(d.String())
		if m == nil {
			t.Fatalf("cannot read %s", d)
		}
		var labels []string
		if m[2] != "" {
			labels = strings.Split(m[2], ",")
		}
		out[m[1]] = labels
	}
	for d := range ch {
		add(d)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if _, ok := out[mf.GetName()]; ok {
			continue
		}
		var labels []string
		for _, m := range mf.GetMetric() {
			for _, lp := range m.GetLabel() {
				if !slices.Contains(labels, lp.GetName()) {
					labels = append(labels, lp.GetName())
				}
			}
		}
		out[mf.GetName()] = labels
	}
	for _, want := range []string{"pve_inspect_halted", "pve_inspect_halt_failures_total", "pve_inspect_guard_repairs_total"} {
		if _, ok := out[want]; !ok {
			t.Fatalf("registry lacks %s: %v", want, out)
		}
	}
	return out
}

// describing is a Registerer that keeps what is registered, so its
// descriptions can be read.
type describing struct {
	prometheus.Registerer
	collectors []prometheus.Collector
}

func (d *describing) Register(c prometheus.Collector) error {
	d.collectors = append(d.collectors, c)
	return d.Registerer.Register(c)
}

// ruleNames returns the guard's rule names (the "rule" label of the drop
// counters) by chain, from the ruleset the guard renders.
func ruleNames(t *testing.T) map[string][]string {
	t.Helper()
	rs, err := firewall.Render(firewall.Config{}, firewall.Classification{}, firewall.Switches{})
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]string{}
	for _, c := range rs.Chains {
		for _, r := range c.Rules {
			out[c.Name] = append(out[c.Name], r.Comment)
		}
	}
	return out
}

var (
	metricRE  = regexp.MustCompile(`\b(pve_inspect_[a-z0-9_]+|up)\b(\{[^}]*\})?`)
	matcherRE = regexp.MustCompile(`([a-z_]+)\s*(=~|!~|!=|=)\s*"([^"]*)"`)
)

// TestAlertRules: the shipped rules parse, every rule is complete, every
// metric and label they use is one the daemon registers, and the guard rule
// names they match (the metadata drop rules) exist in the ruleset.
func TestAlertRules(t *testing.T) {
	b, err := os.ReadFile("alerts.yml")
	if err != nil {
		t.Fatal(err)
	}
	var f alertRules
	dec := yaml.NewDecoder(strings.NewReader(string(b)))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil {
		t.Fatalf("alerts.yml: %v", err)
	}
	metrics := daemonMetrics(t)
	for k, v := range promOwn {
		metrics[k] = v
	}
	rules := ruleNames(t)

	seen := map[string]bool{}
	n := 0
	for _, g := range f.Groups {
		for _, r := range g.Rules {
			n++
			if r.Alert == "" || r.Expr == "" || r.Labels["severity"] == "" || r.Annotations["summary"] == "" {
				t.Errorf("rule %q: needs alert, expr, labels.severity and annotations.summary", r.Alert)
			}
			if seen[r.Alert] {
				t.Errorf("rule %q defined twice", r.Alert)
			}
			seen[r.Alert] = true
			if r.For != "" {
				if _, err := time.ParseDuration(r.For); err != nil {
					t.Errorf("rule %q: for %q: %v", r.Alert, r.For, err)
				}
			}
			uses := metricRE.FindAllStringSubmatch(r.Expr, -1)
			if len(uses) == 0 {
				t.Errorf("rule %q uses no metric: %s", r.Alert, r.Expr)
			}
			for _, u := range uses {
				name := u[1]
				labels, ok := metrics[name]
				if !ok {
					t.Errorf("rule %q: metric %s is not registered by the daemon", r.Alert, name)
					continue
				}
				chain := ""
				for _, m := range matcherRE.FindAllStringSubmatch(u[2], -1) {
					if !slices.Contains(labels, m[1]) {
						t.Errorf("rule %q: %s has no label %q (has %q)", r.Alert, name, m[1], labels)
					}
					if m[1] == "chain" {
						chain = m[3]
						if _, ok := rules[chain]; !ok {
							t.Errorf("rule %q: no chain %q in the guard", r.Alert, chain)
						}
					}
				}
				for _, m := range matcherRE.FindAllStringSubmatch(u[2], -1) {
					if m[1] != "rule" {
						continue
					}
					for _, want := range strings.Split(m[3], "|") {
						if !slices.Contains(rules[chain], want) {
							t.Errorf("rule %q: no guard rule %q in chain %q (has %q)", r.Alert, want, chain, rules[chain])
						}
					}
				}
			}
		}
	}
	for _, want := range []string{"PveInspectHalted", "PveInspectGuardRulesMissing", "PveInspectGuardRepairs", "PveInspectGuardVerifyStale", "PveInspectGuardScrapeError", "PveInspectMetadataProbe", "PveInspectLockdownNotEnforced",
		"PveInspectSandboxBroken", "PveInspectSandboxBreaksAboveUsual"} {
		if !seen[want] {
			t.Errorf("alerts.yml lacks %s", want)
		}
	}
	t.Logf("%d alerting rules checked against %d registered metrics", n, len(metrics))
}
