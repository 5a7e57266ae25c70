package sandbox_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// templateConfigs is a VMConfigs with the templates' configurations only.
type templateConfigs map[int]map[string]string

func (c templateConfigs) VMConfig(_ context.Context, vmid int) (map[string]string, error) {
	if conf, ok := c[vmid]; ok {
		return conf, nil
	}
	return nil, sandbox.ErrNotFound
}

func (templateConfigs) UpdateVMConfig(context.Context, int, map[string]string, []string) error {
	return errors.New("not in this test")
}

// TestDiskControllerNamesTheRequestsVM: a disk_controller the template
// cannot give is refused naming the VM by its index in the request (a
// container before it counted), in a create and in a validate, and
// nothing is made.
func TestDiskControllerNamesTheRequestsVM(t *testing.T) {
	ctx := context.Background()
	b := newCTBench(t, ctConf)
	b.o.AllowUnhardenedTemplates = true
	b.o.VMConfigs = templateConfigs{9000: {"scsi0": "local-lvm:base-9000-disk-0,size=8G", "ide1": "local-lvm:base-9000-disk-1,size=1G", "scsihw": "virtio-scsi-single"}}
	e := b.engine(t)
	req := apitype.CreateRequest{Networks: []apitype.NetworkRequest{{Name: "net0", CIDR: "auto"}}, VMs: []apitype.VMRequest{
		{Name: "ct", Kind: apitype.KindLXC, Template: "ct-debian", Cores: 1, MemoryMiB: 256, Networks: []string{"net0"}},
		{Name: "vm", Template: "debian", Cores: 1, MemoryMiB: 512, Networks: []string{"net0"}, DiskController: "scsi"},
	}, TTLSeconds: 60}
	_, err := e.Create(ctx, req)
	var inv *sandbox.InvalidError
	if !errors.As(err, &inv) || inv.Field != "vms[1].disk_controller" || !strings.Contains(inv.Msg, "its disks are on ide, scsi") {
		t.Fatalf("create: %v", err)
	}
	for id, v := range b.p.VMs {
		if !v.Info.Template {
			t.Errorf("vm %d made by a refused create", id)
		}
	}
	refusals, _, err := e.Validate(ctx, req)
	if err != nil || len(refusals) != 1 || !errors.As(refusals[0], &inv) || inv.Field != "vms[1].disk_controller" {
		t.Fatalf("validate: %v, %v", refusals, err)
	}
}

// TestWindowsVMNotNamed: a Windows VM of a sandbox is not named in its
// guest (the naming is POSIX sh), its Linux sibling is and resolves it by
// name, and an engine without a Windows guest client refuses guest I/O
// to it; the containment check is refused from it in any case.
func TestWindowsVMNotNamed(t *testing.T) {
	ctx := context.Background()
	b := newCTBench(t, ctConf)
	b.o.AllowWindows = true
	e := b.engine(t)
	req := oneVM("debian")
	req.VMs[0].Name = "attacker"
	req.VMs = append(req.VMs, apitype.VMRequest{Name: "target", Template: "debian", Cores: 1, MemoryMiB: 512, Networks: []string{"net0"}, OSType: "win10"})
	sb, err := e.Create(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	if h := b.g.Hostname(sb.VMs[0].VMID); h != "attacker" {
		t.Errorf("the Linux VM's hostname %q", h)
	}
	if h := b.g.Hostname(sb.VMs[1].VMID); h != "" {
		t.Errorf("the Windows VM was named %q in its guest", h)
	}
	if hosts, _ := b.g.File(sb.VMs[0].VMID, "/etc/hosts"); !strings.Contains(string(hosts), "\ttarget\n") {
		t.Errorf("the Linux VM's /etc/hosts lacks the Windows VM:\n%s", hosts)
	}
	if _, ok := b.g.File(sb.VMs[1].VMID, "/etc/hosts"); ok {
		t.Error("a file was written into the Windows VM")
	}
	// no Windows guest client configured: no guest I/O to it
	if err := e.GuestIO(sb.VMs[1]); !errors.Is(err, sandbox.ErrConflict) {
		t.Errorf("guest I/O to the Windows VM: %v", err)
	}
	if err := e.GuestIO(sb.VMs[0]); err != nil {
		t.Errorf("guest I/O to the Linux VM: %v", err)
	}
	if err := sandbox.CheckIO(sb.VMs[1]); !errors.Is(err, sandbox.ErrConflict) {
		t.Errorf("containment check from the Windows VM: %v", err)
	}
	if err := sandbox.CheckIO(sb.VMs[0]); err != nil {
		t.Errorf("containment check from the Linux VM: %v", err)
	}
}

// TestUnhardenedToleranceSparesFirmware: with unhardened templates
// allowed, a template whose controller `template harden` would change
// (scsi0 on lsi) is cloned, but an OVMF template for a VM that does not
// ask firmware "uefi" is refused naming the VM's template: tolerating it
// would boot OVMF where [api] allow_uefi is off.
func TestUnhardenedToleranceSparesFirmware(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name    string
		conf    map[string]string
		refused bool
	}{
		{"emulated scsi controller", map[string]string{"scsi0": "local-lvm:base-9000-disk-0,size=8G", "scsihw": "lsi"}, false},
		{"ovmf", map[string]string{"scsi0": "local-lvm:base-9000-disk-0,size=8G", "scsihw": "virtio-scsi-single", "bios": "ovmf"}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b := newCTBench(t, ctConf)
			b.o.AllowUnhardenedTemplates = true
			b.o.VMConfigs = templateConfigs{9000: tc.conf}
			e := b.engine(t)
			refusals, _, err := e.Validate(ctx, oneVM("debian"))
			if err != nil {
				t.Fatal(err)
			}
			var inv *sandbox.InvalidError
			if !tc.refused {
				if len(refusals) != 0 {
					t.Fatalf("refused: %v", refusals)
				}
				return
			}
			if len(refusals) != 1 || !errors.As(refusals[0], &inv) || inv.Field != "vms[0].template" || !strings.Contains(inv.Msg, "OVMF") {
				t.Fatalf("refusals %v, want vms[0].template refused for OVMF", refusals)
			}
		})
	}
}
