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

	"github.com/pve-inspect/pve-inspect/ctguest"
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
// cgroups swept at a delete (ctguest), as the daemon wires them; mod,
// when set, changes the options further.
func newContainerBed(t *testing.T, ctx context.Context, mod func(*options)) *bedEnv {
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
		if mod != nil {
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
	e := newContainerBed(t, ctx, nil)
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
