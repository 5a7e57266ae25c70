package daemon

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/pve-inspect/pve-inspect/cmd/pve-inspectd/internal/config"
	"github.com/pve-inspect/pve-inspect/firewall"
	"github.com/pve-inspect/pve-inspect/internal/deathsig"
	"github.com/pve-inspect/pve-inspect/internal/testkit"
)

// freeAddr returns a loopback address nobody listens on.
func freeAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().String()
}

// startPrometheus runs Debian's prometheus scraping target every second
// with the shipped alert rules; it is killed (by its pid) at cleanup.
func startPrometheus(t *testing.T, target string) string {
	t.Helper()
	bin, err := exec.LookPath("prometheus")
	if err != nil {
		if testkit.InCI() {
			t.Fatal("prometheus missing (Debian package prometheus; CI is set, so this is a failure)")
		}
		t.Skip("SKIPPED: prometheus missing (apt-get install prometheus)")
	}
	dir := t.TempDir()
	rules, err := filepath.Abs(filepath.Join(alertsDir, "alerts.yml"))
	if err != nil {
		t.Fatal(err)
	}
	cfg := fmt.Sprintf(`global:
  scrape_interval: 1s
  evaluation_interval: 1s
rule_files: [%q]
scrape_configs:
  - job_name: pve-inspectd
    static_configs:
      - targets: [%q]
`, rules, target)
	if err := os.WriteFile(filepath.Join(dir, "prometheus.yml"), []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	addr := freeAddr(t)
	cmd := exec.Command(bin, "--config.file="+filepath.Join(dir, "prometheus.yml"), "--storage.tsdb.path="+filepath.Join(dir, "data"),
		"--web.listen-address="+addr)
	logf, err := os.Create(filepath.Join(dir, "prometheus.log"))
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	waited, err := deathsig.Start(cmd, syscall.SIGKILL)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-waited
		logf.Close()
		if t.Failed() {
			b, _ := os.ReadFile(filepath.Join(dir, "prometheus.log"))
			t.Logf("prometheus log:\n%s", b)
		}
	})
	return "http://" + addr
}

// promAlertState returns the state of alert name in Prometheus ("" when
// inactive).
func promAlertState(base, name string) (string, error) {
	resp, err := http.Get(base + "/api/v1/alerts")
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var doc struct {
		Data struct {
			Alerts []struct {
				Labels map[string]string `json:"labels"`
				State  string            `json:"state"`
			} `json:"alerts"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&doc); err != nil {
		return "", err
	}
	for _, a := range doc.Data.Alerts {
		if a.Labels["alertname"] == name {
			return a.State, nil
		}
	}
	return "", nil
}

// promValue evaluates an instant query that must return one sample.
func promValue(base, q string) (string, error) {
	resp, err := http.Get(base + "/api/v1/query?query=" + url.QueryEscape(q))
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var doc struct {
		Data struct {
			Result []struct {
				Value []any `json:"value"`
			} `json:"result"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&doc); err != nil {
		return "", err
	}
	if len(doc.Data.Result) != 1 || len(doc.Data.Result[0].Value) != 2 {
		return "", fmt.Errorf("%s: %d results", q, len(doc.Data.Result))
	}
	return fmt.Sprint(doc.Data.Result[0].Value[1]), nil
}

// TestPrometheusSeesLockdownNotProven: a real Prometheus server scrapes the
// daemon with the shipped rules. With the lockdown lifted the lockdown
// alert is inactive; once the marker appears and the lockdown cannot be
// proven (its resolver file cannot be blanked), the alert goes pending.
func TestPrometheusSeesLockdownNotProven(t *testing.T) {
	ns := testkit.NewNetNS(t, "pdn").Handle()
	cfg := config.Default()
	testParts(t, &cfg)
	// The resolver's directory is a regular file: blanking must fail.
	notDir := filepath.Join(t.TempDir(), "not-a-dir")
	if err := os.WriteFile(notDir, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	cfg.Lockdown.Resolver = filepath.Join(notDir, "resolv.conf")
	cfg.Metrics.Listen = "127.0.0.1:0"
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	addr := make(chan net.Addr, 1)
	d := &Daemon{Config: cfg, GuardOptions: []firewall.Option{firewall.WithNetNS(ns)}, MetricsAddr: func(a net.Addr) { addr <- a }}
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
	})
	var target string
	select {
	case a := <-addr:
		target = a.String()
	case err := <-done:
		done <- err // for the cleanup, which waits on done
		t.Fatalf("daemon ended: %v", err)
	}
	prom := startPrometheus(t, target)

	waitFor(t, "prometheus scraping the daemon with the lockdown lifted", func() error {
		v, err := promValue(prom, `pve_inspect_lockdown_enabled{job="pve-inspectd"}`)
		if err == nil && v != "0" {
			err = fmt.Errorf("lockdown enabled = %s", v)
		}
		return err
	})
	if st, err := promAlertState(prom, "PveInspectLockdownNotEnforced"); err != nil || st != "" {
		t.Fatalf("lockdown alert with the lockdown lifted: %q %v", st, err)
	}
	if err := os.WriteFile(cfg.Lockdown.Marker, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the lockdown alert pending in prometheus", func() error {
		st, err := promAlertState(prom, "PveInspectLockdownNotEnforced")
		if err == nil && st != "pending" && st != "firing" {
			err = fmt.Errorf("alert state %q", st)
		}
		return err
	})
	st, _ := promAlertState(prom, "PveInspectLockdownNotEnforced")
	t.Logf("PveInspectLockdownNotEnforced is %s", st)
}
