package hardening

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// Fixer says who can bring an item into the profile.
type Fixer string

// Who fixes an item.
const (
	// FixClone: the daemon's pool-scoped token sets it on every clone.
	FixClone Fixer = "clone"
	// FixTemplate: `pve-inspectd template harden` sets it on the template
	// once, as root@pam: the key needs root, or changing it changes what
	// the guest boots on (its disk controller), which the operator checks
	// once on the template rather than the daemon on every clone.
	FixTemplate Fixer = "template"
	// FixRebuild: neither can; the template must be rebuilt (firmware).
	FixRebuild Fixer = "rebuild"
)

// Item is one profile item as found in a configuration.
type Item struct {
	Name string `json:"name"`
	Want string `json:"want"`
	// Got is what the configuration has ("" when absent).
	Got string `json:"got"`
	OK  bool   `json:"ok"`
	// Fix says who fixes a failing item.
	Fix Fixer `json:"fix"`
	// Keys are the present config keys an item wants absent.
	Keys []string `json:"keys,omitempty"`
}

func (i Item) String() string {
	if i.OK {
		return fmt.Sprintf("%s: ok (%s)", i.Name, i.Want)
	}
	return fmt.Sprintf("%s: want %s, got %s (fix: %s)", i.Name, i.Want, orNone(i.Got), i.Fix)
}

func orNone(s string) string {
	if s == "" {
		return "(absent)"
	}
	return s
}

// Report is the check of one configuration.
type Report struct {
	Items []Item `json:"items"`
	// UEFI is set by CheckTemplate for a template with bios ovmf: it was
	// checked as the creates that may clone it want it, firmware uefi
	// (others refuse it).
	UEFI bool `json:"uefi,omitempty"`
}

// OK reports whether every item passes.
func (r Report) OK() bool { return len(r.Failed()) == 0 }

// Failed lists the failing items.
func (r Report) Failed() []Item {
	var out []Item
	for _, i := range r.Items {
		if !i.OK {
			out = append(out, i)
		}
	}
	return out
}

// TemplateFailures lists the failing items a clone cannot fix: a template
// with none is hardened (its clones get the rest from CloneChanges).
func (r Report) TemplateFailures() []Item {
	var out []Item
	for _, i := range r.Failed() {
		if i.Fix != FixClone {
			out = append(out, i)
		}
	}
	return out
}

var (
	reSerial   = regexp.MustCompile(`^serial[0-3]$`)
	reParallel = regexp.MustCompile(`^parallel[0-2]$`)
	reUSB      = regexp.MustCompile(`^usb[0-9]+$`)
	reHostPCI  = regexp.MustCompile(`^hostpci[0-9]+$`)
	reVirtioFS = regexp.MustCompile(`^virtiofs[0-9]+$`)
	reDrive    = regexp.MustCompile(`^(ide|sata|scsi|virtio)[0-9]+$`)
	reMachine  = regexp.MustCompile(`^(?:pc-)?q35(?:-(\d+)\.(\d+))?(?:\+pve\d+)?$`)
	reSCSI     = regexp.MustCompile(`^scsi[0-9]+$`)
	reSCSIHW   = regexp.MustCompile(`^virtio-scsi-(?:pci|single)$`)
	reNet      = regexp.MustCompile(`^net[0-9]+$`)
	reNICModel = regexp.MustCompile(`^[a-z][a-z0-9_-]*$`)
)

// SCSIHW is the SCSI controller `template harden` sets on a template with
// scsiN disks on an emulated one (the one bed and built templates have).
const SCSIHW = "virtio-scsi-single"

// MinMachine is the q35 machine version the profile takes at least
// (Linux guests get HPET off from it on), and the one the daemon pins a
// Windows VM to (WindowsMachine).
const MinMachine = "pc-q35-10.1"

