package e2e_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/hardening"
	"github.com/pve-inspect/pve-inspect/pveapi"
	"github.com/pve-inspect/pve-inspect/pveapi/access"
	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// withHardening gives the API the Proxmox client for the hardened profile.
func withHardening(allowUnhardened bool) func(*options) {
	return func(o *options) {
		o.VMConfigs = o.Proxmox.(sandbox.VMConfigs)
		o.AllowUnhardenedTemplates = allowUnhardened
	}
}

// dirtyTemplate adds template 9001 "dirty" with root-only items (args, a
// PCI device) and clone-fixable ones (a CD-ROM, the USB tablet).
func dirtyTemplate(t *testing.T, e *emuEnv) {
	t.Helper()
	addGrantedTemplate(t, e, 9001, "dirty", map[string]string{
		"net0": "virtio=BC:24:11:00:00:02,bridge=vmbr0", "args": "-device pci-testdev", "hostpci0": "0000:01:00.0",
		"ide2": "none,media=cdrom", "tablet": "1", "cpu": "host",
	})
}

// addGrantedTemplate adds template vmid (name, config keys conf as
// pveemu.AddTemplate takes them) on a fresh disk, granted as
// pve-access-setup grants its templates (PVE_INSPECTD_TEMPLATES="9000
// vmid").
func addGrantedTemplate(t *testing.T, e *emuEnv, vmid int, name string, conf map[string]string) {
	t.Helper()
	disk := filepath.Join(t.TempDir(), "disk")
	if err := os.MkdirAll(filepath.Join(disk, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := e.emu.AddTemplate(context.Background(), vmid, name, disk, conf); err != nil {
		t.Fatal(err)
	}
	for _, who := range []string{access.User, access.TokenID("pve")} {
		if err := e.emu.SetACL(fmt.Sprintf("/vms/%d", vmid), who, access.RoleTemplate, false); err != nil {
			t.Fatal(err)
		}
	}
}

func TestHardenedProfileOnEmulator(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	e := newEmuEnvTB(t, withHardening(false))
	dirtyTemplate(t, e)

	// a plain template passes (its clones get the rest), and every clone
	// is in the whole profile
	sb, err := e.c.Create(ctx, apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian"}}})
	if err != nil {
		t.Fatal(err)
	}
	conf, err := e.px.VMConfig(ctx, sb.VMs[0].VMID)
	if err != nil {
		t.Fatal(err)
	}
	if f := hardening.Check(conf).Failed(); len(f) != 0 {
		t.Fatalf("clone %d not hardened: %v\n%v", sb.VMs[0].VMID, f, conf)
	}
	if conf["cpu"] != "x86-64-v2-AES,flags=-nested-virt" || conf["vga"] != "serial0" {
		t.Fatalf("clone config %v", conf)
	}

	// the dirty template is refused with a problem listing the items a
	// clone cannot fix; nothing is created
	before := len(e.fb.Running())
	_, err = e.c.Create(ctx, apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "dirty"}}})
	var p *apitype.Problem
	if !errors.As(err, &p) || p.Type != apitype.ProblemTemplateNotHardened || p.Status != 422 {
		t.Fatalf("create from dirty template: %v", err)
	}
	joined := strings.Join(p.Items, "\n")
	for _, want := range []string{"pci passthrough", "args and hookscript"} {
		if !strings.Contains(joined, want) {
			t.Errorf("problem items lack %q: %q", want, p.Items)
		}
	}
	if strings.Contains(joined, "cd-rom") || strings.Contains(joined, "usb tablet") {
		t.Errorf("problem lists items a clone fixes: %q", p.Items)
	}
	if after := len(e.fb.Running()); after != before {
		t.Errorf("a refused create started VMs: %d -> %d", before, after)
	}

	// the pool-scoped token cannot change a template at all (its role
	// there is VM.Clone and VM.Audit)...
	tokenErr := e.px.UpdateVMConfig(ctx, 9001, map[string]string{"tablet": "0"}, nil)
	if tokenErr == nil || !strings.Contains(tokenErr.Error(), "403 Permission check failed (/vms/9001, VM.Config.") {
		t.Fatalf("token changed the template: %v", tokenErr)
	}
	// ...and with the main role there too (a template put in the pool) it
	// still cannot take root-only items away
	for _, who := range []string{access.User, access.TokenID("pve")} {
		if err := e.emu.SetACL("/vms/9001", who, access.RoleMain, false); err != nil {
			t.Fatal(err)
		}
	}
	tokenErr = e.px.UpdateVMConfig(ctx, 9001, nil, []string{"args"})
	if tokenErr == nil || !strings.Contains(tokenErr.Error(), "only root can set 'args' config") {
		t.Fatalf("token deleted args: %v", tokenErr)
	}
	tokenErr = e.px.UpdateVMConfig(ctx, 9001, map[string]string{"cpu": "host,flags=-vmx"}, nil)
	if tokenErr == nil || !strings.Contains(tokenErr.Error(), "VM-specific CPU flags must be a subset of") {
		t.Fatalf("raw -vmx accepted in a VM config: %v", tokenErr)
	}

	// root@pam (a ticket, not a token) hardens the template; then creates
	// may clone it
	root, err := pveapi.NewWithPassword(pveapi.Options{URL: e.url, Node: "pve", HTTPClient: e.hc, TaskPoll: 20 * time.Millisecond}, "root@pam", emuRootPassword)
	if err != nil {
		t.Fatal(err)
	}
	tc, err := root.VMConfig(ctx, 9001)
	if err != nil {
		t.Fatal(err)
	}
	set, del := hardening.TemplateChanges(tc)
	if err := root.UpdateVMConfig(ctx, 9001, set, del); err != nil {
		t.Fatalf("root harden: %v", err)
	}
	tc, err = root.VMConfig(ctx, 9001)
	if err != nil {
		t.Fatal(err)
	}
	if f := hardening.Check(tc).Failed(); len(f) != 0 {
		t.Fatalf("template still fails: %v", f)
	}
	if _, err := e.c.Create(ctx, apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "dirty"}}}); err != nil {
		t.Fatalf("create from hardened template: %v", err)
	}
}

