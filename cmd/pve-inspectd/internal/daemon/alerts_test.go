package daemon

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"gopkg.in/yaml.v3"

	"github.com/pve-inspect/pve-inspect/cmd/pve-inspectd/internal/config"
	"github.com/pve-inspect/pve-inspect/firewall"
	"github.com/pve-inspect/pve-inspect/internal/testkit"
)

// alertsDir holds the shipped rules and their promtool unit tests.
const alertsDir = "../../../../packaging/deb"

// scrapeDaemon runs the daemon (guard in a namespace of its own, lockdown
// lifted) and returns one scrape of its metrics listener.
func scrapeDaemon(t *testing.T) map[string]*dto.MetricFamily {
	t.Helper()
	ns := testkit.NewNetNS(t, "pdn").Handle()
	cfg := config.Default()
	testParts(t, &cfg)
	cfg.Metrics.Listen = "127.0.0.1:0"
	ctx, cancel := context.WithCancel(context.Background())
	addr := make(chan net.Addr, 1)
	ready := make(chan struct{})
	d := &Daemon{Config: cfg, GuardOptions: []firewall.Option{firewall.WithNetNS(ns)},
		MetricsAddr: func(a net.Addr) { addr <- a }, Ready: func() { close(ready) }}
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("daemon: %v", err)
		}
	}()
	select {
	case <-ready:
	case err := <-done:
		done <- err // for the deferred stop, which waits on done
		t.Fatalf("daemon ended before ready: %v", err)
	}
	resp, err := http.Get("http://" + (<-addr).String() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parse scrape: %v", err)
	}
	return fams
}

// series returns the scraped series of name as promtool series strings
// with the target labels Prometheus adds and the given label overrides.
func series(t *testing.T, fams map[string]*dto.MetricFamily, name string, set map[string]string) (string, float64) {
	t.Helper()
	f, ok := fams[name]
	if !ok || len(f.GetMetric()) == 0 {
		t.Fatalf("the rules use %s, the daemon does not export it", name)
	}
	m := f.GetMetric()[0]
	labels := map[string]string{"job": "pve-inspectd", "instance": "pve1:9474"}
	for _, l := range m.GetLabel() {
		labels[l.GetName()] = l.GetValue()
	}
	for k, v := range set {
		if _, ok := labels[k]; !ok {
			t.Fatalf("%s has no label %s", name, k)
		}
		labels[k] = v
	}
	keys := make([]string, 0, len(labels))
	for k := range labels {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = fmt.Sprintf("%s=%q", k, labels[k])
	}
	var v float64
	switch {
	case m.GetGauge() != nil:
		v = m.GetGauge().GetValue()
	case m.GetCounter() != nil:
		v = m.GetCounter().GetValue()
	}
	return name + "{" + strings.Join(parts, ",") + "}", v
}

// rule is an alerting rule of alerts.yml.
type rule struct {
	Alert       string            `yaml:"alert"`
	Expr        string            `yaml:"expr"`
	Labels      map[string]string `yaml:"labels"`
	Annotations map[string]string `yaml:"annotations"`
}

// promtool's unit test file.
type (
	ptFile struct {
		RuleFiles          []string `yaml:"rule_files"`
		EvaluationInterval string   `yaml:"evaluation_interval"`
		Tests              []ptTest `yaml:"tests"`
	}
	ptTest struct {
		Name        string     `yaml:"name"`
		Interval    string     `yaml:"interval"`
		InputSeries []ptSeries `yaml:"input_series"`
		Alerts      []ptAlert  `yaml:"alert_rule_test"`
	}
	ptSeries struct {
		Series string `yaml:"series"`
		Values string `yaml:"values"`
	}
	ptAlert struct {
		EvalTime  string  `yaml:"eval_time"`
		Alertname string  `yaml:"alertname"`
		Exp       []ptExp `yaml:"exp_alerts"`
	}
	ptExp struct {
		Labels      map[string]string `yaml:"exp_labels"`
		Annotations map[string]string `yaml:"exp_annotations,omitempty"`
	}
)

var templateRE = regexp.MustCompile(`\{\{ *\$(labels\.(\w+)|value) *\}\}`)

// expand fills the annotation templates the shipped rules use.
func expand(s string, labels map[string]string, value string) string {
	return templateRE.ReplaceAllStringFunc(s, func(m string) string {
		sub := templateRE.FindStringSubmatch(m)
		if sub[1] == "value" {
			return value
		}
		return labels[sub[2]]
	})
}

