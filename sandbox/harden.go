package sandbox

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/pve-inspect/pve-inspect/hardening"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// VMConfigs reads and changes VM configurations (the Proxmox client).
type VMConfigs interface {
	// VMConfig returns the current configuration, values as text.
	VMConfig(ctx context.Context, vmid int) (map[string]string, error)
	// UpdateVMConfig sets and deletes keys in one request.
	UpdateVMConfig(ctx context.Context, vmid int, set map[string]string, del []string) error
}

// checkTemplates refuses templates whose failing profile items a clone
// cannot fix, with a problem listing them, unless unhardened templates
// are allowed; the profile is the one VM i's options want (vms[i], the
// VM of template names[i], ids[i]). Whatever the setting, it refuses a
// disk_controller the template's disks are not on, and a template whose
// firmware the VM does not ask for (tolerated), an OVMF one for a VM that
// does not ask firmware "uefi", which checkVMOptionsAllowed refuses where
// [api] allow_uefi is off: its clones would boot OVMF, the SMM emulation
// and pflash device allow_uefi keeps out.
func (m *Engine) checkTemplates(ctx context.Context, names []string, ids []int, vms []templateVM) error {
	if m.o.VMConfigs == nil {
		return nil
	}
	var items []string
	type seenKey struct {
		id   int
		want hardening.Want
		disk string
	}
	seen := map[seenKey]bool{}
	confs := map[int]map[string]string{}
	for i, id := range ids {
		v := vms[i].Req
		want := profileWant(apitype.VM{Firmware: v.Firmware, CPU: v.CPU, OSType: v.OSType, NICController: v.NICController, Agent: v.Agent})
		k := seenKey{id, want, v.DiskController}
		if seen[k] {
			continue
		}
		seen[k] = true
		conf, ok := confs[id]
		if !ok {
			var err error
			if conf, err = m.o.VMConfigs.VMConfig(ctx, id); err != nil {
				return pxErr(fmt.Sprintf("read config of template %d", id), err)
			}
			confs[id] = conf
		}
		if why := diskControllerMismatch(conf, v.DiskController); why != "" {
			return invalid(fmt.Sprintf("vms[%d].disk_controller", vms[i].Index), "disk_controller %q: template %s (%d) cannot give it, as a clone keeps its template's disks: %s", v.DiskController, names[i], id, why)
		}
		for _, it := range hardening.CheckFor(conf, want).TemplateFailures() {
			if !m.o.AllowUnhardenedTemplates {
				items = append(items, fmt.Sprintf("template %s (%d): %s", names[i], id, it))
			} else if !tolerated(it) {
				return invalid(fmt.Sprintf("vms[%d].template", vms[i].Index), "template %s (%d) fails the profile item %s, which require_hardened_templates = false does not excuse: its clones would boot OVMF; ask firmware \"uefi\" where [api] allow_uefi is on, or rebuild the template with SeaBIOS", names[i], id, it)
			}
		}
	}
	if len(items) == 0 {
		return nil
	}
	return &NotHardenedError{Items: items, Msg: fmt.Sprintf("%d profile item(s) fail; run `pve-inspectd template harden VMID` as root on the node, or set [api] require_hardened_templates = false (which excuses template items, not an OVMF template's firmware): %s",
		len(items), strings.Join(items, "; "))}
}

// tolerated reports whether a failing item is one [api]
// require_hardened_templates = false lets a clone keep: a template-level
// item (FixTemplate). A clone's own items are always set, and the
// firmware (FixRebuild: an OVMF template for a VM that does not ask UEFI)
// is never excused, as it would bypass [api] allow_uefi.
func tolerated(it hardening.Item) bool { return it.Fix == hardening.FixTemplate }

// templateVM is a VM of a request (Req, at Index in its vms) whose
// template checkTemplates checks.
type templateVM struct {
	Index int
	Req   apitype.VMRequest
}

// hardenClone sets the profile items (as want has them) the pool-scoped
// token may set on a fresh clone and verifies them.
func (m *Engine) hardenClone(ctx context.Context, vmid int, want hardening.Want) error {
	if m.o.VMConfigs == nil {
		return nil
	}
	conf, err := m.o.VMConfigs.VMConfig(ctx, vmid)
	if err != nil {
		return pxErr(fmt.Sprintf("read config of vm %d", vmid), err)
	}
	set, del := hardening.CloneChangesFor(conf, want)
	if err := m.o.VMConfigs.UpdateVMConfig(ctx, vmid, set, del); err != nil {
		return pxErr(fmt.Sprintf("harden vm %d", vmid), err)
	}
	conf, err = m.o.VMConfigs.VMConfig(ctx, vmid)
	if err != nil {
		return pxErr(fmt.Sprintf("read config of vm %d", vmid), err)
	}
	var bad []string
	for _, it := range hardening.CheckFor(conf, want).Failed() {
		if !m.o.AllowUnhardenedTemplates || !tolerated(it) {
			bad = append(bad, it.String())
		}
	}
	if len(bad) > 0 {
		slices.Sort(bad)
		return fmt.Errorf("vm %d is not hardened after its changes: %s", vmid, strings.Join(bad, "; "))
	}
	return nil
}