func TestUnhardenedTemplatesAllowed(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	e := newEmuEnvTB(t, withHardening(true))
	dirtyTemplate(t, e)
	sb, err := e.c.Create(ctx, apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "dirty"}}})
	if err != nil {
		t.Fatalf("require_hardened_templates = false: %v", err)
	}
	conf, err := e.px.VMConfig(ctx, sb.VMs[0].VMID)
	if err != nil {
		t.Fatal(err)
	}
	// the clone still gets every item the token may set
	for _, it := range hardening.Check(conf).Failed() {
		if it.Fix == hardening.FixClone {
			t.Errorf("clone item not set: %v", it)
		}
	}
}

// TestHardenedCreateNeedsShippedPrivileges: a hardened create with the
// shipped role succeeds; the same role without VM.Config.HWType (vga,
// serial0, machine...) or VM.Config.CDROM (deleting a CD-ROM) is refused
// by qemu-server's config checks, naming the privilege, and leaves
// nothing behind.
func TestHardenedCreateNeedsShippedPrivileges(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	e := newEmuEnvTB(t, withHardening(false))
	disk := filepath.Join(t.TempDir(), "disk")
	if err := os.MkdirAll(filepath.Join(disk, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := e.emu.AddTemplate(ctx, 9002, "cdrom", disk, map[string]string{
		"net0": "virtio=BC:24:11:00:00:03,bridge=vmbr0", "ide2": "none,media=cdrom", "cpu": "host",
	}); err != nil {
		t.Fatal(err)
	}
	for _, who := range []string{access.User, access.TokenID("pve")} {
		if err := e.emu.SetACL("/vms/9002", who, access.RoleTemplate, false); err != nil {
			t.Fatal(err)
		}
	}
	sb, err := e.c.Create(ctx, apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "cdrom"}}})
	if err != nil {
		t.Fatalf("hardened create with the shipped role: %v", err)
	}
	if err := e.c.Delete(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	e.assertClean(t, ctx)
	for _, drop := range []string{"VM.Config.HWType", "VM.Config.CDROM"} {
		t.Run("without "+drop, func(t *testing.T) {
			var privs []string
			for _, p := range access.RolePrivs(access.RoleMain) {
				if p != drop {
					privs = append(privs, p)
				}
			}
			if err := e.emu.AddRole(access.RoleMain, privs); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = e.emu.AddRole(access.RoleMain, access.RolePrivs(access.RoleMain)) })
			_, err := e.c.Create(ctx, apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "cdrom"}}})
			if err == nil || !strings.Contains(err.Error(), drop) {
				t.Fatalf("create without %s: %v", drop, err)
			}
			e.assertClean(t, ctx)
		})
	}
}

// TestHardenedCreateFromCloudInitTemplate: a template with a cloud-init
// drive (a media=cdrom drive whose volume is the VM's cloudinit image)
// clones into a sandbox without it: deleting it is qemu-server's
// check_drive_perms for a cloud-init drive, VM.Config.Cloudinit and
// VM.Config.CDROM, both in the shipped role; without VM.Config.Cloudinit
// the create is refused naming it and leaves nothing behind.
func TestHardenedCreateFromCloudInitTemplate(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	e := newEmuEnvTB(t, withHardening(false))
	disk := filepath.Join(t.TempDir(), "disk")
	if err := os.MkdirAll(filepath.Join(disk, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := e.emu.AddTemplate(ctx, 9003, "cloudinit", disk, map[string]string{
		"net0": "virtio=BC:24:11:00:00:04,bridge=vmbr0", "ide2": "local-lvm:vm-9003-cloudinit,media=cdrom",
		"ciuser": "admin", "ipconfig0": "ip=dhcp",
	}); err != nil {
		t.Fatal(err)
	}
	for _, who := range []string{access.User, access.TokenID("pve")} {
		if err := e.emu.SetACL("/vms/9003", who, access.RoleTemplate, false); err != nil {
			t.Fatal(err)
		}
	}
	sb, err := e.c.Create(ctx, apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "cloudinit"}}})
	if err != nil {
		t.Fatalf("hardened create from a cloud-init template with the shipped role: %v", err)
	}
	conf, err := e.px.VMConfig(ctx, sb.VMs[0].VMID)
	if err != nil {
		t.Fatal(err)
	}
	if v, ok := conf["ide2"]; ok {
		t.Errorf("the sandbox kept the template's cloud-init drive: ide2=%s", v)
	}
	if err := e.c.Delete(ctx, sb.ID); err != nil {
		t.Fatal(err)
	}
	e.assertClean(t, ctx)

	var privs []string
	for _, p := range access.RolePrivs(access.RoleMain) {
		if p != "VM.Config.Cloudinit" {
			privs = append(privs, p)
		}
	}
	if err := e.emu.AddRole(access.RoleMain, privs); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = e.emu.AddRole(access.RoleMain, access.RolePrivs(access.RoleMain)) }()
	if _, err := e.c.Create(ctx, apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "cloudinit"}}}); err == nil || !strings.Contains(err.Error(), "VM.Config.Cloudinit") {
		t.Fatalf("create without VM.Config.Cloudinit: %v", err)
	}
	e.assertClean(t, ctx)
}
