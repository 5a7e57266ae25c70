package e2e_test

import (
	"context"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/internal/testkit"
	"github.com/pve-inspect/pve-inspect/qga"
	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
	"github.com/pve-inspect/pve-inspect/testvm"
)

// TestBedNamesResolve is issue 37's names acceptance on the bed, with the
// host guard and egress policies as the daemon runs them: in a two-VM
// sandbox of each egress mode (open, allowlist, none) the API reports
// each VM's address from Proxmox's IPAM, which is the address the guest
// got; `getent hosts target` in attacker answers target's address,
// through /etc/hosts, without DNS; `hostname` prints each VM's name. The
// three sandboxes use the same names, and each resolves its own. Two warm
// pool members claimed under a new name answer to it, although their
// /etc/hosts was a symlink, to another file in one, to a directory in the
// other (what it pointed to is left alone).
func TestBedNamesResolve(t *testing.T) {
	testkit.RequireRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	eg := &registryEgress{}
	hook := &guardHook{}
	e := newBedEnv(t, ctx, func(o *options) {
		o.Egress = eg
		o.WarmPool = []sandbox.PoolShape{{Name: "one", Template: "debian", Target: 2}}
		o.ZonesChanged = hook.zonesChanged
	})
	g := startCheckedGuard(t, ctx, e, bedChecker(t), hook)
	eg.start(t, ctx, e, g)

	run := func(sb, vm, script string) string {
		t.Helper()
		res, err := e.c.Exec(ctx, sb, vm, apitype.ExecRequest{Argv: []string{"/bin/sh", "-c", script}, TimeoutSeconds: 20})
		if err != nil {
			t.Fatal(err)
		}
		if res.ExitCode != 0 {
			t.Errorf("%s/%s: %q: exit %d: %s", sb, vm, script, res.ExitCode, res.Stderr)
		}
		return strings.TrimSpace(string(res.Stdout))
	}
	addr := func(v apitype.VM) string {
		t.Helper()
		if len(v.Addresses) != 1 || v.Addresses[0].Network != "net0" {
			t.Fatalf("vm %s: addresses %+v, want one on net0", v.Name, v.Addresses)
		}
		return v.Addresses[0].IPv4
	}
	for _, pol := range []*apitype.EgressPolicy{nil, {Mode: "allowlist", Allow: []string{testvm.InternetAddr + "/32"}}, {Mode: "none"}} {
		mode := "open"
		if pol != nil {
			mode = pol.Mode
		}
		sb, err := e.c.Create(ctx, apitype.CreateRequest{VMs: []apitype.VMRequest{{Name: "attacker", Template: "debian"}, {Name: "target", Template: "debian"}}, Egress: pol})
		if err != nil {
			t.Fatalf("%s: %v", mode, err)
		}
		t.Cleanup(func() { _ = e.c.Delete(context.Background(), sb.ID) })
		got, err := e.c.Get(ctx, sb.ID)
		if err != nil {
			t.Fatal(err)
		}
		att, tgt := addr(got.VMs[0]), addr(got.VMs[1])
		if att == tgt {
			t.Fatalf("%s: both VMs at %s", mode, att)
		}
		if out := run(sb.ID, "attacker", "getent hosts target"); strings.Join(strings.Fields(out), " ") != tgt+" target" {
			t.Errorf("egress %s: getent hosts target in attacker: %q, want %s (the API's)", mode, out, tgt)
		}
		if out := run(sb.ID, "target", "getent hosts attacker"); strings.Join(strings.Fields(out), " ") != att+" attacker" {
			t.Errorf("egress %s: getent hosts attacker in target: %q, want %s", mode, out, att)
		}
		for _, v := range got.VMs {
			if out := run(sb.ID, v.Name, "hostname; cat /etc/hostname"); out != v.Name+"\n"+v.Name {
				t.Errorf("egress %s: hostname and /etc/hostname of %s: %q", mode, v.Name, out)
			}
		}
		// the IPAM's address is the one the guest got from the zone's DHCP
		if out := run(sb.ID, "target", "ip -4 -o addr show dev eth0"); !strings.Contains(out, " "+tgt+"/") {
			t.Errorf("egress %s: target's eth0 %q lacks the API's address %s", mode, out, tgt)
		}
	}

	// The pool members: each one's /etc/hosts made a symlink before the
	// claim (directly through its agent: no API call reaches a member),
	// one to another file, one to a directory.
	e.srv.Engine().MaintainPool(ctx)
	members := e.srv.Engine().Pool().Members
	if len(members) != 2 || len(members[0].VMIDs) != 1 || len(members[1].VMIDs) != 1 {
		t.Fatalf("pool members %+v", members)
	}
	const victim = "192.0.2.99 web\n"
	plants := map[int]string{
		members[0].VMIDs[0]: "printf '" + victim + "' > /root/victim && ln -sf /root/victim /etc/hosts",
		members[1].VMIDs[0]: "mkdir /root/victim.d && printf '" + victim + "' > /root/victim.d/x && ln -sf /root/victim.d /etc/hosts",
	}
	for vmid, plant := range plants {
		guest := qga.New(qga.Options{}).SandboxGuests()(filepath.Join(e.bed.QGADir(), strconv.Itoa(vmid)+".qga"))
		res, err := guest.Exec(ctx, sandbox.GuestExec{Argv: []string{"/bin/sh", "-c", plant}, Timeout: 10})
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("plant the symlink in %d: %+v %v", vmid, res, err)
		}
	}
	for range plants {
		sb, err := e.c.Create(ctx, apitype.CreateRequest{VMs: []apitype.VMRequest{{Name: "web", Template: "debian"}}})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = e.c.Delete(context.Background(), sb.ID) })
		if _, ok := plants[sb.VMs[0].VMID]; !sb.FromPool || !ok {
			t.Fatalf("create not claimed from the pool: %+v", sb)
		}
		web := addr(sb.VMs[0])
		if out := run(sb.ID, "web", "hostname"); out != "web" {
			t.Errorf("claimed VM %d's hostname %q, want web (not the member's)", sb.VMs[0].VMID, out)
		}
		if out := run(sb.ID, "web", "getent hosts web"); strings.Join(strings.Fields(out), " ") != web+" web" {
			t.Errorf("claimed VM %d: getent hosts web %q, want %s", sb.VMs[0].VMID, out, web)
		}
		if out := run(sb.ID, "web", "if [ -L /etc/hosts ]; then echo link; fi; cat /root/victim /root/victim.d/x 2>/dev/null; true"); out != strings.TrimSpace(victim) {
			t.Errorf("claimed VM %d after the claim: %q, want /etc/hosts a file of its own and the symlink's target untouched", sb.VMs[0].VMID, out)
		}
	}
}