// TestAlertRulesFromScrape writes the promtool unit tests of the shipped
// alert rules from a scrape of the real daemon: every series fed to
// promtool is one the daemon exported (name and labels), so a renamed
// metric breaks this test rather than the operators' paging. It proves the
// lockdown-not-enforced, fail-closed, halted and guard-drift alerts fire
// on those series, and that none fires on the healthy daemon's own values.
// The file is a golden file (-update rewrites it); promtool runs it here
// and in make lint.
func TestAlertRulesFromScrape(t *testing.T) {
	fams := scrapeDaemon(t)
	b, err := os.ReadFile(filepath.Join(alertsDir, "alerts.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var doc struct {
		Groups []struct {
			Rules []rule `yaml:"rules"`
		} `yaml:"groups"`
	}
	if err := yaml.Unmarshal(b, &doc); err != nil {
		t.Fatal(err)
	}
	rules := map[string]rule{}
	for _, g := range doc.Groups {
		for _, r := range g.Rules {
			rules[r.Alert] = r
		}
	}
	type in struct {
		metric string
		set    map[string]string
		values string
	}
	scenarios := []struct {
		alert string
		in    []in
		// labels the alert carries from the series (beyond the rule's)
		keep  []string
		value string
		eval  string // when it fires; one interval earlier it must not
	}{
		{"PveInspectLockdownNotEnforced", []in{{"pve_inspect_lockdown_enabled", nil, "1x10"}, {"pve_inspect_lockdown_enforced", nil, "0x10"}}, []string{"instance", "job"}, "1", "1m"},
		{"PveInspectFailClosed", []in{{"pve_inspect_lockdown_fail_closed", nil, "1x10"}}, []string{"instance", "job"}, "1", "1m"},
		{"PveInspectHalted", []in{{"pve_inspect_halted", map[string]string{"reason": "lockdown not enforceable"}, "1x10"}}, []string{"instance", "reason"}, "1", "0m"},
		{"PveInspectGuardRulesMissing", []in{{"pve_inspect_guard_rules_present", nil, "12x10"}, {"pve_inspect_guard_rules_expected", nil, "17x10"}}, []string{"instance", "job"}, "12", "2m"},
	}
	file := ptFile{RuleFiles: []string{"alerts.yml"}, EvaluationInterval: "1m"}
	healthy := ptTest{Name: "the healthy daemon's own values fire nothing", Interval: "1m"}
	for _, sc := range scenarios {
		r, ok := rules[sc.alert]
		if !ok {
			t.Fatalf("alerts.yml has no %s", sc.alert)
		}
		tc := ptTest{Name: sc.alert + " fires on the daemon's series", Interval: "1m"}
		labels := map[string]string{}
		for _, i := range sc.in {
			if !strings.Contains(r.Expr, i.metric) {
				t.Fatalf("%s: expr %q does not use %s", sc.alert, r.Expr, i.metric)
			}
			s, _ := series(t, fams, i.metric, i.set)
			tc.InputSeries = append(tc.InputSeries, ptSeries{Series: s, Values: i.values})
			h, v := series(t, fams, i.metric, nil)
			healthy.InputSeries = append(healthy.InputSeries, ptSeries{Series: h, Values: fmt.Sprintf("%gx10", v)})
			for _, l := range fams[i.metric].GetMetric()[0].GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			for k, v := range i.set {
				labels[k] = v
			}
		}
		labels["job"], labels["instance"] = "pve-inspectd", "pve1:9474"
		exp := ptExp{Labels: map[string]string{}, Annotations: map[string]string{}}
		for _, k := range sc.keep {
			exp.Labels[k] = labels[k]
		}
		for k, v := range r.Labels {
			exp.Labels[k] = v
		}
		for k, v := range r.Annotations {
			exp.Annotations[k] = expand(v, exp.Labels, sc.value)
		}
		if sc.eval != "0m" {
			d, _ := time.ParseDuration(sc.eval)
			tc.Alerts = append(tc.Alerts, ptAlert{EvalTime: model.Duration(d - time.Minute).String(), Alertname: sc.alert})
		}
		tc.Alerts = append(tc.Alerts, ptAlert{EvalTime: sc.eval, Alertname: sc.alert, Exp: []ptExp{exp}})
		file.Tests = append(file.Tests, tc)
		healthy.Alerts = append(healthy.Alerts, ptAlert{EvalTime: "5m", Alertname: sc.alert})
	}
	slices.SortFunc(healthy.InputSeries, func(a, b ptSeries) int { return strings.Compare(a.Series, b.Series) })
	file.Tests = append(file.Tests, healthy)

	promtoolGolden(t, "alerts_test.yml", "# promtool unit tests of alerts.yml (promtool test rules alerts_test.yml).\n"+
		"# Generated by TestAlertRulesFromScrape (cmd/pve-inspectd/internal/daemon) from a\n"+
		"# scrape of the real daemon; rewrite with go test -run TestAlertRulesFromScrape -update.\n", file)
}

// promtoolGolden writes file, after the header, as the golden promtool
// unit test file name in alertsDir (-update rewrites it) and runs promtool
// test rules on it.
func promtoolGolden(t *testing.T, name, header string, file ptFile) {
	t.Helper()
	var out bytes.Buffer
	out.WriteString(header)
	enc := yaml.NewEncoder(&out)
	enc.SetIndent(2)
	if err := enc.Encode(file); err != nil {
		t.Fatal(err)
	}
	golden := filepath.Join(alertsDir, name)
	testkit.GoldenFile(t, golden, out.Bytes())
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		if testkit.InCI() {
			t.Fatal("promtool missing (Debian package prometheus; CI is set, so this is a failure)")
		}
		t.Skip("SKIPPED: promtool missing (apt-get install prometheus)")
	}
	res, err := exec.Command(promtool, "test", "rules", golden).CombinedOutput()
	if err != nil {
		t.Fatalf("promtool test rules: %v\n%s", err, res)
	}
	t.Logf("promtool test rules:\n%s", res)
}
