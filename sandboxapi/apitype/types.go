package apitype

import (
	"time"
)

// Sandbox states.
const (
	StateCreating = "creating"
	StateReady    = "ready"
	StateDeleting = "deleting"
	StateError    = "error"
)

// CreateRequest is the body of POST /v1/sandboxes.
type CreateRequest struct {
	// VMs to clone; at least one.
	VMs []VMRequest `json:"vms"`
	// Networks of the sandbox's own SDN zone; when empty, one network
	// "net0" with CIDR "auto", DHCP and SNAT on.
	Networks []NetworkRequest `json:"networks,omitempty"`
	// Labels are free key/value pairs returned on get/list.
	Labels map[string]string `json:"labels,omitempty"`
	// TTLSeconds is the lifetime; 0 means the server default.
	TTLSeconds int64 `json:"ttl_seconds,omitempty"`
	// Owner is a free text owner name (defaults to the caller).
	Owner string `json:"owner,omitempty"`
	// Env holds secrets (model API keys) written into every VM at
	// GuestEnvPath, mode 0600 (root only), before the create returns.
	// Never stored, returned or logged.
	Env map[string]string `json:"env,omitempty"`
	// Egress is the sandbox's egress policy (default: open), in force
	// before its VMs start.
	Egress *EgressPolicy `json:"egress,omitempty"`
}

// Kinds of sandbox members (VMRequest.Kind).
const (
	KindVM  = "vm"
	KindLXC = "lxc"
)

// GuestEnvPath is where CreateRequest.Env lands in each VM, as
// shell-sourceable KEY='value' lines.
const GuestEnvPath = "/etc/pve-inspect/env"

// Bounds of a VM's cores and memory_mib (VMRequest; the API refuses a
// request outside them). A template built from an OVA takes its OVF's
// within them too (MaxVMMemoryMiB: 4 TiB).
const (
	MinVMCores     = 1
	MaxVMCores     = 1024
	MinVMMemoryMiB = 16
	MaxVMMemoryMiB = 4 << 20
)

