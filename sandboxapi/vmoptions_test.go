package sandboxapi

import (
	"strings"
	"testing"

	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// TestValidateVMOptions: a VM's firmware, cpu, os_type, controllers and
// agent as the create validator takes them: the profile's values (the defaults
// written out too) pass and are kept as given, anything else is refused
// naming the field and why.
func TestValidateVMOptions(t *testing.T) {
	for _, tc := range []struct {
		name   string
		vm     apitype.VMRequest
		env    map[string]string
		field  string // "" accepted
		detail string
	}{
		{"none", apitype.VMRequest{}, nil, "", ""},
		{"defaults written out", apitype.VMRequest{Firmware: "seabios", OSType: "l26", DiskController: "scsi", NICController: "virtio"}, nil, "", ""},
		{"uefi, host cpu, win11", apitype.VMRequest{Firmware: "uefi", CPU: "host", OSType: "win11"}, nil, "", ""},
		{"every generic model", apitype.VMRequest{CPU: "x86-64-v4"}, nil, "", ""},
		{"bios typo", apitype.VMRequest{Firmware: "ovmf"}, nil, "vms[0].firmware", `want "seabios"`},
		{"cpu with flags", apitype.VMRequest{CPU: "host,flags=+nested-virt"}, nil, "vms[0].cpu", "nested virtualization stays off"},
		{"custom cpu model", apitype.VMRequest{CPU: "custom-fast"}, nil, "vms[0].cpu", "want one of"},
		{"os_type other", apitype.VMRequest{OSType: "other"}, nil, "vms[0].os_type", "HPET on"},
		{"os_type wxp", apitype.VMRequest{OSType: "wxp"}, nil, "vms[0].os_type", "want one of l26, win10, win11"},
		{"ide", apitype.VMRequest{DiskController: "ide"}, nil, "", ""},
		{"sata", apitype.VMRequest{DiskController: "sata"}, nil, "vms[0].disk_controller", `want "scsi" or "ide"`},
		{"e1000 (the node's allow_e1000 is the engine's)", apitype.VMRequest{NICController: "e1000"}, nil, "", ""},
		{"rtl8139", apitype.VMRequest{NICController: "rtl8139"}, nil, "vms[0].nic_controller", `want "virtio" (default) or "e1000"`},
		{"no agent", apitype.VMRequest{Agent: new(bool)}, nil, "", ""},
		{"no agent, ide, e1000", apitype.VMRequest{Agent: new(bool), DiskController: "ide", NICController: "e1000"}, nil, "", ""},
		{"container with a cpu", apitype.VMRequest{Kind: apitype.KindLXC, CPU: "host"}, nil, "vms[0].cpu", "container"},
		{"container without an agent", apitype.VMRequest{Kind: apitype.KindLXC, Agent: new(bool)}, nil, "vms[0].agent", "no guest agent"},
		{"windows with env", apitype.VMRequest{OSType: "win10"}, map[string]string{"KEY": "v"}, "env", "runs Windows"},
		{"windows without an agent, with env", apitype.VMRequest{OSType: "win10", Agent: new(bool)}, map[string]string{"KEY": "v"}, "env", "every VM of this sandbox has agent false"},
		{"no agent with env", apitype.VMRequest{Agent: new(bool)}, map[string]string{"KEY": "v"}, "env", "every VM of this sandbox has agent false"},
		{"linux with env", apitype.VMRequest{OSType: "l26"}, map[string]string{"KEY": "v"}, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			vm := tc.vm
			vm.Template = "debian"
			c := apitype.CreateRequest{VMs: []apitype.VMRequest{vm}, Env: tc.env}
			pr := validateCreate(&c, 3600, 86400)
			if tc.field != "" {
				if pr == nil || pr.Field != tc.field || pr.Type != apitype.ProblemInvalidRequest || !strings.Contains(pr.Detail, tc.detail) {
					t.Fatalf("%+v, want invalid-request of field %s saying %q", pr, tc.field, tc.detail)
				}
				return
			}
			if pr != nil {
				t.Fatalf("refused: %+v", pr)
			}
			got := c.VMs[0]
			if got.Firmware != tc.vm.Firmware || got.CPU != tc.vm.CPU || got.OSType != tc.vm.OSType || got.DiskController != tc.vm.DiskController || got.NICController != tc.vm.NICController ||
				got.HasAgent() != tc.vm.HasAgent() {
				t.Fatalf("options changed: %+v", got)
			}
		})
	}
}

// TestValidateEnvWithAgentlessVMs: env goes to the VMs with a guest
// agent; one such VM is enough, none is refused.
func TestValidateEnvWithAgentlessVMs(t *testing.T) {
	c := apitype.CreateRequest{VMs: []apitype.VMRequest{{Name: "target", Template: "debian", Agent: new(bool)}, {Name: "attacker", Template: "debian"}},
		Env: map[string]string{"KEY": "v"}}
	if pr := validateCreate(&c, 3600, 86400); pr != nil {
		t.Fatalf("a sandbox with one VM with an agent refused env: %+v", pr)
	}
}
