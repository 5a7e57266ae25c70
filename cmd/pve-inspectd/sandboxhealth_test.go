package main

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// TestSandboxHealthVerbs: list shows the health, `sandbox health` the
// reason and the VM's signals, `sandbox events` the buffered events, and
// exec on the broken VM fails with sandbox-broken.
func TestSandboxHealthVerbs(t *testing.T) {
	sock, eng, px := startAPIOn(t, true)
	out, err := run(t, "", "sandbox", "create", "--socket", sock, "--template", "debian")
	if err != nil {
		t.Fatal(err)
	}
	var sb apitype.Sandbox
	if err := json.Unmarshal([]byte(out), &sb); err != nil {
		t.Fatal(err)
	}
	eng.CheckHealth(context.Background())
	if out, err := run(t, "", "sandbox", "list", "--socket", sock); err != nil || !strings.Contains(out, "HEALTH") || !strings.Contains(out, " ok ") {
		t.Errorf("list: %q %v", out, err)
	}
	px.SetVMState(sb.VMs[0].VMID, "stopped", "")
	eng.CheckHealth(context.Background())
	out, err = run(t, "", "sandbox", "health", "--socket", sock, sb.ID)
	if err != nil || !strings.Contains(out, "broken (vm-stopped)") || !strings.Contains(out, "vm0") || !strings.Contains(out, "stopped/stopped") {
		t.Errorf("health: %q %v", out, err)
	}
	if _, err := run(t, "", "sandbox", "exec", "--socket", sock, sb.ID, "vm0", "--", "echo", "x"); err == nil || !strings.Contains(err.Error(), "sandbox-broken") {
		t.Errorf("exec on a broken VM: %v", err)
	}
	out, err = run(t, "", "sandbox", "events", "--socket", sock, "--last-event-id", "0", "--timeout", "300ms")
	var got []string
	for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
		var e apitype.Event
		if json.Unmarshal([]byte(line), &e) == nil {
			got = append(got, e.Type)
		}
	}
	if err != nil || strings.Join(got, ",") != "created,ready,health" {
		t.Errorf("events: %v %q", err, out)
	}
}

// TestSandboxCreateAgentlessFromFile: the CLI takes a VM's agent false
// from its request file, as every per-VM option; `sandbox health` shows
// that VM's agent as none (never pinged, not silent), and its exec is
// refused with a conflict naming it.
func TestSandboxCreateAgentlessFromFile(t *testing.T) {
	sock, eng, _ := startAPIOn(t, true)
	req := `{"vms": [{"name": "target", "template": "debian", "agent": false}, {"name": "attacker", "template": "debian"}]}`
	file := filepath.Join(t.TempDir(), "request.json")
	if err := os.WriteFile(file, []byte(req), 0o600); err != nil {
		t.Fatal(err)
	}
	out, err := run(t, "", "sandbox", "create", "--socket", sock, "-f", file)
	if err != nil {
		t.Fatal(err)
	}
	var sb apitype.Sandbox
	if err := json.Unmarshal([]byte(out), &sb); err != nil {
		t.Fatal(err)
	}
	if sb.State != apitype.StateReady || sb.VMs[0].HasAgent() || !sb.VMs[1].HasAgent() {
		t.Fatalf("created %+v, want a ready sandbox whose target has no agent", sb)
	}
	eng.CheckHealth(context.Background())
	out, err = run(t, "", "sandbox", "health", "--socket", sock, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(out, "\n") {
		f := strings.Fields(line)
		if len(f) > 5 && f[0] == "target" && (f[2] != "ok" || f[4] != "none") {
			t.Errorf("target's row %q, want ok with agent none", line)
		}
	}
	if !strings.Contains(out, "\ntarget ") {
		t.Errorf("health has no row of the target:\n%s", out)
	}
	if _, err := run(t, "", "sandbox", "exec", "--socket", sock, sb.ID, "target", "--", "echo", "x"); err == nil || !strings.Contains(err.Error(), "vm target has no guest agent") {
		t.Errorf("exec in the target: %v", err)
	}
}
