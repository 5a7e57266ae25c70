package e2e_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pve-inspect/pve-inspect/ctguest"
	"github.com/pve-inspect/pve-inspect/firewall"
	"github.com/pve-inspect/pve-inspect/internal/testkit"
	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
	"github.com/pve-inspect/pve-inspect/testvm"
	"github.com/pve-inspect/pve-inspect/testvm/pveemu"
)

// ctTemplate is the bed's container template (a CT template of the
// emulator on the bed's Debian root).
const (
	ctTemplate   = "ct-debian"
	ctTemplateID = 9100
)

// newContainerBed is a bed environment whose engine also makes
// containers: the emulator has the container template (granted as
// pve-access-setup grants a template), the engine the client's container
// calls, the bed's containers entered from the node and their exec
// cgroups swept at a delete (ctguest), as the daemon wires them; mods
// change the options further.
func newContainerBed(t *testing.T, ctx context.Context, mods ...func(*options)) *bedEnv {
	t.Helper()
	testkit.RequireRoot(t, "lxc-start", "lxc-attach", "lxc-info", "lxc-stop", "debootstrap", "nsenter")
	rootfs, err := testvm.CTRootfs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	var cts *ctguest.Client
	return newBedEnvFull(t, ctx, nil, func(bed *testvm.Bed, emu *pveemu.Server) []int {
		if err := emu.AddCTTemplate(ctTemplateID, ctTemplate, rootfs, map[string]string{"net0": "name=eth0,bridge=vmbr0,ip=dhcp"}); err != nil {
			t.Fatal(err)
		}
		cts = ctguest.New(ctguest.Options{LXCPath: bed.LXCPath(), Prefix: bed.LXCPrefix(), CgroupDir: bed.ContainerCgroupV2})
		return []int{ctTemplateID}
	}, func(o *options) {
		o.Containers = o.Proxmox.(sandbox.Containers)
		o.CTGuests = func(vmid int) sandbox.Guest { return cts.Guest(vmid) }
		o.CTSweep = func(vmid int) error { return cts.Sweep(vmid) }
		for _, mod := range mods {
			mod(o)
		}
	})
}

// TestBedContainerMember: a sandbox of a VM and an unprivileged container
// through the API on the bed: the container is a real LXC container whose
// root is uid 100000 on the node, entered by the daemon without an agent;
// it has its name, the secrets file, its IPAM address on the sandbox's
// network, and resolves the VM by name as the VM resolves it; files go
// both ways; a snapshot and a rollback bring a file back; the delete
// leaves no container, lxc directory, exec cgroup or Proxmox object.
func TestBedContainerMember(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	e := newContainerBed(t, ctx)
	sb, err := e.c.Create(ctx, apitype.CreateRequest{
		VMs: []apitype.VMRequest{{Name: "attacker", Template: "debian"},
			{Name: "target", Kind: apitype.KindLXC, Template: ctTemplate, MemoryMiB: 512}},
		Env: map[string]string{"API_KEY": "s3cret"}, TTLSeconds: 600})
	if err != nil {
		t.Fatal(err)
	}
	if len(sb.VMs) != 2 || sb.VMs[1].Kind != apitype.KindLXC || len(sb.VMs[1].Addresses) != 1 {
		t.Fatalf("members %+v", sb.VMs)
	}
	vmid, addr := sb.VMs[1].VMID, sb.VMs[1].Addresses[0].IPv4
	ct, ok := e.bed.Container(vmid)
	if !ok || !ct.Alive() {
		t.Fatalf("the bed runs no container %d", vmid)
	}
	sh := func(vm, cmd string) string {
		t.Helper()
		res, err := e.c.Exec(ctx, sb.ID, vm, apitype.ExecRequest{Argv: []string{"sh", "-c", cmd}, TimeoutSeconds: 60})
		if err != nil {
			t.Fatalf("%s: %q: %v", vm, cmd, err)
		}
		if res.ExitCode != 0 {
			t.Fatalf("%s: %q: exit %d: %s", vm, cmd, res.ExitCode, res.Stderr)
		}
		return strings.TrimSpace(string(res.Stdout))
	}
	if got := sh("target", "hostname"); got != "target" {
		t.Errorf("container's hostname %q", got)
	}
	if got := sh("target", ". /etc/pve-inspect/env && echo $API_KEY"); got != "s3cret" {
		t.Errorf("secrets file in the container: %q", got)
	}
	if got := sh("target", "hostname -I"); !strings.Contains(" "+got+" ", " "+addr+" ") {
		t.Errorf("container's addresses %q, the IPAM's %s", got, addr)
	}
	if got := sh("target", "getent hosts attacker | cut -d' ' -f1"); got != sb.VMs[0].Addresses[0].IPv4 {
		t.Errorf("the container resolves attacker to %q, want %s", got, sb.VMs[0].Addresses[0].IPv4)
	}
	if got := sh("attacker", "getent hosts target | cut -d' ' -f1"); got != addr {
		t.Errorf("the VM resolves target to %q, want %s", got, addr)
	}
	// root inside is the unprivileged range outside
	if uid := hostUIDOfContainerProcess(t, ct.PID); uid < testvm.CTIDOffset {
		t.Errorf("the container's init runs as host uid %d", uid)
	}

	// files both ways, and a snapshot brings one back
	data := bytes.Repeat([]byte("0123456789abcdef"), 64<<10) // 1 MiB
	if err := e.c.WriteFile(ctx, sb.ID, "target", "/root/data.bin", bytes.NewReader(data), int64(len(data)), 0o600); err != nil {
		t.Fatal(err)
	}
	var back bytes.Buffer
	if n, err := e.c.ReadFile(ctx, sb.ID, "target", "/root/data.bin", &back); err != nil || n != int64(len(data)) || !bytes.Equal(back.Bytes(), data) {
		t.Fatalf("read back %d bytes (equal %v): %v", n, bytes.Equal(back.Bytes(), data), err)
	}
	if err := e.c.Snapshot(ctx, sb.ID, "target", "before"); err != nil {
		t.Fatal(err)
	}
	sh("target", "echo changed > /root/data.bin")
	if err := e.c.Rollback(ctx, sb.ID, "target", "before"); err != nil {
		t.Fatal(err)
	}
	back.Reset()
	if _, err := e.c.ReadFile(ctx, sb.ID, "target", "/root/data.bin", &back); err != nil || !bytes.Equal(back.Bytes(), data) {
		t.Errorf("after the rollback: %d bytes, %v", back.Len(), err)
	}

	if err := e.c.Delete(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	if _, ok := e.bed.Container(vmid); ok {
		t.Errorf("container %d still runs after the delete", vmid)
	}
	if _, err := os.Stat(filepath.Join(e.bed.LXCPath(), strconv.Itoa(vmid))); !os.IsNotExist(err) {
		t.Errorf("lxc directory of %d: %v", vmid, err)
	}
	if left, _ := filepath.Glob(filepath.Join(e.bed.ContainerCgroupV2(vmid), "pve-inspect-exec-*")); len(left) > 0 {
		t.Errorf("exec cgroups left: %v", left)
	}
	if _, err := e.px.CT(ctx, vmid); err == nil {
		t.Errorf("container %d still in Proxmox", vmid)
	}
}

// hostUIDOfContainerProcess is the host uid process pid runs as.
func hostUIDOfContainerProcess(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "status"))
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f, ok := strings.CutPrefix(l, "Uid:"); ok {
			fs := strings.Fields(f)
			if len(fs) > 0 {
				uid, _ := strconv.Atoi(fs[0])
				return uid
			}
		}
	}
	t.Fatalf("no Uid in /proc/%d/status", pid)
	return -1
}