// VMRequest describes one VM of a sandbox.
type VMRequest struct {
	// Name is unique in the sandbox; defaults to "vm<N>". It must be a
	// DNS label ([a-z][a-z0-9-]*, at most 32 characters, not ending in
	// "-"): it becomes the guest's hostname and the name its siblings
	// resolve it by. Any other name is refused (invalid-request, field
	// vms[i].name), never rewritten.
	Name string `json:"name,omitempty"`
	// Kind is what the member is: "vm" (default; a QEMU VM cloned from a
	// VM template) or "lxc" (an unprivileged Proxmox container cloned
	// from a container template, on the same networks and walls; no
	// guest agent: the daemon enters it from the node). A container
	// takes no disk_gib and no fixed MAC or address; a warm pool shape
	// of kind lxc serves a create of one container.
	Kind string `json:"kind,omitempty"`
	// Template is a template name known to the daemon (a VM template for
	// a VM, a container template for a container).
	Template string `json:"template"`
	// Cores is the number of vCPUs (default 1).
	Cores int `json:"cores,omitempty"`
	// MemoryMiB is the RAM in MiB (default 1024).
	MemoryMiB int `json:"memory_mib,omitempty"`
	// DiskGiB, when set, grows the boot disk to this size; one smaller than
	// the template's boot disk is refused (invalid-request, field
	// vms[i].disk_gib): Proxmox does not shrink disks.
	DiskGiB int `json:"disk_gib,omitempty"`
	// Networks are the network names the VM is attached to, in NIC order;
	// default: the first network.
	Networks []string `json:"networks,omitempty"`
	// NICs, instead of Networks (not both), attach the VM one NIC per
	// entry, in NIC order, each with an optional fixed MAC and IPv4
	// address. A request with any MAC or address fixed runs cold: a warm
	// pool member's NICs are configured already.
	NICs []NIC `json:"nics,omitempty"`
	// NoNetwork asks for a VM without any NIC (the reference plugin's
	// nics=[], "a virtual machine with no network access"): every NIC of
	// its template is removed and none is added, so its guest has the
	// loopback only. It gives neither Networks nor NICs. The VM has no
	// addresses; its guest knows its own name (127.0.1.1) and none of its
	// siblings', which cannot reach it; exec and files work through its
	// guest agent as for any VM; the containment check is not offered
	// from it (409); it is never served from the warm pool. Its
	// sandbox still has its networks (net0 when the request names none),
	// for its other VMs.
	NoNetwork bool `json:"no_network,omitempty"`
	// Firmware is "seabios" (default) or "uefi": OVMF with an EFI vars
	// disk (efitype 4m, no pre-enrolled keys) allocated on the VM's boot
	// disk storage. UEFI keeps SMM emulation on (the hardened profile's
	// SeaBIOS turns it off): a node takes it only with [api] allow_uefi.
	// A VM with any of firmware, cpu, os_type, disk_controller or
	// nic_controller set is built cold, never served from the warm pool.
	Firmware string `json:"firmware,omitempty"`
	// CPU is the CPU model: one of x86-64-v2, x86-64-v2-AES, x86-64-v3,
	// x86-64-v4, kvm64, qemu64, host; default: the template's. Nested
	// virtualization stays off whatever the model (-nested-virt).
	CPU string `json:"cpu,omitempty"`
	// OSType is Proxmox's ostype: "l26" (default), "win10" or "win11". A
	// Windows VM gets qemu-server's Hyper-V enlightenments, is taken only
	// with [api] allow_windows; its exec and file calls go through the
	// Windows agent's own paths (cwd and paths are drive-absolute Windows
	// paths, no user), it has no containment check (409), and it is not
	// named in its guest, nor given env.
	OSType string `json:"os_type,omitempty"`
	// DiskController is "scsi", "ide" or empty (the template's disks as
	// they are): a clone keeps its template's disks, so the template's
	// disks must all be on the bus asked for ("scsi": with a virtio-scsi
	// controller; "ide": ide-hd disks on q35's ICH9 AHCI controller, which
	// every q35 VM has).
	DiskController string `json:"disk_controller,omitempty"`
	// NICController is the model of every NIC of the VM: "virtio" (the
	// default) or "e1000" (QEMU's emulated Intel 82540EM, for a guest
	// without virtio drivers: more device code a guest drives, so a node
	// takes it only with [api] allow_e1000).
	NICController string `json:"nic_controller,omitempty"`
	// Agent says whether the VM's guest runs the QEMU guest agent
	// (default true). false: a VM the daemon never reaches inside (a
	// VulnHub image, a firewall appliance; the reference plugin's
	// is_sandbox=False). Its clone gets no agent device (agent off), it
	// is ready once Proxmox reports it running, and a rollback waits for
	// the same; exec, files and the containment check are refused for it
	// (409 naming the VM), it gets no env and is not named in its guest
	// (its siblings resolve it by name), its health has no agent signal,
	// and it is never served from the warm pool. Its network and the
	// guard's walls around it are those of any VM. A sandbox may consist
	// of such VMs only.
	Agent *bool `json:"agent,omitempty"`
}

// HasAgent reports whether the VM's guest runs the guest agent (Agent
// unset or true).
func (v VMRequest) HasAgent() bool { return v.Agent == nil || *v.Agent }

// NIC is one network interface of a VM with what the request fixed.
//
// A fixed IPv4 address is reserved in Proxmox's IPAM for the NIC's MAC
// before any NIC of the sandbox is configured, and the zone's DHCP server
// hands it to that MAC (pve-network's IPAM DHCP mapping): it must lie in
// the network's CIDR ("auto" cannot take one) and be neither its network,
// broadcast nor gateway address (the first host address); inside or
// outside the DHCP range, as Proxmox accepts both, and on a network of
// DHCP off too (a subnet without a dhcp-range, whose mapped MACs the
// zone's dnsmasq serves all the same: pve-network Vnets.pm
// add_dhcp_mapping, Dhcp/Dnsmasq.pm configure_subnet). Addresses are
// unique in the sandbox, and so are MACs.
//
// A NIC may instead name, in VNet, a vnet the node's operator shares
// ([api] shared_vnets): a Proxmox SDN vnet of a zone the daemon did not
// create, which other sandboxes (other owners too) may have NICs on. Such
// a NIC takes no MAC or IPv4, its VM is never served from the warm pool,
// and its sandbox takes no egress policy of its own (README "Shared
// vnets").
type NIC struct {
	// Network is the network's name in the sandbox; empty when VNet is
	// set.
	Network string `json:"network,omitempty"`
	// VNet is a shared vnet, by its Proxmox vnet id or its Proxmox alias
	// (as the reference plugin's vnet_alias), instead of Network. The
	// daemon answers the vnet id; the VM's networks entry for it is
	// SharedNetwork(id).
	VNet string `json:"vnet,omitempty"`
	// MAC is the NIC's unicast MAC address (XX:XX:XX:XX:XX:XX, any case;
	// the group bit clear, as Proxmox's mac-addr format wants; not all
	// zeros). Empty: Proxmox picks one, or, for a NIC with a fixed IPv4
	// address, the daemon does (locally administered, random). Answers
	// give it in upper case.
	MAC string `json:"mac,omitempty"`
	// IPv4 is the NIC's fixed address (dotted quad); empty: one of the
	// network's DHCP range (of its whole CIDR with DHCP off), as
	// Proxmox's IPAM picks it.
	IPv4 string `json:"ipv4,omitempty"`
}

