package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/cmd/pve-inspectd/internal/config"
	"github.com/pve-inspect/pve-inspect/doctor"
	"github.com/pve-inspect/pve-inspect/testvm/pveemu"
)

// TestDoctorVerb runs `pve-inspectd doctor --json` with a configuration
// against the emulator set up as pve-access-setup does: the verb wires the
// node, pool, token, templates and transfer storage from the configuration
// into the checks, and a role missing a privilege or a template without
// disk hotplug turns the exit status to 1 with the check that caught it.
// (The guard and lockdown rows depend on the host and are not asserted
// here; TestPlaygroundDoctor runs them in the bed's node.)
func TestDoctorVerb(t *testing.T) {
	dir := t.TempDir()
	fb := pveemu.NewFakeBackend(filepath.Join(dir, "run"))
	emu, err := pveemu.New(pveemu.Options{Node: "pve", Backend: fb, DataDir: filepath.Join(dir, "data")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = emu.Close(); _ = fb.Close() })
	ctx := context.Background()
	tpl := filepath.Join(dir, "tpl")
	if err := os.MkdirAll(tpl, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := emu.AddSandboxTemplate(ctx, 9000, tpl, "sandboxes"); err != nil {
		t.Fatal(err)
	}
	if err := emu.AddTemplate(ctx, 9001, "cold", tpl, map[string]string{"hotplug": "network", "net0": pveemu.SandboxNet0}); err != nil {
		t.Fatal(err)
	}
	id, secret, err := emu.ApplyAccessSetup(pveemu.AccessSetup{Templates: []int{9000, 9001}, Transfer: "local"})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewServer(emu)
	t.Cleanup(ts.Close)
	secretFile := filepath.Join(dir, "pve-token")
	if err := os.WriteFile(secretFile, []byte(secret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cfgFile := func(templates string) string {
		p := filepath.Join(dir, "config.toml")
		doc := fmt.Sprintf(`[node]
id = "pve"
[lockdown]
state_file = %q
[api]
enabled = true
socket = %q
templates = { %s }
disk_transfer_storage = "local"
[api.proxmox]
url = %q
token_id = %q
secret_file = %q
ca_file = ""
`, filepath.Join(dir, "lockdown.json"), filepath.Join(dir, "api.sock"), templates, ts.URL+"/api2/json", id, secretFile)
		if err := os.WriteFile(p, []byte(doc), 0o600); err != nil {
			t.Fatal(err)
		}
		if _, err := config.Load(p, false); err != nil {
			t.Fatalf("config: %v\n%s", err, doc)
		}
		return p
	}
	doctorJSON := func(cfg string) (map[string]doctor.Result, error) {
		t.Helper()
		root := newRootCmd()
		var out bytes.Buffer
		root.SetOut(&out)
		root.SetArgs([]string{"-c", cfg, "doctor", "--json", "--unit", "pve-inspectd-doctor-test-absent.service"})
		err := root.ExecuteContext(ctx)
		var rep doctor.Report
		if jerr := json.Unmarshal(out.Bytes(), &rep); jerr != nil {
			t.Fatalf("doctor output: %v\n%s", jerr, out.String())
		}
		got := map[string]doctor.Result{}
		for _, c := range rep.Checks {
			got[c.Name] = c
		}
		return got, err
	}
	wantStatus := func(got map[string]doctor.Result, name string, st doctor.Status) {
		t.Helper()
		if got[name].Status != st {
			t.Errorf("%s: %s (%s), want %s", name, got[name].Status, got[name].Detail, st)
		}
	}

	got, _ := doctorJSON(cfgFile(`debian = 9000`))
	for _, name := range []string{"proxmox version", "token privileges", "token scope", "storages", "sdn and dnsmasq", "ipam", "template debian (9000)"} {
		wantStatus(got, name, doctor.Pass)
	}
	wantStatus(got, "unit sandbox vs transfer storage", doctor.Skip)
	if _, ok := got["canary: create"]; ok {
		t.Error("the canary ran without --canary")
	}
	// A fresh node's local lists no images (a leaked transfer image is
	// invisible); with images among ISOs and backups the grant reaches
	// those: a warning.
	wantStatus(got, "transfer storage content", doctor.Fail)
	emu.SetStorageContent("local", "backup,images,iso,vztmpl")
	got, _ = doctorJSON(cfgFile(`debian = 9000`))
	wantStatus(got, "transfer storage content", doctor.Warn)

	// A template without disk hotplug while the disk path is on.
	got, err = doctorJSON(cfgFile(`debian = 9000, cold = 9001`))
	wantStatus(got, "template cold (9001)", doctor.Fail)
	var ee *exitError
	if !errors.As(err, &ee) || ee.code != 1 {
		t.Errorf("exit %v, want code 1", err)
	}

	// The role without a privilege the daemon needs.
	if err := emu.AddRole("PVEInspect", []string{"VM.Audit", "Pool.Audit"}); err != nil {
		t.Fatal(err)
	}
	got, _ = doctorJSON(cfgFile(`debian = 9000`))
	wantStatus(got, "token privileges", doctor.Fail)
	if r := got["token privileges"]; r.Fix == "" {
		t.Error("privilege failure without a fix")
	}
}

// TestDoctorGuardAndLockdown runs the binary's doctor in a node namespace
// before and while the daemon runs: before, the guard table is absent and
// the lockdown state unknown, and without a token secret the Proxmox
// checks give way to one failure naming pve-access-setup; while the
// daemon runs, the guard and lockdown rows pass.
func TestDoctorGuardAndLockdown(t *testing.T) {
	n := newNode(t)
	cfg := writeConfig(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	doctorRows := func() (map[string]doctor.Result, error) {
		t.Helper()
		out, err := n.daemonCmd(ctx, "doctor", "-c", cfg, "--json").Output()
		var rep doctor.Report
		if jerr := json.Unmarshal(out, &rep); jerr != nil {
			t.Fatalf("doctor output: %v (%v)\n%s", jerr, err, out)
		}
		got := map[string]doctor.Result{}
		for _, c := range rep.Checks {
			got[c.Name] = c
		}
		return got, err
	}

	got, err := doctorRows()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 1 {
		t.Errorf("doctor before the daemon: %v, want exit 1", err)
	}
	for name, want := range map[string]string{"proxmox token": "pve-access-setup", "guard": "start the daemon", "lockdown": "start the daemon"} {
		if r := got[name]; r.Status != doctor.Fail || !strings.Contains(r.Fix, want) {
			t.Errorf("%s before the daemon: %+v, want a failure whose fix says %q", name, r, want)
		}
	}
	if r := got["conntrack bound"]; r.Status == doctor.Fail {
		t.Errorf("conntrack bound with the default node_conn_limit: %+v", r)
	}
	if len(got) != 5 {
		t.Errorf("checks without a token: %v", got)
	}

	n.startRun(t, ctx, cfg)
	deadline := time.Now().Add(2 * time.Minute)
	for {
		got, _ = doctorRows()
		if got["guard"].Status == doctor.Pass && got["lockdown"].Status == doctor.Pass {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("while the daemon runs: guard %+v, lockdown %+v", got["guard"], got["lockdown"])
		}
		time.Sleep(500 * time.Millisecond)
	}
	if !strings.Contains(got["guard"].Detail, "in force") {
		t.Errorf("guard: %+v", got["guard"])
	}
}

func TestDoctorConntrackBound(t *testing.T) {
	cases := []struct {
		name, max string // max "": no nf_conntrack_max (module not loaded)
		want      doctor.Status
	}{
		{"pve-firewall default", "262144\n", doctor.Pass},
		{"below node_conn_limit", "65536\n", doctor.Fail},
		{"not loaded", "", doctor.Skip},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := config.Default()
			cfg.Guard.ProcRoot = t.TempDir()
			if tc.max != "" {
				p := filepath.Join(cfg.Guard.ProcRoot, "sys/net/netfilter/nf_conntrack_max")
				if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(p, []byte(tc.max), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			if o := conntrackCheck(cfg).Run(context.Background()); o.Status != tc.want {
				t.Errorf("%+v, want %s", o, tc.want)
			}
		})
	}
}

// TestDoctorConntrackAcct: the egress record's flows want conntrack's
// accounting on.
func TestDoctorConntrackAcct(t *testing.T) {
	cases := []struct {
		name, acct string // acct "": conntrack not loaded
		want       doctor.Status
	}{
		{"on (the guard set it)", "1\n", doctor.Pass},
		{"off", "0\n", doctor.Fail},
		{"not loaded", "", doctor.Skip},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			cfg := config.Default()
			cfg.Guard.ProcRoot = t.TempDir()
			if tc.acct != "" {
				p := filepath.Join(cfg.Guard.ProcRoot, "sys/net/netfilter/nf_conntrack_acct")
				if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(p, []byte(tc.acct), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			if o := conntrackAcctCheck(cfg).Run(context.Background()); o.Status != tc.want {
				t.Errorf("%+v, want %s", o, tc.want)
			}
		})
	}
}