// TestBedContainerCheck: POST /v1/sandboxes/{id}/check from a container
// member on the bed with the host guard in force. The probe runs in the
// unprivileged container, entered from the node (no agent), and every
// row passes: the container's veth is a guest port like a tap (the
// layer-2 table maps it from the container's config, the spoofing rows
// are judged on its vnet with its veth left out of the node's watch),
// the other zone's row aims at another sandbox's container (its address
// from the node's files), and the container rows (id map, the node's
// /proc/sys and /sys, mounts, keyrings, modules, nesting) read denied.
func TestBedContainerCheck(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	hook := &guardHook{}
	chk := bedChecker(t)
	e := newContainerBed(t, ctx, func(o *options) {
		o.Checker = chk
		o.ZonesChanged = hook.zonesChanged
	})
	g := startCheckedGuard(t, ctx, e, chk, hook)
	a, err := e.c.Create(ctx, apitype.CreateRequest{VMs: []apitype.VMRequest{{Name: "vm", Template: "debian"},
		{Name: "ct", Kind: apitype.KindLXC, Template: ctTemplate, MemoryMiB: 512}}})
	if err != nil {
		t.Fatal(err)
	}
	b, err := e.c.Create(ctx, apitype.CreateRequest{VMs: []apitype.VMRequest{{Name: "other", Kind: apitype.KindLXC, Template: ctTemplate, MemoryMiB: 512}}})
	if err != nil {
		t.Fatal(err)
	}
	ct, other := a.VMs[1], b.VMs[0]
	veth := firewall.ContainerPortNames(ct.VMID, 0)[0]
	waitGuardedPort(t, g, veth)
	rep, err := e.c.Check(ctx, a.ID, "ct")
	if err != nil {
		t.Fatal(err)
	}
	if rep.VM != "ct" {
		t.Errorf("report of %q, want ct", rep.VM)
	}
	logCheck(t, rep)
	container, raw, otherZone := 0, 0, false
	for _, r := range rep.Rows {
		switch {
		case strings.HasPrefix(r.Probe, "local: ") && r.Expected == "denied":
			container++
			if r.Observed != "denied" {
				t.Errorf("container row %q: %s (%s)", r.Target, r.Observed, r.Detail)
			}
		case strings.HasPrefix(r.Probe, "raw "):
			raw++
		case strings.Contains(r.Probe, other.Addresses[0].IPv4+":22"):
			otherZone = true
		}
	}
	if container != 7 {
		t.Errorf("%d container rows, want 7", container)
	}
	if raw != 4 {
		t.Errorf("%d layer-2 rows (control included), want 4", raw)
	}
	if !otherZone {
		t.Errorf("no row probes the other sandbox's container %s", other.Addresses[0].IPv4)
	}
	if !rep.Pass || len(rep.Rows) < 20 {
		t.Errorf("containment check from the container did not pass (%d rows)", len(rep.Rows))
	}
	for _, id := range []string{a.ID, b.ID} {
		if err := e.c.Delete(ctx, id); err != nil {
			t.Error(err)
		}
	}
}

