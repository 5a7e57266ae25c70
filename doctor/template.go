package doctor

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strings"

	"github.com/pve-inspect/pve-inspect/diskxfer"
	"github.com/pve-inspect/pve-inspect/hardening"
)

// TemplateChecks returns one check per configured template: a template,
// hardened (when creates require it), with disk hotplug and a SCSI
// controller that tells the guest of a hot-plugged disk (when the disk
// path is on); the guest agent off is a note (a template for VMs without
// an agent), not a failure.
func TemplateChecks(px API, n Node) []Check {
	names := make([]string, 0, len(n.Templates))
	for name := range n.Templates {
		names = append(names, name)
	}
	slices.Sort(names)
	var out []Check
	for _, name := range names {
		vmid := n.Templates[name]
		out = append(out, Check{Name: fmt.Sprintf("template %s (%d)", name, vmid), Run: func(ctx context.Context) Outcome {
			conf, err := vmConfig(ctx, px, n.Name, vmid)
			if err != nil {
				return failf(fmt.Sprintf("fix [api] templates (%s = %d), or grant the token VM.Audit on /vms/%d", name, vmid, vmid), "%v", err)
			}
			return templateOutcome(vmid, conf, n)
		}})
	}
	if len(out) == 0 {
		out = append(out, Check{Name: "templates", Run: func(context.Context) Outcome {
			return skipf("[api] templates is empty: creates look templates up by name")
		}})
	}
	return out
}

func templateOutcome(vmid int, conf map[string]string, n Node) Outcome {
	var bad, fixes []string
	if conf["template"] != "1" {
		bad = append(bad, "not a template")
		fixes = append(fixes, fmt.Sprintf("qm template %d", vmid))
	}
	if n.RequireHardened {
		if f := hardening.CheckTemplate(conf).TemplateFailures(); len(f) > 0 {
			var items []string
			for _, it := range f {
				items = append(items, it.Name)
			}
			bad = append(bad, fmt.Sprintf("not hardened (%s)", strings.Join(items, ", ")))
			fixes = append(fixes, fmt.Sprintf("pve-inspectd template harden %d (as root; `template check %d` lists the items)", vmid, vmid))
		}
	}
	if n.TransferStorage != "" && !hotplugs(conf["hotplug"], "disk") {
		bad = append(bad, fmt.Sprintf("hotplug %q lacks disk: a transfer disk is accepted by PUT /config but never appears in the guest", conf["hotplug"]))
		fixes = append(fixes, fmt.Sprintf("qm set %d --hotplug %s", vmid, withHotplug(conf["hotplug"], "disk")))
	}
	scsihw := conf["scsihw"]
	if scsihw == "" {
		scsihw = "lsi (the default)"
	}
	if n.TransferStorage != "" && !diskxfer.SCSIHotplug(conf["scsihw"]) {
		bad = append(bad, fmt.Sprintf("SCSI controller %s cannot hot-plug disks: Proxmox plugs a transfer disk and reports success, but the guest is never told and never sees it, so every disk transfer is refused", scsihw))
		fixes = append(fixes, fmt.Sprintf("qm set %d --scsihw virtio-scsi-single", vmid))
	}
	if len(bad) > 0 {
		return failf(strings.Join(fixes, "; "), "%s", strings.Join(bad, "; "))
	}
	agent := "agent on"
	if !agentOn(conf["agent"]) {
		// a template of an image without qemu-ga (a VulnHub OVA, an
		// appliance) is one for VMs created with agent false; a clone
		// with an agent gets agent enabled=1 whatever the template says
		// (the hardening), so only the image matters, which no config
		// shows
		agent = fmt.Sprintf("agent off (%q): for VMs created with agent false; a VM with an agent needs qemu-guest-agent in the image (qm set %d --agent enabled=1 once it has)", conf["agent"], vmid)
	}
	msg := fmt.Sprintf("template, hotplug %q, scsihw %s, %s", hotplugValue(conf["hotplug"]), scsihw, agent)
	if !diskxfer.SCSIHotplug(conf["scsihw"]) {
		msg += fmt.Sprintf("; note: scsihw %s cannot hot-plug disks, so before turning the disk path on: qm set %d --scsihw virtio-scsi-single", scsihw, vmid)
	}
	if conf["bios"] == "ovmf" {
		// a UEFI guest's template (an OVA whose OVF asks for EFI
		// firmware): the sandbox engine refuses it to a create that does
		// not ask firmware uefi
		msg += "; bios ovmf: only creates asking firmware \"uefi\" clone it, on a node with [api] allow_uefi = true"
	}
	if ci := cloudInitDrives(conf); len(ci) > 0 {
		// The hardening deletes every CD-ROM drive of a clone, a
		// cloud-init one too (VM.Config.Cloudinit and VM.Config.CDROM,
		// both in the role): the template's cloud-init settings never
		// reach a sandbox.
		msg += fmt.Sprintf("; cloud-init drive %s removed from every sandbox (its cloud-init settings do not apply there)", strings.Join(ci, ", "))
	}
	return passf("%s", msg)
}

// cloudInitDrives lists the drives of conf whose volume is a cloud-init
// image (qemu-server Drive.pm drive_is_cloudinit: the volume's name is
// "cloudinit" or "vm-N-cloudinit", a format suffix allowed).
func cloudInitDrives(conf map[string]string) []string {
	var out []string
	for k, v := range conf {
		file, _, _ := strings.Cut(v, ",")
		if reDiskKey.MatchString(k) && reCloudInit.MatchString(file) {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}

var reCloudInit = regexp.MustCompile(`[:/](?:vm-\d+-)?cloudinit(?:\.(?:raw|qcow2|vmdk))?$`)

// hotplugValue is the effective hotplug list: qemu-server's default
// (network,disk,usb) when absent, "1" the same, "0" none
// (PVE/QemuServer.pm pve-hotplug-features).
func hotplugValue(v string) string {
	switch v {
	case "", "1":
		return "network,disk,usb"
	case "0":
		return ""
	}
	return v
}

func hotplugs(v, feature string) bool {
	return slices.Contains(strings.Split(hotplugValue(v), ","), feature)
}

func withHotplug(v, feature string) string {
	cur := hotplugValue(v)
	if cur == "" {
		return feature
	}
	return cur + "," + feature
}

// agentOn reads qemu-server's agent property: "1", or "enabled=1,...", or
// "1,fstrim_cloned_disks=1".
func agentOn(v string) bool {
	for _, part := range strings.Split(v, ",") {
		k, val, ok := strings.Cut(part, "=")
		if !ok && (k == "1" || k == "true") {
			return true
		}
		if k == "enabled" && (val == "1" || val == "true") {
			return true
		}
	}
	return false
}
