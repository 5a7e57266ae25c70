package e2e_test

import (
	"context"
	"errors"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/internal/testkit"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// TestBedNoNetworkVM is the reference plugin's "virtual machine with no
// network access" (nics=[]) on the bed: a sandbox of a VM created with
// no_network, listed first, beside a VM on the sandbox's network. The
// sandbox is ready; the VM's clone has no netN, so the emulator starts
// it, as qemu-server would, with no NIC: its guest has the loopback only
// (its /sys/class/net, and the network namespace the bed gave it, as the
// test's hand sees it from outside), the node has no tap of it, and it
// answers exec through its agent (hostname its name, its own name in its
// /etc/hosts, no route anywhere); its sibling has eth0 and an address.
// The health monitor, reading the bed's cgroups and taps, finds both ok
// with nothing missing; the containment check from it is refused (409
// naming it). The delete takes both guests and their namespaces off the
// bed.
func TestBedNoNetworkVM(t *testing.T) {
	testkit.RequireRoot(t, "ip")
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	e := newHealthBedEnv(t, ctx)
	sb, err := e.c.Create(ctx, apitype.CreateRequest{VMs: []apitype.VMRequest{
		{Name: "vault", Template: "debian", NoNetwork: true},
		{Name: "box", Template: "debian"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.c.Delete(context.WithoutCancel(ctx), sb.ID) })
	vault, box := sb.VMs[0], sb.VMs[1]
	if sb.State != apitype.StateReady || !vault.NoNetwork || len(vault.Networks) != 0 || len(vault.Addresses) != 0 || len(box.Addresses) != 1 {
		t.Fatalf("sandbox %+v, want ready, vault without NIC or address, box with one", sb)
	}
	gv, ok := e.bed.Guest(vault.VMID)
	if !ok || gv.VNet != "" {
		t.Fatalf("vault on the bed: %v, vnet %q; want running on no vnet", ok, gv.VNet)
	}
	// from outside, the test's hand: the guest's namespace has lo only,
	// and the node no tap of it
	if out, err := exec.CommandContext(ctx, "ip", "-n", gv.NS, "-o", "link").Output(); err != nil || strings.Count(string(out), "\n") != 1 || !strings.Contains(string(out), ": lo:") {
		t.Errorf("vault's links from outside (%v):\n%s\nwant lo only", err, out)
	}
	if out, _ := exec.CommandContext(ctx, "ip", "-n", e.bed.NodeNS(), "-o", "link").Output(); strings.Contains(string(out), "tap"+strconv.Itoa(vault.VMID)+"i") {
		t.Errorf("the node has a tap of vault:\n%s", out)
	}

	run := func(vm string, argv ...string) string {
		t.Helper()
		res, err := e.c.Exec(ctx, sb.ID, vm, apitype.ExecRequest{Argv: argv, TimeoutSeconds: 20})
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("exec %v in %s: %+v %v", argv, vm, res, err)
		}
		return strings.TrimSpace(string(res.Stdout))
	}
	if got := run("vault", "ls", "/sys/class/net"); got != "lo" {
		t.Errorf("vault's /sys/class/net: %q, want lo only", got)
	}
	if got := run("vault", "hostname"); got != "vault" {
		t.Errorf("vault's hostname %q", got)
	}
	if got := run("vault", "sh", "-c", "ip -4 route show; grep -c . /etc/hosts; grep -w box /etc/hosts || true; grep -w vault /etc/hosts"); !strings.HasSuffix(got, "127.0.1.1\tvault") || strings.Contains(got, "box") || strings.Contains(got, "default") {
		t.Errorf("vault's routes and /etc/hosts:\n%s\nwant no route, itself at 127.0.1.1 and no sibling", got)
	}
	if got := run("box", "ls", "/sys/class/net"); !strings.Contains(got, "eth0") {
		t.Errorf("box's /sys/class/net: %q, want eth0", got)
	}

	// health: both ok, nothing of either missing (vault has no tap to miss)
	var h *apitype.SandboxHealth
	for start := time.Now(); time.Since(start) < bedHealthVerdictTime; time.Sleep(200 * time.Millisecond) {
		got, err := e.c.Get(ctx, sb.ID)
		if err == nil && got.Health != nil && len(got.Health.VMs) == 2 {
			h = got.Health
			if h.State == apitype.HealthOK && len(h.VMs[0].Host.Missing) == 0 && len(h.VMs[1].Host.Missing) == 0 && h.VMs[0].Host.AgentOK {
				break
			}
		}
	}
	if h == nil || h.State != apitype.HealthOK {
		t.Fatalf("health %+v, want ok", h)
	}
	for _, v := range h.VMs {
		if v.State != apitype.HealthOK || len(v.Host.Missing) != 0 || !v.Host.AgentOK || v.Host.MemoryBytes == 0 {
			t.Errorf("%s's health %+v, want ok with its cgroup read and nothing missing", v.Name, v)
		}
		if v.Name == "vault" && (v.Host.NetPacketsFromGuest != 0 || v.Host.NetPacketsToGuest != 0) {
			t.Errorf("vault's health counts packets: %+v", v.Host)
		}
	}

	var p *apitype.Problem
	if _, err := e.c.Check(ctx, sb.ID, "vault"); !errors.As(err, &p) || p.Status != 409 || !strings.Contains(p.Detail, "vm vault has no network") {
		t.Errorf("check from vault: %v, want 409 naming it", err)
	}

	if err := e.c.Delete(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	for _, v := range sb.VMs {
		if _, ok := e.bed.Guest(v.VMID); ok {
			t.Errorf("guest %s (%d) still running on the bed", v.Name, v.VMID)
		}
	}
	if out, _ := exec.CommandContext(ctx, "ip", "netns", "list").Output(); strings.Contains(string(out), gv.NS) {
		t.Errorf("vault's namespace %s is left:\n%s", gv.NS, out)
	}
	if v := e.emu.Violations(); len(v) != 0 {
		t.Errorf("schema violations: %+v", v)
	}
}