// keysMatching returns the sorted keys of conf that match re.
func keysMatching(conf map[string]string, re *regexp.Regexp) []string {
	var out []string
	for k := range conf {
		if re.MatchString(k) {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}

// cdroms are the drives with media=cdrom (and the legacy cdrom key).
func cdroms(conf map[string]string) []string {
	var out []string
	for _, k := range keysMatching(conf, reDrive) {
		if slices.Contains(strings.Split(conf[k], ","), "media=cdrom") {
			out = append(out, k)
		}
	}
	if _, ok := conf["cdrom"]; ok {
		out = append(out, "cdrom")
	}
	return out
}

// absent is an item that wants no key of keys present.
func absent(name string, conf map[string]string, keys []string, fix Fixer) Item {
	var got []string
	for _, k := range keys {
		got = append(got, k+"="+conf[k])
	}
	return Item{Name: name, Want: "none", Got: strings.Join(got, " "), OK: len(keys) == 0, Fix: fix, Keys: keys}
}

func equal(name, key, want string, conf map[string]string, fix Fixer) Item {
	return Item{Name: name, Want: key + "=" + want, Got: kv(conf, key), OK: conf[key] == want, Fix: fix}
}

func kv(conf map[string]string, key string) string {
	if v, ok := conf[key]; ok {
		return key + "=" + v
	}
	return ""
}

// Check compares a VM configuration (key -> value, as the Proxmox API
// returns it) with the profile for a Linux guest on SeaBIOS of the
// template's CPU model (CheckFor with the zero Want).
func Check(conf map[string]string) Report { return CheckFor(conf, Want{}) }

// CheckTemplate checks a template's configuration as the creates that
// may clone it want it: a template with bios ovmf (a UEFI guest: an OVA
// whose OVF asks for EFI firmware, imported without boot) is one only a
// create asking firmware uefi may clone (sandbox checkTemplates refuses
// it to the others, and the node takes uefi only with [api] allow_uefi),
// so it is checked for that firmware (Report.UEFI); any other for the
// default, SeaBIOS (Check). A build's template, `template check` and the
// doctor judge templates by it.
func CheckTemplate(conf map[string]string) Report {
	if conf["bios"] != "ovmf" {
		return Check(conf)
	}
	r := CheckFor(conf, Want{Firmware: FirmwareUEFI})
	r.UEFI = true
	return r
}

// CheckFor compares a VM configuration with the profile as a create's
// per-VM options want it (options.go): the OS type, firmware and CPU
// model items follow want; every other item is the same for all.
func CheckFor(conf map[string]string, want Want) Report {
	var r Report
	add := func(i Item) { r.Items = append(r.Items, i) }
	add(equal("display", "vga", "serial0", conf, FixClone))
	add(equal("serial console", "serial0", "socket", conf, FixClone))
	var serials, devSerials []string
	for _, k := range keysMatching(conf, reSerial) {
		if k == "serial0" && conf[k] == "socket" {
			continue
		}
		if conf[k] == "socket" {
			serials = append(serials, k)
		} else {
			devSerials = append(devSerials, k)
		}
	}
	add(absent("other serial ports", conf, serials, FixClone))
	add(absent("host serial and parallel devices", conf, append(devSerials, keysMatching(conf, reParallel)...), FixTemplate))
	var spice, hostUSB []string
	for _, k := range keysMatching(conf, reUSB) {
		if conf[k] == "spice" || strings.HasPrefix(conf[k], "host=spice") {
			spice = append(spice, k)
		} else {
			hostUSB = append(hostUSB, k)
		}
	}
	add(absent("usb", conf, spice, FixClone))
	add(absent("usb host devices", conf, hostUSB, FixTemplate))
	add(equal("usb tablet", "tablet", "0", conf, FixClone))
	add(equal("balloon", "balloon", "0", conf, FixClone))
	add(absent("cd-rom", conf, cdroms(conf), FixClone))
	add(absent("audio", conf, keysIn(conf, "audio0"), FixClone))
	add(absent("tpm", conf, keysIn(conf, "tpmstate0"), FixClone))
	add(absent("watchdog", conf, keysIn(conf, "watchdog"), FixClone))
	add(absent("pci passthrough", conf, keysMatching(conf, reHostPCI), FixTemplate))
	add(absent("host-shared folders", conf, append(keysMatching(conf, reVirtioFS), keysIn(conf, "ivshmem")...), FixTemplate))
	var rootOnly []string
	for _, k := range keysIn(conf, "args", "hookscript") {
		if k == "args" && PanicDeviceArgs(conf[k]) {
			continue // the one args the profile takes: a panic device
		}
		rootOnly = append(rootOnly, k)
	}
	add(absent("args and hookscript (but a panic device)", conf, rootOnly, FixTemplate))
	add(scsiItem(conf))
	add(Item{Name: itemKVM, Want: "kvm absent or 1", Got: kv(conf, "kvm"), OK: conf["kvm"] == "" || conf["kvm"] == "1", Fix: FixClone, Keys: keysIn(conf, "kvm")})
	add(Item{Name: "nested virtualization", Want: "cpu flags -nested-virt", Got: kv(conf, "cpu"), OK: nestedOff(conf["cpu"]), Fix: FixClone})
	add(Item{Name: itemHVFlags, Want: "no +hv-* cpu flags", Got: kv(conf, "cpu"), OK: !hasHVFlag(conf["cpu"]), Fix: FixClone})
	add(machineItem(conf, want))
	if want.CPU != "" {
		typ, _, _ := cpuParts(conf["cpu"])
		add(Item{Name: itemCPUModel, Want: "cpu " + want.CPU, Got: kv(conf, "cpu"), OK: typ == want.CPU, Fix: FixClone})
	}
	add(equal(osItem(want.osType()), "ostype", want.osType(), conf, FixClone))
	add(firmwareItem(conf, want))
	add(nicItem(conf, want))
	add(agentItem(conf, want))
	return r
}

// Names of the agent items: with the agent (the sandbox's I/O channel)
// and without it (a create's agent false).
const (
	itemAgent   = "guest agent (the I/O channel)"
	itemNoAgent = "no guest agent device (agent false)"
)

// agentItem is the guest agent item: agent enabled=1, the one device the
// profile adds (the daemon's channel into the guest), or, for a VM
// without an agent (want.NoAgent), the agent off: no virtio-serial port
// the guest reaches and no qga socket on the node.
func agentItem(conf map[string]string, want Want) Item {
	if want.NoAgent {
		var keys []string
		if agentOn(conf["agent"]) {
			keys = []string{"agent"}
		}
		return Item{Name: itemNoAgent, Want: "agent absent or enabled=0", Got: kv(conf, "agent"), OK: !agentOn(conf["agent"]), Fix: FixClone, Keys: keys}
	}
	return Item{Name: itemAgent, Want: "agent enabled=1", Got: kv(conf, "agent"), OK: agentOn(conf["agent"]), Fix: FixClone}
}

// nicItem is the NIC model item: every netN of the model want asks
// (virtio unless e1000). The configure step writes each NIC with it, so
// no clone change is listed for it; a template's own NICs are replaced
// on every clone.
func nicItem(conf map[string]string, want Want) Item {
	var bad []string
	for _, k := range keysMatching(conf, reNet) {
		if m := nicModel(conf[k]); m != want.nic() {
			bad = append(bad, k+"="+orNone(m))
		}
	}
	return Item{Name: itemNICModel, Want: "every netN " + want.nic(), Got: strings.Join(bad, " "), OK: len(bad) == 0, Fix: FixClone}
}

// nicModel is the model of a netN value: its first property's key when
// that is a model with or without a MAC ("virtio=BC:24:..." or
// "e1000"), or its model property ("" when it has neither).
func nicModel(v string) string {
	for i, p := range strings.Split(v, ",") {
		k, _, ok := strings.Cut(p, "=")
		switch {
		case k == "model" && ok:
			_, m, _ := strings.Cut(p, "=")
			return m
		case i == 0 && k != "macaddr" && k != "bridge" && reNICModel.MatchString(k):
			return k
		}
	}
	return ""
}

// PanicDeviceArgs reports whether a template's args add nothing but a
// pvpanic device (`-device pvpanic` or `-device pvpanic-pci`): qemu-server
// has no option for one, so root adds it as args once on the template. With
// it a guest kernel's panic reaches QEMU, and the VM's QMP status turns
// guest-panicked (or, for a panic action of shutdown, the VM stops): the
// daemon's health sees a panic from the host side. Any other args (extra
// devices, -machine, -object, chardevs) are refused.
func PanicDeviceArgs(args string) bool {
	f := strings.Fields(args)
	return len(f) == 2 && f[0] == "-device" && (f[1] == "pvpanic" || f[1] == "pvpanic-pci")
}

func keysIn(conf map[string]string, keys ...string) []string {
	var out []string
	for _, k := range keys {
		if _, ok := conf[k]; ok {
			out = append(out, k)
		}
	}
	return out
}

// cpuParts splits a cpu value into its type and its other properties.
func cpuParts(v string) (typ string, flags []string, rest []string) {
	for _, p := range strings.Split(v, ",") {
		switch k, val, ok := strings.Cut(p, "="); {
		case !ok && typ == "" && p != "":
			typ = p
		case k == "cputype":
			typ = val
		case k == "flags":
			flags = strings.Split(val, ";")
		case p != "":
			rest = append(rest, p)
		}
	}
	return typ, flags, rest
}

// hasHVFlag reports whether a cpu value turns a Hyper-V flag on.
func hasHVFlag(cpu string) bool {
	_, flags, _ := cpuParts(cpu)
	return slices.ContainsFunc(flags, func(f string) bool { return strings.HasPrefix(f, "+hv-") })
}

func nestedOff(cpu string) bool {
	_, flags, _ := cpuParts(cpu)
	return slices.Contains(flags, "-nested-virt") && !slices.Contains(flags, "+nested-virt")
}

// machineOK reports whether a machine value is q35 with no property but
// its type (Machine.pm $machine_fmt: viommu, aw-bits, enable-s3 and
// enable-s4 each add host-side code a guest drives: an emulated IOMMU, the
// S3/S4 power states), of version 10.1 or newer when pinned; pinned says
// it must be pinned.
func machineOK(v string, pinned bool) bool {
	typ := ""
	for i, p := range strings.Split(v, ",") {
		k, val, ok := strings.Cut(p, "=")
		switch {
		case !ok && i == 0:
			typ = p
		case ok && k == "type":
			typ = val
		default:
			return false
		}
	}
	m := reMachine.FindStringSubmatch(typ)
	if m == nil {
		return false
	}
	if m[1] == "" {
		return !pinned
	}
	maj, _ := strconv.Atoi(m[1])
	minor, _ := strconv.Atoi(m[2])
	return maj > 10 || maj == 10 && minor >= 1
}

// WindowsMachine is the machine a Windows VM whose machine is cur gets:
// cur when it is a q35 of the profile pinned to a version (10.1 or newer),
// else MinMachine. qemu-server pins a Windows VM's machine itself when
// ostype is set without machine (API2/Qemu.pm update_vm_api, Machine.pm
// check_and_pin_machine_string: to the newest installed QEMU's version,
// pc-i440fx- when machine is unset) and at every start of an unpinned one
// (get_vm_machine: to the template's creation QEMU, 5.1 without one), so
// the daemon pins it itself, sending machine with ostype (pveapi).
func WindowsMachine(cur string) string {
	if machineOK(cur, true) {
		return cur
	}
	return MinMachine
}

// machineItem is the machine item: q35 of version 10.1 or newer, with no
// other property; pinned to a version for a Windows guest (WindowsMachine).
func machineItem(conf map[string]string, want Want) Item {
	if IsWindows(want.osType()) {
		return Item{Name: "machine", Want: "machine=pc-q35-X.Y, pinned, 10.1 or newer, no other property", Got: kv(conf, "machine"), OK: machineOK(conf["machine"], true), Fix: FixClone}
	}
	return Item{Name: "machine", Want: "machine=q35 (10.1 or newer when pinned), no other property", Got: kv(conf, "machine"), OK: machineOK(conf["machine"], false), Fix: FixClone}
}

// scsiItem is the SCSI controller item: scsiN disks (not CD-ROMs, which a
// clone drops) on virtio-scsi. qemu-server's default scsihw is lsi
// (QemuServer.pm confdesc: lsi, lsi53c810, virtio-scsi-pci,
// virtio-scsi-single, megasas, pvscsi), and LSI 53C895A/53C810, MegaRAID
// SAS and PVSCSI are emulated HBAs a guest drives register by register.
func scsiItem(conf map[string]string) Item {
	var scsi []string
	for _, k := range keysMatching(conf, reSCSI) {
		if !slices.Contains(strings.Split(conf[k], ","), "media=cdrom") {
			scsi = append(scsi, k)
		}
	}
	got := kv(conf, "scsihw")
	if got == "" && len(scsi) > 0 {
		got = "scsihw unset (lsi)"
	}
	return Item{Name: itemSCSIHW, Want: "scsihw=virtio-scsi-pci or virtio-scsi-single (with scsiN disks)", Got: got, OK: len(scsi) == 0 || reSCSIHW.MatchString(conf["scsihw"]), Fix: FixTemplate}
}

func agentOn(v string) bool {
	for i, p := range strings.Split(v, ",") {
		k, val, ok := strings.Cut(p, "=")
		if !ok && i == 0 {
			k, val = "enabled", p
		}
		if k == "enabled" {
			return val == "1"
		}
	}
	return false
}

// DefaultCPU is the CPU type set when a configuration has none (Proxmox
// VE 8 and 9 default for new VMs; it has no vmx/svm of its own).
const DefaultCPU = "x86-64-v2-AES"

// CloneChanges returns what the pool-scoped token sets and deletes on a
// clone with configuration conf to bring every FixClone item into the
// profile. Nothing is returned for items already in it.
func CloneChanges(conf map[string]string) (set map[string]string, del []string) {
	return CloneChangesFor(conf, Want{})
}

// CloneChangesFor is CloneChanges for the profile as want has it. The
// UEFI firmware item is not among them: its EFI vars disk is allocated
// by the create's configure step (it needs the VM's storage), and a clone
// without it fails the check after.
func CloneChangesFor(conf map[string]string, want Want) (set map[string]string, del []string) {
	set = map[string]string{}
	for _, i := range CheckFor(conf, want).Failed() {
		if i.Fix != FixClone {
			continue
		}
		del = append(del, i.Keys...)
		switch i.Name {
		case "display":
			set["vga"] = "serial0"
		case "serial console":
			set["serial0"] = "socket"
		case "usb tablet":
			set["tablet"] = "0"
		case "balloon":
			set["balloon"] = "0"
		case osItem(want.osType()):
			set["ostype"] = want.osType()
		case "machine":
			set["machine"] = "q35"
			if IsWindows(want.osType()) {
				set["machine"] = WindowsMachine(conf["machine"])
			}
		case itemAgent:
			set["agent"] = "enabled=1"
		case "nested virtualization", itemHVFlags, itemCPUModel:
			set["cpu"] = CPUValue(conf["cpu"], want.CPU)
		}
	}
	slices.Sort(del)
	return set, del
}

// CPUValue is the cpu value of a configuration whose cpu is cpu with
// nested virtualization off (-nested-virt): cpu's type, or model when
// given, with cpu's other flags and properties kept but the Hyper-V ones
// turned on (+hv-tlbflush, +hv-evmcs: qemu-server's VM-specific flags,
// CPUFlags.pm; hv-evmcs is a nested-virtualization enlightenment), which
// are dropped.
func CPUValue(cpu, model string) string {
	typ, flags, rest := cpuParts(cpu)
	if model != "" {
		typ = model
	}
	if typ == "" {
		typ = DefaultCPU
	}
	var fs []string
	for _, f := range flags {
		if f != "" && f != "+nested-virt" && f != "-nested-virt" && !strings.HasPrefix(f, "+hv-") {
			fs = append(fs, f)
		}
	}
	fs = append(fs, "-nested-virt")
	return strings.Join(append([]string{typ, "flags=" + strings.Join(fs, ";")}, rest...), ",")
}

// TemplateChanges returns what root@pam sets and deletes on a template:
// the clone changes, the deletion of every FixTemplate item's keys, and a
// virtio-scsi controller (SCSIHW) for scsiN disks on an emulated one: the
// template's guest must have the virtio-scsi driver to boot on it (Linux
// virtio_scsi; Windows vioscsi), which is why the daemon does not change
// it on its clones.
func TemplateChanges(conf map[string]string) (set map[string]string, del []string) {
	set, del = CloneChanges(conf)
	for _, i := range Check(conf).Failed() {
		if i.Fix == FixTemplate {
			del = append(del, i.Keys...)
		}
		if i.Name == itemSCSIHW {
			set["scsihw"] = SCSIHW
		}
	}
	slices.Sort(del)
	return set, slices.Compact(del)
}
