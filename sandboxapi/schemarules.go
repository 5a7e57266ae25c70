package sandboxapi

import (
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/pve-inspect/pve-inspect/hardening"
	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// The rules of a create (validateCreate) as OpenAPI keywords, built from
// the validator's own constants and regular expressions, so that a body
// the document allows is refused only for a rule it states in words (the
// cross-field rules of createRulesText, which JSON Schema cannot say) or
// for the node's state (a template it does not have, its caps, a CIDR in
// use). schemathesis ST202 found the create's rules missing.

// noControl matches printable text (cleanText: no C0 control or DEL).
const noControl = `^[^\x00-\x1f\x7f]*$`

// createRulesText states what the keywords cannot.
const createRulesText = "Rules JSON Schema cannot say: network names are unique, and so are VM names " +
	"(a VM without a name is vm<index>); every name in a VM's networks, or its nics' network, is one of networks (net0 when " +
	"networks is empty); a VM gives networks or nics, not both, and a VM of no_network neither; the MACs of nics are unique in the sandbox (in any case), " +
	"and so are their ipv4 addresses, each inside its network's cidr (not \"auto\"; dhcp on or off) and not the cidr's " +
	"network, broadcast or gateway (first host) address; a network's dhcp_ranges need a fixed cidr and dhcp on, each end " +
	"inside the cidr and not its network, broadcast or gateway address, start not above end, no two ranges sharing an address, " +
	"and room for every NIC on the network (a NIC with a fixed ipv4 takes one of the ranges while configured; a fixed ipv4 " +
	"inside a range is not free; without dhcp_ranges the daemon's range of a fixed cidr: from its 10th address, on a /28 or smaller its 2nd, " +
	"to its last but one); a network of dhcp false with a fixed cidr has room for every NIC on it (each takes an address " +
	"of the cidr but its network, gateway and broadcast ones while configured, a NIC with a fixed ipv4 one besides its own); env holds at most %d bytes of names and values in all, and needs a VM that has a guest agent " +
	"(not agent false); a container (kind lxc) takes no agent. State the node decides: " +
	"a template it has (invalid-request, field template, otherwise), a disk_controller its disks are on (invalid-request), " +
	"a CIDR not in use and a free range for auto (conflict), the caps of GET /v1/capacity (guard-refused)."

// execRulesText states what the exec keywords cannot.
const execRulesText = "Rules JSON Schema cannot say: argv[0] is not empty; the arguments hold at most %d bytes " +
	"in all; without Accept: application/x-ndjson (streaming) output_limit is at most %d (each stream is " +
	"collected into the answer)."

// execEnvText describes an exec's env: what it is added to. The base is
// qga.BaseEnv (qga/execenv.go); TestExecEnvDescribed holds the two equal.
const execEnvText = "Added to (and overriding) the command's base environment, which is exactly " +
	"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin, HOME=/root (with user: that user's " +
	"home directory, or /) and LANG=C.UTF-8: nothing of the guest agent's own environment and nothing " +
	"read from the guest."

// execEnvRule is ExecRequest.env: identifiers to NUL-free values, described.
func execEnvRule() map[string]any {
	r := keyedBy(maxEnv, apitype.EnvNamePattern, map[string]any{"type": "string", "pattern": `^[^\x00]*$`})
	r["description"] = execEnvText
	return r
}

// keyedBy is an object of at most maxProps keys, each matching keyPattern,
// with values matching value: patternProperties with additionalProperties
// false, not propertyNames, which OpenAPI 3.0's schema (JSON Schema
// draft 5's subset) does not have: schemathesis takes a 3.0 document's
// schemas as draft 4, ignores propertyNames, and generated env names that
// are no identifiers as valid bodies (ST202).
func keyedBy(maxProps int, keyPattern string, value map[string]any) map[string]any {
	return map[string]any{"maxProperties": maxProps, "patternProperties": map[string]any{keyPattern: value}, "additionalProperties": false}
}

// pathRule is a guest path (validateGuestPath), as a query parameter.
func pathRule() map[string]any {
	return map[string]any{"type": "string", "minLength": 1, "maxLength": maxPathLen, "pattern": `^/[^\x00]*$`}
}

// modeRule is the mode query parameter: octal up to 0777 (ParseUint base 8).
func modeRule() map[string]any {
	return map[string]any{"type": "string", "pattern": `^$|^0*[0-7]{1,3}$`}
}

// snapshotRule is a snapshot name (validateSnapshotName).
func snapshotRule() map[string]any {
	return map[string]any{"type": "string", "pattern": reSnapshot.String(), "not": map[string]any{"enum": []string{reservedSnapshot}}}
}

func (s *Server) createRules() map[string]map[string]any {
	maxLen := func(n int) map[string]any { return map[string]any{"maxLength": n, "pattern": noControl} }
	owner, label := maxLen(maxOwnerChars), maxLen(maxLabelChars)
	label["type"] = "string"
	// a node that makes no containers ([api] containers off) says so: its
	// document has no kind lxc
	kinds, kindText := []string{"", apitype.KindVM, apitype.KindLXC},
		"vm (default): a QEMU VM; lxc: an unprivileged container (no disk_gib, no fixed MAC or address, none of firmware, cpu, os_type, disk_controller, nic_controller; never from the warm pool)"
	if s.eo.Containers == nil || s.eo.CTGuests == nil {
		kinds, kindText = []string{"", apitype.KindVM}, "vm (default): a QEMU VM (this node makes no containers)"
	}
	// the firmware and OS types this node takes ([api] allow_uefi,
	// allow_windows)
	firmwares, firmwareText := []string{"", hardening.FirmwareSeaBIOS}, "seabios (default; this node takes no uefi: [api] allow_uefi)"
	if s.eo.AllowUEFI {
		firmwares, firmwareText = append(firmwares, hardening.FirmwareUEFI), "seabios (default) or uefi: OVMF with an EFI vars disk (efitype 4m, no pre-enrolled keys), SMM emulation on; never from the warm pool"
	}
	nics, nicText := []string{"", hardening.NICVirtio}, "the model of every NIC: virtio (default; this node takes no e1000: [api] allow_e1000)"
	if s.eo.AllowE1000 {
		nics, nicText = append(nics, hardening.NICE1000), "the model of every NIC: virtio (default) or e1000 (QEMU's emulated Intel NIC, for a guest without virtio drivers); never from the warm pool"
	}
	osTypes, osText := []string{"", hardening.OSLinux}, "l26 (default; this node takes no Windows guests: [api] allow_windows)"
	if s.eo.AllowWindows {
		osTypes, osText = append(osTypes, hardening.OSWin10, hardening.OSWin11),
			"l26 (default), win10 or win11: a Windows guest gets Hyper-V enlightenments; its exec and file calls take Windows paths (C:\\dir) and no user, and it has no containment check (409), no env and no naming in its guest"
	}
	return map[string]map[string]any{
		"CreateRequest":          {"description": fmt.Sprintf(createRulesText, apitype.MaxEnvBytes)},
		"CreateRequest.vms":      {"minItems": 1, "maxItems": maxVMsPerRequest},
		"CreateRequest.networks": {"maxItems": maxNetworks},
		"CreateRequest.labels":   keyedBy(maxLabels, reLabelKey.String(), label),
		"CreateRequest.owner":    owner,
		"CreateRequest.env":      keyedBy(apitype.MaxEnvVars, apitype.EnvNamePattern, map[string]any{"type": "string", "pattern": `^[^\x00]*$`}),
		"VMRequest.name": {"pattern": "^$|" + reName.String(), "not": map[string]any{"enum": slices.Sorted(maps.Keys(reservedHostNames))},
			"description": "unique in the sandbox; empty: vm<index>. A DNS label: " +
				"the guest's hostname, and the name every VM of the sandbox resolves it by (/etc/hosts); any other name is refused, " +
				"and so are the names a guest's own /etc/hosts gives the loopback and multicast addresses (localhost, ip6-localhost, ...)"},
		"VM.addresses": {"description": "IPv4 addresses per network, in NIC order, from Proxmox's IPAM on the node (never from the guest); " +
			"a network of dhcp false too (Proxmox's IPAM gives its NIC an address of the prefix). Each guest's /etc/hosts maps every VM name of its sandbox to these"},
		"VMRequest.kind":     {"enum": kinds, "description": kindText},
		"VM.kind":            {"enum": []string{"", apitype.KindLXC}, "description": "lxc for a container; empty for a VM"},
		"VMRequest.template": {"pattern": reTemplate.String(), "description": "a template this node has (its state)"},
		"VMRequest.cores":    {"minimum": 0, "maximum": maxCores, "description": fmt.Sprintf("0: %d", defaultCores)},
		"VMRequest.memory_mib": {"anyOf": []any{map[string]any{"enum": []int{0}}, map[string]any{"minimum": minMemoryMiB, "maximum": maxMemoryMiB}},
			"description": fmt.Sprintf("0: %d", defaultMemoryMiB)},
		"VMRequest.disk_gib": {"minimum": 0, "maximum": maxDiskGiB},
		"VMRequest.firmware": {"enum": firmwares, "description": firmwareText},
		"VMRequest.cpu": {"enum": append([]string{""}, hardening.CPUModels...),
			"description": "the CPU model; empty: the template's. Nested virtualization stays off (-nested-virt) whatever the model; never from the warm pool"},
		"VMRequest.os_type":         {"enum": osTypes, "description": osText},
		"VMRequest.disk_controller": {"enum": []string{"", hardening.DiskSCSI, hardening.DiskIDE}, "description": "the bus every disk of the template must be on (a clone keeps them): scsi (on virtio-scsi) or ide (on q35's ICH9 AHCI controller); empty: the template's disks as they are; never from the warm pool"},
		"VMRequest.nic_controller":  {"enum": nics, "description": nicText},
		"VMRequest.agent": {"description": "false: the guest runs no QEMU guest agent (a VulnHub image, an appliance). Ready once Proxmox reports it running; " +
			"exec, files and the containment check refuse it (409), no env and no naming in its guest (its siblings resolve its name), " +
			"no agent signal in its health, never from the warm pool; the guard's walls are the same. Default true"},
		"VM.agent":             {"description": "false for a VM created without a guest agent; omitted otherwise"},
		"HostSignals.no_agent": {"description": "the VM has no guest agent (created with agent false): agent_ok stays false and no agent signal counts"},
		"VMRequest.networks":   {"maxItems": maxNetworks, "items": map[string]any{"type": "string", "pattern": reName.String()}},
		"VMRequest.no_network": {"description": "true: a VM without any NIC (the reference plugin's nics=[]): its template's NICs are removed and none added, " +
			"so its guest has the loopback only; give no networks or nics with it. No addresses; its siblings cannot reach it; exec and files work; " +
			"the containment check is not offered from it (409); never from the warm pool. Default false"},
		"VM.no_network": {"description": "true for a VM created without any NIC (its networks empty); omitted otherwise"},
		"VMRequest.nics": {"maxItems": maxNetworks, "description": "instead of networks (not both): one NIC per entry, in order, " +
			"with an optional fixed MAC and IPv4 address; a request with any fixed is never served from the warm pool"},
		"NIC.network": {"pattern": "^$|" + reName.String(), "description": "the network's name in the sandbox; empty when vnet is given"},
		"NIC.vnet": {"maxLength": maxVNetChars, "description": "instead of network: a vnet the node's operator shares ([api] shared_vnets), by its Proxmox vnet id or alias; " +
			"no mac or ipv4 with it, the sandbox takes no egress policy, never from the warm pool; the VM's networks entry for it is vnet:<id>. " +
			"Other sandboxes (of other owners too) may have NICs on the same vnet and reach this one there"},
		"NIC.mac": {"pattern": "^$|" + reMAC.String(), "not": map[string]any{"enum": []string{zeroMAC}},
			"description": "a unicast MAC (the group bit clear, as Proxmox's mac-addr format), any case, not all zeros; " +
				"empty: Proxmox picks one, or the daemon for a NIC with a fixed ipv4. Answers give it in upper case"},
		"NIC.ipv4": {"pattern": "^$|^" + octet + `\.` + octet + `\.` + octet + `\.` + octet + "$",
			"description": "a fixed address, reserved in Proxmox's IPAM for the NIC's MAC and handed out by the zone's DHCP server; " +
				"on a network of dhcp false too (a subnet without a dhcp-range, whose MAC mappings the zone's dnsmasq serves); " +
				"empty: one of the network's DHCP range (of its whole cidr with dhcp false)"},
		"NetworkRequest.name": {"pattern": reName.String()},
		"NetworkRequest.dhcp_ranges": {"maxItems": apitype.MaxDHCPRanges, "description": "the ranges the zone's DHCP server hands out, " +
			"in order (Proxmox's subnet dhcp-range); empty: the daemon's plan, .10 (.2 in a /28) to the last but one address"},
		"DHCPRange.start":             {"pattern": "^" + octet + `\.` + octet + `\.` + octet + `\.` + octet + "$"},
		"DHCPRange.end":               {"pattern": "^" + octet + `\.` + octet + `\.` + octet + `\.` + octet + "$"},
		"ExecRequest":                 {"description": fmt.Sprintf(execRulesText, maxArgBytes, maxCollected)},
		"ExecRequest.argv":            {"minItems": 1, "maxItems": maxArgv, "items": map[string]any{"type": "string", "pattern": `^[^\x00]*$`}},
		"ExecRequest.cwd":             {"maxLength": maxPathLen, "pattern": `^$|^/[^\x00]*$`},
		"ExecRequest.env":             execEnvRule(),
		"ExecRequest.user":            {"maxLength": maxUserChars, "pattern": `^[^\x00-\x1f\x7f :/]*$`},
		"ExecRequest.timeout_seconds": {"minimum": 0, "maximum": maxExecTimeout},
		"ExecRequest.output_limit":    {"minimum": 0, "maximum": maxOutputLimit},
		"SnapshotRequest.name":        snapshotRule(),
		// the modes the egress part takes (schemathesis ST202: any string
		// was allowed); empty or absent, open (ST201: the document had it
		// required)
		"EgressPolicy.mode": {"enum": []string{"", "open", "allowlist", "none"}, "default": "open"},
		"NetworkRequest.cidr": {"pattern": cidrPattern(sandbox.PrivateRanges(), minCIDRBits, maxCIDRBits),
			"description": fmt.Sprintf(`"auto" (or empty) or a private IPv4 prefix of /%d to /%d without host bits`, minCIDRBits, maxCIDRBits)},
	}
}

// octet matches an IPv4 octet as netip parses it (no leading zeros).
const octet = `(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])`

// alt matches one of vals (decimal); all 256 values are octet.
func alt(vals []int) string {
	if len(vals) == 256 {
		return octet
	}
	s := make([]string, len(vals))
	for i, v := range vals {
		s[i] = strconv.Itoa(v)
	}
	return "(?:" + strings.Join(s, "|") + ")"
}

// span is lo..hi in steps of step.
func span(lo, hi, step int) []int {
	var out []int
	for v := lo; v <= hi; v += step {
		out = append(out, v)
	}
	return out
}

// cidrPattern matches "", "auto" and exactly the prefixes of minBits to
// maxBits (both at least 16) inside one of ranges (each at most /16)
// without host bits: the rules validateCreate checks with netip.
func cidrPattern(ranges []netip.Prefix, minBits, maxBits int) string {
	var first []string // the first two octets
	for _, r := range ranges {
		a := r.Addr().As4()
		hi := 16 - r.Bits() // free bits of the second octet (r is at most /16)
		if hi > 8 {
			hi = 8
		}
		lo := int(a[1]) &^ (1<<hi - 1)
		first = append(first, fmt.Sprintf(`%d\.%s`, a[0], alt(span(lo, lo+1<<hi-1, 1))))
	}
	var rest []string // third and fourth octets and the length
	for bits := minBits; bits <= maxBits; bits++ {
		third, fourth := span(0, 255, 1), []int{0}
		switch {
		case bits < 24:
			third = span(0, 255, 1<<(24-bits))
		case bits > 24:
			fourth = span(0, 255, 1<<(32-bits))
		}
		rest = append(rest, fmt.Sprintf(`%s\.%s/%d`, alt(third), alt(fourth), bits))
	}
	return `^$|^auto$|^(?:` + strings.Join(first, "|") + `)\.(?:` + strings.Join(rest, "|") + `)$`
}

// egressRuler is an engine's Egress that says its entry rules (the
// daemon's: firewall/egress).
type egressRuler interface {
	EntryRules() sandbox.EgressEntryRules
}

// egressRules are the keywords of an egress policy's entries, from the
// node's egress part when it says them (schemathesis ST202: allow and
// deny entries were any string in the document), and apitype's rule that
// only mode allowlist takes an allow list.
func (s *Server) egressRules() map[string]map[string]any {
	er, ok := s.eo.Egress.(egressRuler)
	if !ok {
		return nil
	}
	r := er.EntryRules()
	entries := func(pattern, desc string) map[string]any {
		return map[string]any{"maxItems": r.MaxEntries, "description": desc,
			"items": map[string]any{"type": "string", "maxLength": r.MaxChars, "pattern": pattern}}
	}
	return map[string]map[string]any{
		"EgressPolicy": {
			"description": "allow is for mode allowlist only",
			"anyOf": []any{
				map[string]any{"required": []string{"mode"}, "properties": map[string]any{"mode": map[string]any{"enum": []string{"allowlist"}}}},
				map[string]any{"properties": map[string]any{"allow": map[string]any{"maxItems": 0}}},
			},
		},
		"EgressPolicy.allow": entries(r.AllowPattern, "IPv4 addresses and CIDRs without host bits, domains "+
			"(a leading \"*.\" for every name below one, the last label starting with a letter), a domain with a tcp port but 80 and 443"),
		"EgressPolicy.deny": entries(r.DenyPattern, "IPv4 addresses and CIDRs without host bits"),
	}
}
