package e2e_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/hardening"
	"github.com/pve-inspect/pve-inspect/pveapi"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// withVMOptions allows UEFI and Windows guests on the node.
func withVMOptions(uefi, windows bool) func(*options) {
	return func(o *options) {
		o.AllowUEFI, o.AllowWindows = uefi, windows
	}
}

// TestVMOptionsOnEmulator creates VMs with every per-VM option through
// the API, with the daemon's pool-scoped token as pve-access-setup makes
// it, and reads the clones' configs back from the emulator.
func TestVMOptionsOnEmulator(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	e := newEmuEnvTB(t, withHardening(false), withVMOptions(true, true))

	sb, err := e.c.Create(ctx, apitype.CreateRequest{VMs: []apitype.VMRequest{
		{Name: "attacker", Template: "debian", Firmware: "uefi", CPU: "host", OSType: "l26", DiskController: "scsi", NICController: "virtio"},
		{Name: "target", Template: "debian", OSType: "win11", CPU: "x86-64-v3"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if sb.FromPool || sb.VMs[0].Firmware != "uefi" || sb.VMs[1].OSType != "win11" {
		t.Fatalf("sandbox %+v", sb)
	}
	a, err := e.px.VMConfig(ctx, sb.VMs[0].VMID)
	if err != nil {
		t.Fatal(err)
	}
	wantEFI := fmt.Sprintf("local-lvm:vm-%d-disk-1,efitype=4m,pre-enrolled-keys=0,size=4M", sb.VMs[0].VMID)
	for k, want := range map[string]string{"bios": "ovmf", "efidisk0": wantEFI, "cpu": "host,flags=-nested-virt", "ostype": "l26", "vga": "serial0"} {
		if a[k] != want {
			t.Errorf("attacker %s = %q, want %q", k, a[k], want)
		}
	}
	if f := hardening.CheckFor(a, hardening.Want{Firmware: "uefi", CPU: "host"}).Failed(); len(f) != 0 {
		t.Errorf("attacker not in the profile it asked for: %v", f)
	}
	w, err := e.px.VMConfig(ctx, sb.VMs[1].VMID)
	if err != nil {
		t.Fatal(err)
	}
	// a Windows VM's machine is pinned, to the profile's minimum (the
	// template's q35 is unpinned)
	if w["ostype"] != "win11" || w["machine"] != hardening.MinMachine || w["cpu"] != "x86-64-v3,flags=-nested-virt" || w["bios"] != "" || w["efidisk0"] != "" {
		t.Errorf("target config %v", w)
	}

	// no Windows guest client in this env (sandbox.Options.WinGuests):
	// its guest I/O is refused before any guest call, and the containment
	// check from it in any case
	_, err = e.c.Exec(ctx, sb.ID, "target", apitype.ExecRequest{Argv: []string{"cmd.exe", "/c", "ver"}})
	var p *apitype.Problem
	if !errors.As(err, &p) || p.Status != 409 || !strings.Contains(p.Detail, "runs Windows (os_type win11)") {
		t.Fatalf("exec on the Windows VM: %v", err)
	}
	_, err = e.c.ReadFile(ctx, sb.ID, "target", "/etc/hosts", io.Discard)
	if !errors.As(err, &p) || p.Status != 409 {
		t.Fatalf("read a file of the Windows VM: %v", err)
	}
	_, err = e.c.Check(ctx, sb.ID, "target")
	if !errors.As(err, &p) || p.Status != 409 || !strings.Contains(p.Detail, "runs Windows") {
		t.Fatalf("containment check from the Windows VM: %v", err)
	}

	// a template whose disks are not on virtio-scsi cannot give scsi
	root, err := pveapi.NewWithPassword(pveapi.Options{URL: e.url, Node: "pve", HTTPClient: e.hc, TaskPoll: 20 * time.Millisecond}, "root@pam", emuRootPassword)
	if err != nil {
		t.Fatal(err)
	}
	if err := root.UpdateVMConfig(ctx, 9000, map[string]string{"scsihw": "lsi"}, nil); err != nil {
		t.Fatal(err)
	}
	_, err = e.c.Create(ctx, apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian", DiskController: "scsi"}}})
	if !errors.As(err, &p) || p.Status != 400 || p.Field != "vms[0].disk_controller" || !strings.Contains(p.Detail, "not virtio-scsi") {
		t.Fatalf("disk_controller on an lsi template: %v", err)
	}
}

// TestVMOptionsRefusedByNode: a node that does not allow UEFI, Windows or
// e1000 refuses them with the field and the setting named, creating
// nothing.
func TestVMOptionsRefusedByNode(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	e := newEmuEnvTB(t, withHardening(false))
	for _, tc := range []struct {
		vm            apitype.VMRequest
		field, detail string
	}{
		{apitype.VMRequest{Template: "debian", Firmware: "uefi"}, "vms[0].firmware", "[api] allow_uefi = true"},
		{apitype.VMRequest{Template: "debian", OSType: "win10"}, "vms[0].os_type", "[api] allow_windows = true"},
		{apitype.VMRequest{Template: "debian", NICController: "e1000"}, "vms[0].nic_controller", "[api] allow_e1000 = true"},
	} {
		_, err := e.c.Create(ctx, apitype.CreateRequest{VMs: []apitype.VMRequest{tc.vm}})
		var p *apitype.Problem
		if !errors.As(err, &p) || p.Status != 400 || p.Field != tc.field || !strings.Contains(p.Detail, tc.detail) {
			t.Errorf("%+v: %v", tc.vm, err)
		}
		// the validate call (the provider's task_init) lists the same
		rep, err := e.c.Validate(ctx, apitype.CreateRequest{VMs: []apitype.VMRequest{tc.vm}})
		if err != nil || rep.Valid || len(rep.Problems) != 1 || rep.Problems[0].Field != tc.field {
			t.Errorf("validate %+v: %+v, %v", tc.vm, rep, err)
		}
	}
	if n := len(e.fb.Running()); n != 0 {
		t.Errorf("%d VMs running after refusals", n)
	}
}
