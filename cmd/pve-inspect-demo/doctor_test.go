package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/doctor"
	"github.com/pve-inspect/pve-inspect/internal/testkit"
)

// TestPlaygroundDoctor runs the real binary's `pve-inspectd doctor
// --canary --json` inside the playground's node, against its emulator and
// running daemon (with the disk path on the node's dir storage,
// --disk-transfer-storage local): every
// read-only check passes, the unit check is skipped (the daemon runs
// outside systemd here), and the canary's every step passes, both file
// paths included, and so does the container canary's on the playground's
// container template (its [api] containers is on); the exit status is 0
// and the human table says so too.
func TestPlaygroundDoctor(t *testing.T) {
	testkit.RequireRoot(t)
	bin := buildBins(t)
	p := startPlayground(t, bin, "--disk-transfer-storage", "local")
	var stdio []string
	if err := json.Unmarshal([]byte(p.info["mcp_stdio"]), &stdio); err != nil || len(stdio) < 5 || stdio[0] != "ip" {
		t.Fatalf("mcp_stdio %q: %v", p.info["mcp_stdio"], err)
	}
	nodeNS, inspectd := stdio[3], stdio[4]
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	doctorRun := func(args ...string) ([]byte, error) {
		cmd := exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", nodeNS, inspectd, "-c", p.info["config"], "doctor"}, args...)...)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		if err != nil {
			t.Logf("doctor %v: %v\nstdout:\n%s\nstderr:\n%s", args, err, out, stderr.String())
		}
		return out, err
	}

	out, err := doctorRun("--canary", "--json")
	if err != nil {
		t.Fatalf("doctor --canary --json: %v", err)
	}
	var rep doctor.Report
	if err := json.Unmarshal(out, &rep); err != nil {
		t.Fatalf("doctor output: %v\n%s", err, out)
	}
	if !rep.Pass || len(rep.Failed()) != 0 {
		t.Errorf("doctor did not pass: %+v", rep.Failed())
	}
	got := map[string]doctor.Status{}
	for _, c := range rep.Checks {
		got[c.Name] = c.Status
		t.Logf("%-36s %-4s %6d ms  %s", c.Name, c.Status, c.Millis, c.Detail)
	}
	for name, want := range map[string]doctor.Status{
		"proxmox version": doctor.Pass, "token privileges": doctor.Pass, "token scope": doctor.Pass, "storages": doctor.Pass, "sdn and dnsmasq": doctor.Pass,
		"node name": doctor.Pass, "sdn global lock": doctor.Pass, "staged host network edits": doctor.Pass, "transfer storage content": doctor.Warn,
		"ipam": doctor.Pass, "template debian (9000)": doctor.Pass, "unit sandbox vs transfer storage": doctor.Skip,
		"guard": doctor.Pass, "conntrack bound": doctor.Pass, "conntrack accounting": doctor.Pass, "lockdown": doctor.Pass, "sandbox api": doctor.Pass,
		"canary: create": doctor.Pass, "canary: exec": doctor.Pass, "canary: file, streaming path": doctor.Pass,
		"canary: file, disk path": doctor.Pass, "canary: snapshot and rollback": doctor.Pass, "canary: containment check": doctor.Pass,
		"canary: delete": doctor.Pass, "canary: nothing left behind": doctor.Pass, "pool VM NICs": doctor.Pass,
		// the playground's [api] containers is on, its container template
		// ct-debian the only one
		"canary (container): template": doctor.Pass, "canary (container): create": doctor.Pass, "canary (container): exec": doctor.Pass,
		"canary (container): file, streaming path": doctor.Pass, "canary (container): snapshot and rollback": doctor.Pass,
		"canary (container): containment check": doctor.Pass, "canary (container): delete": doctor.Pass, "canary (container): nothing left behind": doctor.Pass,
	} {
		if got[name] != want {
			t.Errorf("check %q: %q, want %q", name, got[name], want)
		}
	}
	if len(rep.Checks) != 34 {
		t.Errorf("%d checks, want 34", len(rep.Checks))
	}
	for _, c := range rep.Checks {
		if c.Name == "canary (container): template" && !strings.Contains(c.Detail, "ct-debian") {
			t.Errorf("container canary's template: %s", c.Detail)
		}
	}

	// The human table of the read-only checks, with the shipped unit's
	// file standing in for systemd: exit 0 or 1, and the verdict said.
	out, err = doctorRun("--unit-file", "../../packaging/deb/pve-inspectd.service")
	table := string(out)
	if !strings.HasPrefix(table, "CHECK") || !strings.Contains(table, "unit sandbox vs transfer storage") {
		t.Errorf("doctor table:\n%s", table)
	}
	var ee *exec.ExitError
	switch {
	case err == nil && strings.Contains(table, "all checks pass"):
		t.Logf("the shipped unit leaves the bed's transfer storage writable:\n%s", table)
	case errors.As(err, &ee) && ee.ExitCode() == 1 && strings.Contains(table, "unit sandbox vs transfer storage FAILED") &&
		strings.Contains(table, "\n  change: "):
		t.Logf("the shipped unit hides the transfer storage, and doctor says what to change:\n%s", table)
	default:
		t.Errorf("doctor --unit-file: %v\n%s", err, table)
	}
	p.stop(t)
}
