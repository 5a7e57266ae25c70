package sandbox

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"github.com/pve-inspect/pve-inspect/hardening"
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
// are allowed.
func (m *Engine) checkTemplates(ctx context.Context, names []string, ids []int) error {
	if m.o.VMConfigs == nil || m.o.AllowUnhardenedTemplates {
		return nil
	}
	var items []string
	seen := map[int]bool{}
	for i, id := range ids {
		if seen[id] {
			continue
		}
		seen[id] = true
		conf, err := m.o.VMConfigs.VMConfig(ctx, id)
		if err != nil {
			return pxErr(fmt.Sprintf("read config of template %d", id), err)
		}
		for _, it := range hardening.Check(conf).TemplateFailures() {
			items = append(items, fmt.Sprintf("template %s (%d): %s", names[i], id, it))
		}
	}
	if len(items) == 0 {
		return nil
	}
	return &NotHardenedError{Items: items, Msg: fmt.Sprintf("%d profile item(s) fail; run `pve-inspectd template harden VMID` as root on the node, or set [api] require_hardened_templates = false: %s",
		len(items), strings.Join(items, "; "))}
}

// hardenClone sets the profile items the pool-scoped token may set on a
// fresh clone and verifies them.
func (m *Engine) hardenClone(ctx context.Context, vmid int) error {
	if m.o.VMConfigs == nil {
		return nil
	}
	conf, err := m.o.VMConfigs.VMConfig(ctx, vmid)
	if err != nil {
		return pxErr(fmt.Sprintf("read config of vm %d", vmid), err)
	}
	set, del := hardening.CloneChanges(conf)
	if err := m.o.VMConfigs.UpdateVMConfig(ctx, vmid, set, del); err != nil {
		return pxErr(fmt.Sprintf("harden vm %d", vmid), err)
	}
	conf, err = m.o.VMConfigs.VMConfig(ctx, vmid)
	if err != nil {
		return pxErr(fmt.Sprintf("read config of vm %d", vmid), err)
	}
	var bad []string
	for _, it := range hardening.Check(conf).Failed() {
		if it.Fix == hardening.FixClone || !m.o.AllowUnhardenedTemplates {
			bad = append(bad, it.String())
		}
	}
	if len(bad) > 0 {
		slices.Sort(bad)
		return fmt.Errorf("vm %d is not hardened after its changes: %s", vmid, strings.Join(bad, "; "))
	}
	return nil
}
