package pveemu

import (
	"context"
	"encoding/json"
	"net"
	"net/netip"
	"time"
)

// Backend is what the emulator drives on the node: SDN zones (bridges,
// gateways, SNAT, the per-zone dnsmasq) and guests (namespaces with their
// qemu-ga). The integrator implements it with testvm.Bed; FakeBackend serves
// unit tests without root.
type Backend interface {
	// ApplyZone creates or replaces the running state of one zone.
	ApplyZone(ctx context.Context, z ZoneSpec) error
	// RemoveZone tears down a zone applied before; unknown ids are no error.
	RemoveZone(ctx context.Context, id string) error
	// StartVM starts the guest and returns once its agent socket exists
	// (a guest of a VM with the agent off, VMSpec.NoAgent, has none).
	StartVM(ctx context.Context, v VMSpec) error
	// StopVM stops the guest; a guest that is not running is no error.
	StopVM(ctx context.Context, vmid int) error
	// AgentSocket is the path of the guest's qemu-ga socket
	// (<rundir>/<vmid>.qga).
	AgentSocket(vmid int) string
}

// AgentFreezer is a Backend that can put a guest's agent in qemu-ga's
// frozen state without freezing any file system (the bed's guests share
// the host's file systems): while frozen the agent answers every command
// but the ones qemu-ga allows then (frozenAllowed) with qemu-ga's own
// refusal. A snapshot of a running VM with fsfreeze on uses it
// (qemusnapshot.go).
type AgentFreezer interface {
	SetAgentFrozen(vmid int, frozen bool) error
}

// BridgeReporter is a Backend that can say whether a bridge device
// exists on its node. A VM's start checks the device itself (qemu-server's
// pve-bridge hook, through pve-network's tap_create, reads
// /sys/class/net/<bridge>/mtu: pve-common Network.pm read_bridge_mtu,
// "bridge '...' does not exist"), so a bridge a reload has made is there
// for a start at once, before that reload has ended; without one, the
// emulator goes by what the node's last reload applied.
type BridgeReporter interface {
	HasBridge(name string) bool
}

// frozenAllowed are the commands qemu-ga runs while the guest's file
// systems are frozen (QEMU qga/main.c ga_freeze_allowlist, since QEMU 9.2
// the qapi-schema.json feature fs-frozen).
var frozenAllowed = map[string]bool{"guest-ping": true, "guest-info": true, "guest-sync": true,
	"guest-sync-delimited": true, "guest-fsfreeze-status": true, "guest-fsfreeze-thaw": true}

// FrozenRefusal is qemu-ga's reply to command while frozen, nil for a
// command it still runs: qapi/qmp-dispatch.c's answer to a disabled
// command with the reason ga_apply_command_filters_iter gives it (QEMU
// 9.1 and later; "the agent is in frozen state" before).
func FrozenRefusal(command string) *AgentError {
	if frozenAllowed[command] {
		return nil
	}
	return &AgentError{Class: "CommandNotFound", Desc: "Command " + command + " has been disabled: the command is not allowed"}
}

// ContainerBackend is a Backend that runs containers (lxc.go): a CT's
// status/start starts one, status/stop and status/shutdown end it, and
// its status reports the init's pid while it runs. Without one, a CT's
// start fails. Errors are the runtime's; the emulator turns them into
// pve-container's task errors.
type ContainerBackend interface {
	// StartContainer starts the container and returns its init's host
	// pid once it runs.
	StartContainer(ctx context.Context, c CTSpec) (pid int, err error)
	// StopContainer kills it (lxc-stop --kill); one that does not run is
	// no error.
	StopContainer(ctx context.Context, vmid int) error
	// ShutdownContainer asks its init to power off and waits timeout;
	// then it kills it when force is set, else fails (lxc-stop --timeout
	// [--nokill]).
	ShutdownContainer(ctx context.Context, vmid int, timeout time.Duration, force bool) error
	// ContainerPID is the init's pid while the container runs (false
	// when it does not, whatever the emulator last did to it: a CT that
	// powered itself off is stopped).
	ContainerPID(vmid int) (int, bool)
}

