package main

import (
	"bufio"
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/internal/testkit"
)

// TestMain lets the test binary act as pve-inspectd, so the verbs are
// tested as the real program inside a network namespace.
func TestMain(m *testing.M) {
	if os.Getenv("PVE_INSPECTD_TEST_AS_MAIN") == "1" {
		os.Args = append([]string{"pve-inspectd"}, os.Args[1:]...)
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// node is a namespace with the tests' fixed interface set.
type node struct{ *testkit.NetNS }

// newNode creates a namespace with a fixed interface set: eth0 (default
// route), stor0 (trusted), vnetA and vnetB (guest bridges).
func newNode(t *testing.T) *node {
	n := testkit.NewNetNS(t, "pgc")
	eth0 := n.Bridge(t, "eth0", "192.0.2.2/24")
	n.Bridge(t, "stor0", "10.99.0.2/24")
	n.Bridge(t, "vnetA", "10.10.1.1/24")
	n.Bridge(t, "vnetB", "10.10.2.1/24")
	n.DefaultVia(t, eth0, "192.0.2.1")
	return &node{n}
}

func writeConfig(t *testing.T) string {
	dir := t.TempDir()
	p := filepath.Join(dir, "config.toml")
	doc := `[node]
id = "test"
[guard]
trusted_interfaces = ["stor0"]
zones = { zone1 = ["vnetA", "vnetA2"] }
sdn_config = "` + filepath.Join(dir, "running-config") + `"
dnsmasq_user = "65534"
metadata4 = ["192.0.0.192/32"]
verify_interval = "1s"
proc_root = "` + filepath.Join(dir, "proc") + `"
state_dir = "` + filepath.Join(dir, "state") + `"
[metrics]
listen = "127.0.0.1:9474"
[lockdown]
marker = "` + filepath.Join(dir, "marker") + `"
resolver = "` + filepath.Join(dir, "resolv.conf") + `"
backup_dir = "` + filepath.Join(dir, "lockdown") + `"
state_file = "` + filepath.Join(dir, "lockdown.json") + `"
[halt]
state_file = "` + filepath.Join(dir, "halted") + `"
[egress]
state_file = "` + filepath.Join(dir, "egress.json") + `"
`
	if err := os.WriteFile(p, []byte(doc), 0o644); err != nil {
		t.Fatal(err)
	}
	// Zones as the reference Inspect plugin creates them, one vnet of
	// which has a bridge on the node, and a vnet pve-network would skip.
	sdn := `{"version":4,"zones":{"ids":{"abc123z":{"type":"simple","ipam":"pve","dhcp":"dnsmasq"}}},` +
		`"vnets":{"ids":{"vnetB":{"type":"vnet","zone":"abc123z"},"abc123v1":{"type":"vnet","zone":"abc123z"},` +
		`"orphan":{"type":"vnet","zone":"gone"}}},"subnets":{"ids":{}},"controllers":{"ids":{}}}`
	if err := os.WriteFile(filepath.Join(dir, "running-config"), []byte(sdn), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// startRun starts `run -c cfg` in the node namespace, waits until it
// logs ready, and kills it when the test ends.
func (n *node) startRun(t *testing.T, ctx context.Context, cfg string) *exec.Cmd {
	t.Helper()
	run := n.daemonCmd(ctx, "run", "-c", cfg)
	stderr, err := run.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := run.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = run.Process.Kill(); _ = run.Wait() })
	sc := bufio.NewScanner(stderr)
	ready := false
	for sc.Scan() {
		if strings.Contains(sc.Text(), "msg=ready") {
			ready = true
			break
		}
	}
	if !ready {
		t.Fatal("run never reported ready")
	}
	go func() { _, _ = io.Copy(io.Discard, stderr) }()
	return run
}

// daemonCmd runs this binary as pve-inspectd inside the node namespace.
func (n *node) daemonCmd(ctx context.Context, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", n.Name, os.Args[0]}, args...)...)
	cmd.Env = append(os.Environ(), "PVE_INSPECTD_TEST_AS_MAIN=1")
	return cmd
}

func TestPlanGolden(t *testing.T) {
	n := newNode(t)
	cfg := writeConfig(t)
	// a node default and one sandbox's persisted policy show in the plan
	f, err := os.OpenFile(cfg, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	_, err = f.WriteString("default_mode = \"allowlist\"\nallow = [\"pypi.org\", \"203.0.113.0/24\"]\ndeny = [\"203.0.113.9\"]\n" +
		// and the warm pool's shapes, with what they hold idle
		"[[pool.shapes]]\nname = \"small\"\ntemplate = \"debian\"\ntarget = 4\nmax_age = \"6h\"\n" +
		"[[pool.shapes]]\nname = \"big\"\ntemplate = \"debian\"\ncores = 4\nmemory_mib = 8192\nnetworks = [\"lan\", \"dmz\"]\negress = \"allowlist\"\ntarget = 1\n")
	if err := errors.Join(err, f.Close()); err != nil {
		t.Fatal(err)
	}
	state := `{"version": 1, "zones": [{"zone": "sb1", "owner": "sb-0001", "bridges": ["vnetB"],
		"policy": {"mode": "allowlist", "allow": ["*.github.com", "198.51.100.0/24"]}}]}`
	if err := os.WriteFile(filepath.Join(filepath.Dir(cfg), "egress.json"), []byte(state), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := n.daemonCmd(context.Background(), "plan", "-c", cfg).CombinedOutput()
	if err != nil {
		t.Fatalf("plan: %v\n%s", err, out)
	}
	out = []byte(strings.ReplaceAll(string(out), filepath.Join(filepath.Dir(cfg), "running-config"), "SDN_CONFIG"))
	testkit.Golden(t, "plan.golden", out)
	// plan changes nothing
	if out, err := exec.Command("ip", "netns", "exec", n.Name, "nft", "list", "ruleset").CombinedOutput(); err != nil || len(strings.TrimSpace(string(out))) != 0 {
		t.Errorf("plan left a ruleset behind: %v %s", err, out)
	}
}

// scrape fetches /metrics from inside the namespace.
func (n *node) scrape(t *testing.T, addr string) string {
	t.Helper()
	tr := &http.Transport{DialContext: func(ctx context.Context, network, a string) (net.Conn, error) {
		ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		return n.DialContext(ctx, network, a)
	}}
	defer tr.CloseIdleConnections()
	resp, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

func TestRunStatusRemove(t *testing.T) {
	n := newNode(t)
	cfg := writeConfig(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()

	out, err := n.daemonCmd(ctx, "status", "-c", cfg).CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 || !strings.Contains(string(out), "ABSENT") {
		t.Fatalf("status before run: %v\n%s", err, out)
	}

	run := n.startRun(t, ctx, cfg)

	out, err = n.daemonCmd(ctx, "status", "-c", cfg).CombinedOutput()
	if err != nil || !strings.Contains(string(out), "in force as desired") || !strings.Contains(string(out), "owned by netlink port") {
		t.Fatalf("status while running: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "table bridge pve-inspect: present, owned by netlink port") ||
		!strings.Contains(string(out), "layer-2 table in force as desired") {
		t.Fatalf("status does not show the layer-2 table in force:\n%s", out)
	}
	m := n.scrape(t, "127.0.0.1:9474")
	for _, want := range []string{
		`pve_inspect_guard_management_interface{interface="eth0"} 1`,
		`pve_inspect_guard_rule_drop_packets_total{chain="forward",rule="cross-zone"} 0`,
		// the install, then the zones of the SDN running config
		"pve_inspect_guard_apply_duration_seconds_count 2",
		"pve_inspect_sdn_zones 1",
		"pve_inspect_sdn_config_valid 1",
	} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics lack %q:\n%s", want, m)
		}
	}
	// every rule of the desired table is in the kernel
	exp := regexp.MustCompile(`(?m)^pve_inspect_guard_rules_expected (\d+)$`).FindStringSubmatch(m)
	pres := regexp.MustCompile(`(?m)^pve_inspect_guard_rules_present (\d+)$`).FindStringSubmatch(m)
	if exp == nil || pres == nil || exp[1] != pres[1] || exp[1] == "0" {
		t.Errorf("rules expected %v, present %v: want the same, non-zero", exp, pres)
	}
	if strings.Contains(m, "pve_inspect_guard_repairs_total{") {
		t.Errorf("first install counted as a repair:\n%s", m)
	}

	if err := run.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	if err := run.Wait(); err != nil {
		t.Fatalf("run after SIGTERM: %v", err)
	}
	out, err = n.daemonCmd(ctx, "status", "-c", cfg).CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 || !strings.Contains(string(out), "ORPHANED") {
		t.Fatalf("status after stop: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "table bridge pve-inspect: present, ORPHANED") {
		t.Fatalf("the layer-2 table did not outlive the daemon:\n%s", out)
	}
	if out, err := n.daemonCmd(ctx, "guard", "remove", "-c", cfg).CombinedOutput(); err != nil {
		t.Fatalf("guard remove: %v\n%s", err, out)
	}
	out, err = n.daemonCmd(ctx, "status", "-c", cfg).CombinedOutput()
	if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 1 || !strings.Contains(string(out), "ABSENT") ||
		!strings.Contains(string(out), "table bridge pve-inspect: ABSENT") {
		t.Fatalf("status after remove: %v\n%s", err, out)
	}
}

func TestRunRefusesBadConfig(t *testing.T) {
	p := filepath.Join(t.TempDir(), "c.toml")
	if err := os.WriteFile(p, []byte("[guard]\nverify_interval = \"often\"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(os.Args[0], "plan", "-c", p)
	cmd.Env = append(os.Environ(), "PVE_INSPECTD_TEST_AS_MAIN=1")
	out, err := cmd.CombinedOutput()
	if err == nil || !strings.Contains(string(out), `"guard.verify_interval"`) {
		t.Errorf("bad config: %v\n%s", err, out)
	}
}