// sharedPrefix starts a VM's networks entry for a shared vnet: network
// names never hold a colon.
const sharedPrefix = "vnet:"

// SharedNetwork is the VM's networks entry (VM.Networks, VMAddress.Network)
// for a NIC on the shared vnet id.
func SharedNetwork(id string) string { return sharedPrefix + id }

// SharedVNetOf reports whether a VM's networks entry names a shared vnet,
// and which.
func SharedVNetOf(network string) (string, bool) {
	if len(network) > len(sharedPrefix) && network[:len(sharedPrefix)] == sharedPrefix {
		return network[len(sharedPrefix):], true
	}
	return "", false
}

// NetworkRequest describes one vnet (with one subnet) of a sandbox.
type NetworkRequest struct {
	// Name is unique in the sandbox.
	Name string `json:"name"`
	// CIDR is an IPv4 prefix or "auto" (default) for a free range.
	CIDR string `json:"cidr,omitempty"`
	// DHCP false makes the subnet without a dhcp-range (default true, a
	// range of the request's or the daemon's plan): Proxmox's IPAM then
	// gives each NIC an address of the whole CIDR (the first free one
	// after the gateway), which the zone's DHCP server hands out all the
	// same (pve-network Subnets.pm add_next_free_ip, Dhcp/Dnsmasq.pm
	// configure_subnet), a fixed one too.
	DHCP *bool `json:"dhcp,omitempty"`
	// SNAT masquerades the subnet out of the node (default true).
	SNAT *bool `json:"snat,omitempty"`
	// DHCPRanges are the addresses the zone's DHCP server hands out
	// (Proxmox's subnet dhcp-range list, the reference plugin's
	// dhcp_ranges): at most MaxDHCPRanges, only with a fixed CIDR and DHCP
	// on, each inside the CIDR and not its network, broadcast or gateway
	// (first host) address, start <= end, no two overlapping. Empty: the
	// daemon's plan, .10 (.2 in a /28) to the last but one address.
	DHCPRanges []DHCPRange `json:"dhcp_ranges,omitempty"`
}

// MaxDHCPRanges is the most DHCP ranges one network takes.
const MaxDHCPRanges = 4

// DHCPRange is one range of IPv4 addresses a network's DHCP server hands
// out, both ends included.
type DHCPRange struct {
	// Start is the range's first address (dotted quad).
	Start string `json:"start"`
	// End is the range's last address, not below Start.
	End string `json:"end"`
}

// Sandbox is a sandbox as the API returns it.
type Sandbox struct {
	ID        string            `json:"id"`
	State     string            `json:"state"`
	Owner     string            `json:"owner,omitempty"`
	Labels    map[string]string `json:"labels,omitempty"`
	CreatedAt time.Time         `json:"created_at"`
	ExpiresAt time.Time         `json:"expires_at"`
	Zone      string            `json:"zone"`
	Networks  []Network         `json:"networks"`
	VMs       []VM              `json:"vms"`
	Error     string            `json:"error,omitempty"`
	// Health is the sandbox's health from host-side signals (ready
	// sandboxes, once checked).
	Health *SandboxHealth `json:"health,omitempty"`
	// FromPool is true when the create claimed a ready sandbox of the
	// warm pool instead of building one.
	FromPool bool `json:"from_pool,omitempty"`
}

// SandboxList is the body of GET /v1/sandboxes.
type SandboxList struct {
	Sandboxes []Sandbox `json:"sandboxes"`
}