// TestBedContainerHealth: a container member's health on the bed is read
// where Proxmox reads it: its cgroup lxc/<vmid> (under the bed's parent;
// on a hybrid host the v1 memory hierarchy's) and its veth<vmid>i0 on the
// node. The memory, CPU and network counters are real and non-zero, the
// datagrams the container sends show in its from-guest bytes, nothing is
// missing, and the per-sandbox series carry the same figures.
func TestBedContainerHealth(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 8*time.Minute)
	defer cancel()
	e := newContainerBed(t, ctx)
	sysfs, err := e.bed.NodeNetSys(ctx)
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	e.opts.Health = sandbox.HealthOptions{PingTimeout: bedPingTimeout,
		Node: sandbox.NodeReader{CgroupRoot: e.bed.CgroupRoot(), Parent: e.bed.CgroupParent(), NetRoot: filepath.Join(sysfs, "class", "net")}}
	e.opts.Options.Registerer = reg
	e.start(t, ctx)
	sb, err := e.c.Create(ctx, apitype.CreateRequest{VMs: []apitype.VMRequest{{Name: "target", Kind: apitype.KindLXC, Template: ctTemplate, MemoryMiB: 512}}, TTLSeconds: 600})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.c.Delete(context.WithoutCancel(ctx), sb.ID) })
	ct := sb.VMs[0]
	host := func() apitype.HostSignals {
		t.Helper()
		e.srv.Engine().CheckHealth(ctx)
		got, err := e.c.Get(ctx, sb.ID)
		if err != nil || got.Health == nil || len(got.Health.VMs) != 1 {
			t.Fatalf("health: %+v, %v", got.Health, err)
		}
		if got.Health.State != apitype.HealthOK {
			t.Errorf("health %s (%s): %s", got.Health.State, got.Health.Reason, got.Health.Detail)
		}
		return got.Health.VMs[0].Host
	}
	before := host()
	t.Logf("container %d: %+v", ct.VMID, before)
	if before.Status != "running" || !before.AgentOK || len(before.Missing) != 0 {
		t.Errorf("container's host signals %+v: want running, entered, nothing missing", before)
	}
	if before.MemoryBytes == 0 || before.CPUSeconds <= 0 || before.NetBytesFromGuest == 0 || before.NetBytesToGuest == 0 || before.NetPacketsFromGuest == 0 {
		t.Errorf("container's counters %+v: want memory, CPU and both directions of its DHCP lease counted", before)
	}
	if before.MemoryBytes > 512<<20 {
		t.Errorf("container's memory %d bytes, over its 512 MiB cap", before.MemoryBytes)
	}
	// 64 datagrams of 1000 bytes from the container to its gateway's
	// discard port: its veth's rx, whatever the guard does with them
	gw := sb.Networks[0].Gateway
	const sent = 64 * 1000
	res, err := e.c.Exec(ctx, sb.ID, ct.Name, apitype.ExecRequest{Argv: []string{"bash", "-c",
		`for i in $(seq 64); do head -c 1000 /dev/zero > /dev/udp/"$1"/9; done`, "send", gw}, TimeoutSeconds: 60})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("send: %+v, %v", res, err)
	}
	after := host()
	if after.NetBytesFromGuest < before.NetBytesFromGuest+sent || after.NetPacketsFromGuest < before.NetPacketsFromGuest+64 {
		t.Errorf("from the container: %d bytes, %d packets after sending %d bytes in 64 datagrams (before: %d, %d)",
			after.NetBytesFromGuest, after.NetPacketsFromGuest, sent, before.NetBytesFromGuest, before.NetPacketsFromGuest)
	}
	series := testkit.Series(t, reg, map[string]string{"sandbox": sb.ID, "vm": ct.Name, "vmid": strconv.Itoa(ct.VMID), "owner": sb.Owner})
	if series["pve_inspect_sandbox_vm_memory_bytes"] != float64(after.MemoryBytes) ||
		series[`pve_inspect_sandbox_vm_network_bytes_total{direction="from_guest"}`] != float64(after.NetBytesFromGuest) ||
		series["pve_inspect_sandbox_vm_agent_up"] != 1 {
		t.Errorf("container's series %v, want its health's figures %+v", series, after)
	}
}
