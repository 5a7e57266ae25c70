package e2e_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/doctor"
	"github.com/pve-inspect/pve-inspect/pveapi/access"
	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// TestEmulatorAccessTableCoversCalls: every request the daemon's client
// makes with its token (a warm pool's member claimed and renamed, a cold
// two-VM create with a bigger disk and a fixed address, snapshot,
// rollback, the disk path's volume calls, delete, the doctor's checks) is
// a call of the access table, and every privilege the emulator checked for them is one the
// table lists on a matching ACL path; the table without its PUT config
// entry misses the claim's rename.
func TestEmulatorAccessTableCoversCalls(t *testing.T) {
	e := newEmuEnvWith(t, emuSetup{recordPerms: true, opts: []func(*options){func(o *options) {
		o.WarmPool = []sandbox.PoolShape{{Name: "open", Template: "debian", Target: 1}}
	}}})
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	e.srv.Engine().MaintainPool(ctx)
	warm, err := e.c.Create(ctx, apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian"}}})
	if err != nil {
		t.Fatal(err)
	}
	if !warm.FromPool {
		t.Error("the plain create was not claimed from the warm pool (no rename through PUT config)")
	}
	sb, err := e.c.Create(ctx, apitype.CreateRequest{Networks: []apitype.NetworkRequest{{Name: "lan", CIDR: "10.78.0.0/24"}},
		VMs: []apitype.VMRequest{{Template: "debian", NICs: []apitype.NIC{{Network: "lan", IPv4: "10.78.0.5"}}}, {Template: "debian", DiskGiB: 20, Cores: 2}}})
	if err != nil {
		t.Fatal(err)
	}
	if err := e.c.Snapshot(ctx, sb.ID, "vm1", "clean"); err != nil {
		t.Fatal(err)
	}
	if err := e.c.Rollback(ctx, sb.ID, "vm1", "clean"); err != nil {
		t.Fatal(err)
	}
	// The disk path's Proxmox calls (the transfer itself needs the bed).
	vmid := sb.VMs[0].VMID
	volid, err := e.px.AllocVolume(ctx, access.TransferStorage, vmid, fmt.Sprintf("vm-%d-pvei-table.raw", vmid), 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := e.px.VolumePath(ctx, volid); err != nil {
		t.Fatal(err)
	}
	if _, err := e.px.ImageVolumes(ctx, access.TransferStorage); err != nil {
		t.Fatal(err)
	}
	if _, _, err := e.px.DiskConfig(ctx, vmid); err != nil {
		t.Fatal(err)
	}
	if err := e.px.FreeVolume(ctx, volid); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{warm.ID, sb.ID} {
		if err := e.c.Delete(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	n := doctor.Node{Name: "pve", Pool: access.DefaultPool, TokenID: e.tokenID, Templates: map[string]int{"debian": 9000},
		TransferStorage: access.TransferStorage, MinMajor: 9}
	checks := []doctor.Check{doctor.VersionCheck(e.px, n), doctor.NodeCheck(e.px, n), doctor.NetworkCheck(e.px, n),
		doctor.PrivilegeCheck(e.px, n, access.Calls()), doctor.ScopeCheck(e.px, n, access.Calls()), doctor.StorageCheck(e.px, n),
		doctor.SDNCheck(e.px, func() (string, error) { return "/usr/sbin/dnsmasq", nil }), doctor.IPAMCheck(e.px)}
	checks = append(checks, doctor.TemplateChecks(e.px, n)...)
	for _, r := range doctor.Run(ctx, checks).Checks {
		if r.Status == doctor.Fail {
			t.Errorf("doctor %s: %s (%s)", r.Name, r.Detail, r.Fix)
		}
	}

	if gaps := e.emu.AccessTableGaps(access.Calls(), e.tokenID); len(gaps) > 0 {
		t.Errorf("the access table (pveapi/access Calls) misses what the client did:\n%s", strings.Join(gaps, "\n"))
	}
	// The check can fail: the table without the rename's entry.
	less := slices.DeleteFunc(access.Calls(), func(c access.Call) bool { return c.Method == "PUT" && c.Path == "/nodes/{node}/qemu/{vmid}/config" })
	if gaps := e.emu.AccessTableGaps(less, e.tokenID); !slices.Contains(gaps, "request PUT /nodes/{node}/qemu/{vmid}/config") {
		t.Errorf("a table without PUT config: gaps %v", gaps)
	}
	// ... and a table whose clone lacks the template's bridge.
	less = slices.DeleteFunc(access.Calls(), func(c access.Call) bool { return strings.Contains(c.ACLPath, access.PhBridge) })
	if gaps := e.emu.AccessTableGaps(less, e.tokenID); !slices.Contains(gaps, "check SDN.Use on "+access.LocalZonePath+"/vmbr0") {
		t.Errorf("a table without the template's bridge: gaps %v", gaps)
	}
}