// CTFreezer is a ContainerBackend that can freeze every process of a
// running container and thaw them again (pve-container LXC.pm
// freeze/thaw: on a cgroup v2 host the lxc command socket's freeze and
// unfreeze, LXC::Command freeze($vmid, 30), which write the container
// cgroup's cgroup.freeze and wait for cgroup.events to say so; the
// freezer v1 freezer.state on a legacy one). A snapshot of a running CT
// freezes it around the copy of its volume (lxcsnapshot.go); without a
// CTFreezer the volume is copied live.
type CTFreezer interface {
	// FreezeContainer returns once every process of the container is
	// frozen, or an error (bounded by ctx).
	FreezeContainer(ctx context.Context, vmid int) error
	// ThawContainer thaws it; one that is not frozen is no error.
	ThawContainer(ctx context.Context, vmid int) error
}

// CTSpec is a container to start: what pve-container's vm_start and its
// pre-start hook take from the CT's config.
type CTSpec struct {
	VMID     int
	Hostname string // the config's hostname ("" when unset)
	// Rootfs is the base layer of the CT's root (its template's root,
	// AddCTTemplate); Disk is the CT's own volume (a directory).
	Rootfs, Disk string
	MemoryMiB    int     // memory (MiB)
	CPUs         float64 // cpulimit (0: none)
	// Net is net0 (nil: none); the emulator starts no other NIC.
	Net *CTNet
}

// CTNet is a container NIC as its config gives it (net[n]: name, bridge,
// hwaddr, ip, gw) with the pve IPAM's address of its MAC (zero when
// none), which the pre-start hook maps in the zone's DHCP server.
type CTNet struct {
	Name, Bridge string
	MAC          net.HardwareAddr
	IP           string // "dhcp", "manual", an IPv4 CIDR or ""
	Gateway      netip.Addr
	DHCPIP       netip.Addr
}

// ZoneSpec is an applied SDN zone with its vnets.
type ZoneSpec struct {
	ID    string
	VNets []VNetSpec
}

// VNetSpec is an applied vnet with its first subnet.
type VNetSpec struct {
	Name    string       // bridge name
	Subnet  netip.Prefix // zero when the vnet has no subnet
	Gateway netip.Addr
	DHCP    []AddrRange // the subnet's dhcp-range entries, in order
	SNAT    bool
	// StaticDHCP: the subnet has no dhcp-range and its zone has DHCP, so
	// the zone's dnsmasq serves the whole subnet to the MACs the IPAM
	// mapped (pve-network Dnsmasq.pm configure_subnet's static range).
	StaticDHCP bool
}

// AddrRange is one dhcp-range entry of a subnet, both ends included.
type AddrRange struct {
	Start, End netip.Addr
}

// VMSpec is a guest to start.
type VMSpec struct {
	VMID int
	VNet string           // bridge of net0 ("" when the VM has no NIC)
	MAC  net.HardwareAddr // net0's MAC
	Disk string           // the VM's disk directory
	// MemoryMiB is the VM's memory (config "memory"): the bed caps the
	// guest's cgroup scope at it.
	MemoryMiB int
	// CPUs is what the VM's vCPU threads can run: sockets x cores (or
	// vcpus), at most cpulimit when set; the bed caps the guest's scope
	// at it.
	CPUs float64
	// IP is the pve IPAM's address of the MAC on VNet (zero when none).
	// qemu-server's vm_start maps it in the zone's dnsmasq (pve-network
	// Dhcp.pm add_mapping, Dnsmasq.pm add_ip_mapping: a "mac,ip" line in
	// the zone's ethers file), and that dnsmasq answers only MACs listed
	// there (dhcp-ignore=tag:!known).
	IP netip.Addr
	// NoAgent: the VM's agent is off in its config (absent, or enabled=0):
	// qemu-server's config_to_command then adds no qga0 chardev and no
	// virtio-serial port, so the guest has no agent socket; the backend
	// starts the guest without one.
	NoAgent bool
}

// Agent sends one QEMU guest agent command to the agent listening on socket
// and returns the command's "return" value. Errors the agent reports come
// back as *AgentError; any other error means the agent did not answer.
type Agent interface {
	Call(ctx context.Context, socket, command string, args any) (json.RawMessage, error)
}

// AgentError is an error object returned by the guest agent.
type AgentError struct {
	Class string `json:"class"`
	Desc  string `json:"desc"`
}

func (e *AgentError) Error() string { return e.Desc }
