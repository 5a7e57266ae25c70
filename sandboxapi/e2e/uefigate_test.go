package e2e_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/pveapi"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// TestAllowUEFIGatesOVMFTemplates: [api] allow_uefi
// ("Both off unless allowed here", packaging/deb/config.toml) gates only
// a request's firmware "uefi", and an OVMF template's clone would boot
// OVMF all the same: on q35 the SMM build (OVMF.pm get_ovmf_files) and a
// pflash vars device, the host-side code allow_uefi exists to keep out.
// On a node with require_hardened_templates = false and allow_uefi =
// false, a create that asks for nothing from a template with bios ovmf is
// refused (before review 48a the firmware item was among the ones
// unhardened templates are excused).
func TestAllowUEFIGatesOVMFTemplates(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	e := newEmuEnvTB(t, withHardening(true)) // allow_uefi, allow_windows off
	root, err := pveapi.NewWithPassword(pveapi.Options{URL: e.url, Node: "pve", HTTPClient: e.hc, TaskPoll: 20 * time.Millisecond}, "root@pam", emuRootPassword)
	if err != nil {
		t.Fatal(err)
	}
	if err := root.UpdateVMConfig(ctx, 9000, map[string]string{"bios": "ovmf"}, nil); err != nil {
		t.Fatal(err)
	}
	sb, err := e.c.Create(ctx, apitype.CreateRequest{VMs: []apitype.VMRequest{{Name: "vm", Template: "debian"}}})
	if err != nil {
		if !strings.Contains(err.Error(), "OVMF") {
			t.Fatalf("refused, but not for the OVMF template: %v", err)
		}
		return // refused: allow_uefi holds
	}
	conf, err := e.px.VMConfig(ctx, sb.VMs[0].VMID)
	if err != nil {
		t.Fatal(err)
	}
	if conf["bios"] == "ovmf" {
		t.Errorf("allow_uefi is off, yet the clone of an OVMF template boots OVMF: bios=%s efidisk0=%q", conf["bios"], conf["efidisk0"])
	}
}
