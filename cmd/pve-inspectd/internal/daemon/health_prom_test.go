package daemon

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	dto "github.com/prometheus/client_model/go"

	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitest"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// healthNode is a settable sandbox.NodeStats.
type healthNode struct{ st sandbox.VMStats }

func (h healthNode) VMStats(int, int) sandbox.VMStats { return h.st }
func (h healthNode) CTStats(int, int) sandbox.VMStats { return h.st }

// healthEngine is an engine on fakes with one ready sandbox, its metrics
// served on a loopback listener.
type healthEngine struct {
	e    *sandbox.Engine
	px   *apitest.Proxmox
	reg  *prometheus.Registry
	sb   apitype.Sandbox
	addr string
}

func newHealthEngine(t *testing.T) *healthEngine {
	t.Helper()
	g := apitest.NewGuests()
	h := &healthEngine{px: apitest.NewProxmox(g, map[string]int{"debian": 9000}), reg: prometheus.NewRegistry()}
	e, err := sandbox.New(sandbox.Options{Node: "n1", Proxmox: h.px, Guests: g.Dial, StateDir: t.TempDir(), Registerer: h.reg,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Health: sandbox.HealthOptions{Node: healthNode{sandbox.VMStats{CPUSeconds: 3, MemoryBytes: 64 << 20, MemoryPeakBytes: 80 << 20,
			NetBytesToGuest: 10, NetBytesFromGuest: 20, NetPacketsToGuest: 1, NetPacketsFromGuest: 2, DiskReadBytes: 4096, DiskWriteBytes: 8192}}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.Reconcile(context.Background()); err != nil {
		t.Fatal(err)
	}
	h.e = e
	if h.sb, err = e.Create(context.Background(), apitype.CreateRequest{Owner: "alice", TTLSeconds: 3600,
		VMs: []apitype.VMRequest{{Name: "vm0", Template: "debian"}}, Networks: []apitype.NetworkRequest{{Name: "net0", CIDR: "auto"}}}); err != nil {
		t.Fatal(err)
	}
	e.CheckHealth(context.Background())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: promhttp.HandlerFor(h.reg, promhttp.HandlerOpts{}), ReadHeaderTimeout: 5 * time.Second}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	h.addr = ln.Addr().String()
	return h
}

// promQuery runs an instant query and returns its status and result
// count.
func promQuery(base, q string) (status string, n int, err error) {
	resp, err := http.Get(base + "/api/v1/query?query=" + url.QueryEscape(q))
	if err != nil {
		return "", 0, err
	}
	defer resp.Body.Close()
	var doc struct {
		Status string `json:"status"`
		Error  string `json:"error"`
		Data   struct {
			Result []json.RawMessage `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&doc); err != nil {
		return "", 0, err
	}
	if doc.Status != "success" {
		return doc.Status, 0, fmt.Errorf("%s: %s", q, doc.Error)
	}
	return doc.Status, len(doc.Data.Result), nil
}

// waitProm polls q until cond holds on its result count, or fails.
func waitProm(t *testing.T, base, q string, cond func(int) bool, what string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		_, n, err := promQuery(base, q)
		if err == nil && cond(n) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %s gave %d results, %v", what, q, n, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// dashboardQueries returns every PromQL expression of the shipped
// dashboard (panel targets and variable queries), its variables filled as
// Grafana fills "All".
func dashboardQueries(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(alertsDir, "grafana-dashboard.json"))
	if err != nil {
		t.Fatal(err)
	}
	var d struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Type  string `json:"type"`
				Query any    `json:"query"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(b, &d); err != nil {
		t.Fatalf("dashboard: %v", err)
	}
	fill := strings.NewReplacer("$__rate_interval", "1m", "$instance", ".*", "$owner", ".*", "$sandbox", ".*")
	var out []string
	for _, p := range d.Panels {
		if len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			out = append(out, fill.Replace(tg.Expr))
		}
	}
	labelValues := regexp.MustCompile(`^label_values\((.+), *(\w+)\)$`)
	for _, v := range d.Templating.List {
		q, ok := v.Query.(map[string]any)
		if v.Type != "query" || !ok {
			continue
		}
		m := labelValues.FindStringSubmatch(fmt.Sprint(q["query"]))
		if m == nil {
			t.Errorf("variable query %v is not label_values(selector, label)", q["query"])
			continue
		}
		out = append(out, fill.Replace(m[1]))
	}
	return out
}

// TestHealthPrometheus: a real Prometheus scrapes the engine's metrics.
// It sees the per-sandbox series, labelled by sandbox, VM and owner; every
// query of the shipped dashboard is valid PromQL with results on those
// series; and the series are gone once the sandbox is deleted.
func TestHealthPrometheus(t *testing.T) {
	h := newHealthEngine(t)
	base := startPrometheus(t, h.addr)
	sel := fmt.Sprintf(`{sandbox=%q, vm="vm0", owner="alice"}`, h.sb.ID)
	waitProm(t, base, "pve_inspect_sandbox_vm_cpu_seconds_total"+sel, func(n int) bool { return n == 1 }, "per-sandbox series scraped")
	h.px.SetVMState(h.sb.VMs[0].VMID, "stopped", "")
	h.e.CheckHealth(context.Background())
	waitProm(t, base, `pve_inspect_sandbox_breaks_total{reason="vm-stopped"}`, func(n int) bool { return n == 1 }, "break counted")
	for _, name := range []string{"cpu_seconds_total", "memory_bytes", "memory_peak_bytes", "network_bytes_total", "network_packets_total",
		"disk_read_bytes_total", "disk_write_bytes_total", "agent_rtt_seconds", "health", "oom_kills_total"} {
		if _, n, err := promQuery(base, "pve_inspect_sandbox_vm_"+name+sel); err != nil || n == 0 {
			t.Errorf("%s: %d series, %v", name, n, err)
		}
	}
	// rate() needs two scrapes past the first, which a loaded machine
	// takes its time to make: each query is asked until it has results
	deadline := time.Now().Add(time.Minute)
	for _, q := range dashboardQueries(t) {
		for {
			_, n, err := promQuery(base, q)
			if err == nil && n > 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Errorf("dashboard query %s: %d results, %v", q, n, err)
				break
			}
			time.Sleep(200 * time.Millisecond)
		}
	}
	if err := h.e.Delete(context.Background(), h.sb.ID); err != nil {
		t.Fatal(err)
	}
	h.e.CheckHealth(context.Background())
	waitProm(t, base, `{__name__=~"pve_inspect_sandbox_vm_.+", sandbox="`+h.sb.ID+`"}`, func(n int) bool { return n == 0 }, "series dropped after delete")
}

// TestHealthAlertRules writes the promtool unit tests of the sandbox
// health alerts from the engine's own series (names and labels as
// gathered), golden in packaging/deb/alerts_health_test.yml, and runs
// promtool on them: a broken VM fires PveInspectSandboxBroken after its
// for; a burst of breaks over the node's usual rate fires
// PveInspectSandboxBreaksAboveUsual, a steady trickle does not; healthy
// VMs fire nothing.
func TestHealthAlertRules(t *testing.T) {
	h := newHealthEngine(t)
	h.px.SetVMState(h.sb.VMs[0].VMID, "stopped", "")
	h.e.CheckHealth(context.Background())
	mfs, err := h.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	fams := map[string]*dto.MetricFamily{}
	for _, mf := range mfs {
		fams[mf.GetName()] = mf
	}
	// Sandbox ids are random: the golden file names a fixed one.
	const sbx = "sbgolden"
	broken, _ := series(t, fams, "pve_inspect_sandbox_vm_health", map[string]string{"state": "broken", "sandbox": sbx})
	ok, _ := series(t, fams, "pve_inspect_sandbox_vm_health", map[string]string{"state": "ok", "sandbox": sbx})
	breaks, _ := series(t, fams, "pve_inspect_sandbox_breaks_total", nil)
	brokenExp := ptExp{Labels: map[string]string{"instance": "pve1:9474", "sandbox": sbx, "vm": "vm0", "owner": "alice", "severity": "warning"},
		Annotations: map[string]string{
			"summary":     fmt.Sprintf("pve1:9474: sandbox %s vm vm0 (owner alice) is broken", sbx),
			"description": fmt.Sprintf("Run `pve-inspectd sandbox health %s` on the node for the reason and the signals.", sbx)}}
	burstExp := ptExp{Labels: map[string]string{"instance": "pve1:9474", "severity": "warning"},
		Annotations: map[string]string{
			"summary":     "pve1:9474: sandbox breaks in the last hour are over three times the node's usual rate",
			"description": "`pve_inspect_sandbox_breaks_total` by reason says which kind; check the node's memory, storage and templates."}}
	file := ptFile{RuleFiles: []string{"alerts.yml"}, EvaluationInterval: "1m", Tests: []ptTest{
		{Name: "PveInspectSandboxBroken fires on the engine's series after 1m", Interval: "1m",
			InputSeries: []ptSeries{{Series: broken, Values: "1x10"}},
			Alerts: []ptAlert{{EvalTime: "0m", Alertname: "PveInspectSandboxBroken"},
				{EvalTime: "2m", Alertname: "PveInspectSandboxBroken", Exp: []ptExp{brokenExp}}}},
		{Name: "PveInspectSandboxBreaksAboveUsual fires on a burst after a quiet day", Interval: "1m",
			InputSeries: []ptSeries{{Series: breaks, Values: "0x1440 1+1x20"}},
			Alerts: []ptAlert{{EvalTime: "1441m", Alertname: "PveInspectSandboxBreaksAboveUsual"},
				{EvalTime: "1450m", Alertname: "PveInspectSandboxBreaksAboveUsual", Exp: []ptExp{burstExp}}}},
		{Name: "a steady trickle of breaks is the usual rate", Interval: "1m",
			InputSeries: []ptSeries{{Series: breaks, Values: "0+0.1x1500"}},
			Alerts:      []ptAlert{{EvalTime: "1500m", Alertname: "PveInspectSandboxBreaksAboveUsual"}}},
		{Name: "healthy sandboxes fire nothing", Interval: "1m",
			InputSeries: []ptSeries{{Series: ok, Values: "1x10"}, {Series: broken, Values: "0x10"}},
			Alerts:      []ptAlert{{EvalTime: "5m", Alertname: "PveInspectSandboxBroken"}}},
	}}
	promtoolGolden(t, "alerts_health_test.yml", "# promtool unit tests of the sandbox health alerts of alerts.yml\n"+
		"# (promtool test rules alerts_health_test.yml). Generated by TestHealthAlertRules\n"+
		"# (cmd/pve-inspectd/internal/daemon) from the engine's gathered series; rewrite\n"+
		"# with go test -run TestHealthAlertRules -update.\n", file)
}