// Network is one vnet of a sandbox.
type Network struct {
	Name    string `json:"name"`
	VNet    string `json:"vnet"`
	CIDR    string `json:"cidr"`
	Gateway string `json:"gateway"`
	DHCP    bool   `json:"dhcp"`
	SNAT    bool   `json:"snat"`
	// DHCPRanges are the ranges the zone's DHCP server hands addresses
	// of, in order (the request's, or the daemon's plan); none without
	// DHCP.
	DHCPRanges []DHCPRange `json:"dhcp_ranges,omitempty"`
}

// VM is one VM of a sandbox.
type VM struct {
	// Name is the VM's name in the sandbox, a DNS label; it is also the
	// guest's hostname, and every VM of the sandbox resolves it through
	// its /etc/hosts and by DNS at its zone's gateway (see Addresses).
	Name string `json:"name"`
	// Kind is "lxc" for a container, empty for a VM.
	Kind      string `json:"kind,omitempty"`
	VMID      int    `json:"vmid"`
	Template  string `json:"template"`
	Cores     int    `json:"cores"`
	MemoryMiB int    `json:"memory_mib"`
	DiskGiB   int    `json:"disk_gib,omitempty"`
	// Networks are the VM's networks in NIC order (a shared vnet's as
	// SharedNetwork); empty for a VM of NoNetwork.
	Networks []string `json:"networks"`
	// NoNetwork is true for a VM created without any NIC
	// (VMRequest.NoNetwork), omitted otherwise.
	NoNetwork bool `json:"no_network,omitempty"`
	// NICs are the VM's NICs as the request's nics gave them, each with
	// the MAC it has when the request or the daemon fixed one (a NIC with
	// a fixed IPv4 address always has); omitted when the request gave
	// networks.
	NICs []NIC `json:"nics,omitempty"`
	// Firmware, CPU, OSType, DiskController and NICController are the
	// request's (VMRequest), omitted when it gave none.
	Firmware       string `json:"firmware,omitempty"`
	CPU            string `json:"cpu,omitempty"`
	OSType         string `json:"os_type,omitempty"`
	DiskController string `json:"disk_controller,omitempty"`
	NICController  string `json:"nic_controller,omitempty"`
	// Agent is false for a VM without a guest agent (VMRequest.Agent),
	// omitted for one with it.
	Agent *bool `json:"agent,omitempty"`
	// Addresses are the VM's IPv4 addresses, one per network that hands
	// out addresses, in NIC order: taken from Proxmox's IPAM on the node
	// (the entry of the VM's NIC on the network's vnet), never from what
	// the guest says. A network of "dhcp": false has one too (Proxmox's
	// IPAM gives a NIC of a subnet without a DHCP range an address of its
	// prefix, .2 first). Empty until the sandbox is ready.
	Addresses []VMAddress `json:"addresses,omitempty"`
}

// HasAgent reports whether the VM's guest runs the guest agent (Agent
// unset or true).
func (v VM) HasAgent() bool { return v.Agent == nil || *v.Agent }

// VMAddress is one IPv4 address of a VM on one of its sandbox's networks.
type VMAddress struct {
	// Network is the network's name in the sandbox.
	Network string `json:"network"`
	// IPv4 is the address Proxmox's IPAM holds for the VM's NIC there
	// (the one the zone's DHCP server hands it).
	IPv4 string `json:"ipv4"`
}

// ValidateReport is the answer of POST /v1/sandboxes/validate: what a
// create of the request would be refused for on this node whatever else
// runs there (the room and ranges other sandboxes hold are not in it). A
// request its own rules refuse gets the create's invalid-request instead.
type ValidateReport struct {
	// Valid is true when Problems is empty.
	Valid bool `json:"valid"`
	// Problems are the refusals, one problem document each (type, field,
	// cap, items as a create's refusal would carry them).
	Problems []Problem `json:"problems"`
	// Templates are the template names this node knows, sorted.
	Templates []string `json:"templates"`
}

// ExtendRequest is the body of POST /v1/sandboxes/{id}/extend.
type ExtendRequest struct {
	// TTLSeconds is the new lifetime counted from now.
	TTLSeconds int64 `json:"ttl_seconds"`
}

// ExecRequest is the body of POST .../exec; it follows Inspect's
// SandboxEnvironment.exec.
type ExecRequest struct {
	Argv []string `json:"argv"`
	// Stdin is sent to the process (base64 in JSON).
	Stdin []byte            `json:"stdin,omitempty"`
	Cwd   string            `json:"cwd,omitempty"`
	Env   map[string]string `json:"env,omitempty"`
	User  string            `json:"user,omitempty"`
	// TimeoutSeconds kills the process tree after this long (0: server default).
	TimeoutSeconds int64 `json:"timeout_seconds,omitempty"`
	// OutputLimit caps each of stdout and stderr in bytes (0: 10 MiB).
	OutputLimit int64 `json:"output_limit,omitempty"`
}

// ExecResult is the collected result of an exec.
type ExecResult struct {
	ExitCode int `json:"exit_code"`
	// Stdout and Stderr are base64 in JSON.
	Stdout          []byte `json:"stdout"`
	Stderr          []byte `json:"stderr"`
	StdoutTruncated bool   `json:"stdout_truncated,omitempty"`
	StderrTruncated bool   `json:"stderr_truncated,omitempty"`
	// TimedOut is set when the process tree was killed by the timeout.
	TimedOut bool `json:"timed_out,omitempty"`
}

// ExecEvent is one NDJSON record of a streamed exec: "stdout"/"stderr"
// chunks (Data), then exactly one "exit" (Result) or "error" (Problem).
type ExecEvent struct {
	Type    string      `json:"type"`
	Data    []byte      `json:"data,omitempty"`
	Result  *ExecResult `json:"result,omitempty"`
	Problem *Problem    `json:"problem,omitempty"`
}

// SnapshotRequest is the body of POST .../snapshots.
type SnapshotRequest struct {
	Name string `json:"name"`
}

// CheckRequest is the optional body of POST /v1/sandboxes/{id}/check.
type CheckRequest struct {
	// VM names the member the probes run from, a VM or a container
	// (default: the first). A container's check adds the rows of a shared
	// kernel (id map, the node's /proc/sys and /sys, mounts, keyrings,
	// modules, nesting).
	VM string `json:"vm,omitempty"`
}

// CheckRow is one probe of the containment check (DESIGN.md section 7).
type CheckRow struct {
	Target   string `json:"target"`
	Probe    string `json:"probe"`
	Expected string `json:"expected"`
	Observed string `json:"observed"`
	Pass     bool   `json:"pass"`
	Control  bool   `json:"control,omitempty"`
	Detail   string `json:"detail,omitempty"`
}

// CheckReport is the result of a containment check.
type CheckReport struct {
	Sandbox string     `json:"sandbox"`
	VM      string     `json:"vm"`
	Pass    bool       `json:"pass"`
	Rows    []CheckRow `json:"rows"`
	// Sampling is set when the node has so many sandboxes that this run
	// probed a rotating sample of the other zones' and LAN targets: Pass
	// speaks for the rows probed only.
	Sampling *CheckSampling `json:"sampling,omitempty"`
	// Health is the sandbox's health when the check ran (host-side
	// signals; see SandboxHealth).
	Health *SandboxHealth `json:"health,omitempty"`
}

// CheckSampling says what a sampled containment check did not probe; the
// next run probes others.
type CheckSampling struct {
	// RowsNotProbed is how many planned rows this run left out: they are
	// not in Rows, neither passed nor failed.
	RowsNotProbed int `json:"rows_not_probed"`
	// NotProbed are the addresses left out, as "group address".
	NotProbed []string `json:"not_probed"`
	// Runs is how many consecutive runs cover every address.
	Runs int `json:"runs"`
	// Note says the above in a sentence.
	Note string `json:"note"`
}

// Health is the body of GET /v1/healthz.
type Health struct {
	Status    string `json:"status"`
	Node      string `json:"node"`
	Sandboxes int    `json:"sandboxes"`
	// DefaultTTLSeconds is the lifetime of a sandbox created without
	// ttl_seconds; MaxTTLSeconds the most a create or an extend may ask
	// for ([api] default_ttl, max_ttl). A client that keeps a sandbox
	// alive extends it by at most MaxTTLSeconds at a time.
	DefaultTTLSeconds int64 `json:"default_ttl_seconds"`
	MaxTTLSeconds     int64 `json:"max_ttl_seconds"`
	// TemplateBuilds is set when the node builds templates on request
	// (POST /v1/templates/build, [templates] build = true).
	TemplateBuilds bool `json:"template_builds,omitempty"`
}
