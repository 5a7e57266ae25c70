package sandbox

import (
	"context"
	"net/netip"

	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// CloneSpec is a linked clone of a template into the daemon's pool.
type CloneSpec struct {
	Template int
	NewID    int
	Name     string
	Pool     string
}

// VMConfig is the configuration set on a fresh clone.
type VMConfig struct {
	// Tags are set as the VM's Proxmox tags (replacing the template's).
	Tags      []string
	Cores     int
	MemoryMiB int
	// Bridges are attached as net0, net1, ... (virtio, firewall off).
	Bridges []string
	// MACs are the NICs' MAC addresses, by Bridges' index; "" (or none)
	// lets Proxmox pick one.
	MACs []string
	// OSType, when set, is the VM's ostype (hardening.OSTypes).
	OSType string
	// CPU, when set, is the VM's CPU model (hardening.CPUModels), set with
	// nested virtualization off (hardening.CPUValue).
	CPU string
	// UEFI sets bios ovmf and, unless the clone has one of efitype 4m
	// already, allocates an EFI vars disk (efidisk0, efitype 4m, no
	// pre-enrolled keys) on the boot disk's storage.
	UEFI bool
	// NICModel is the model of every NIC (hardening.NICVirtio when
	// empty, or hardening.NICE1000).
	NICModel string
	// NoAgent turns the VM's guest agent device off (agent 0): a VM whose
	// guest has no agent (apitype.VMRequest.Agent false) gets no
	// virtio-serial port and no qga socket.
	NoAgent bool
}

// VMInfo is what the daemon reads back about a VM.
type VMInfo struct {
	VMID   int
	Name   string
	Status string // "running", "stopped", ...
	Tags   []string
	Pool   string
	// Template is true for templates; they are never touched by cleanup.
	Template bool
	// Lock is the config's lock ("clone" while qemu-server's clone_vm
	// still runs, "create" while pve-container's does; "" when none).
	// Only VM and a container's CT fill it.
	Lock string
	// Kind is apitype.KindLXC for a container, "" for a VM (set by the
	// engine: memberOps, Reconcile).
	Kind string
}

// ZoneSpec is a simple SDN zone with the zone DHCP (dnsmasq) and PVE IPAM.
type ZoneSpec struct {
	ID string
}

// VNetSpec is a vnet in a zone; Alias carries the ownership tags.
type VNetSpec struct {
	ID    string
	Zone  string
	Alias string
}

// SubnetSpec is a subnet of a vnet.
type SubnetSpec struct {
	VNet    string
	CIDR    string
	Gateway string
	SNAT    bool
	// DHCPRanges are the subnet's dhcp-range entries, in order; none: no
	// DHCP on the subnet.
	DHCPRanges []apitype.DHCPRange
}

// VNetInfo is a vnet as listed for reconcile.
type VNetInfo struct {
	ID    string
	Zone  string
	Alias string
}

// Proxmox is the Proxmox API as the engine uses it: the small interfaces
// below, one per step that calls it. Every method waits for the task it
// starts and returns an error when the task fails; errors wrap ErrNotFound
// or ErrExists where the caller branches. Implemented with go-proxmox by
// pveapi.Client.
type Proxmox interface {
	cloner
	vmControl
	snapshotter
	zoneBuilder
	zoneCleaner
	pools
	vmTagger
	addresser
	addressFixer
}

// cloner is the parts of the Proxmox API a create needs for its VMs
// (create.go).
type cloner interface {
	// TemplateID looks a template VM up by name (ErrNotFound when absent).
	TemplateID(ctx context.Context, name string) (int, error)
	// NextID returns a free VM id.
	NextID(ctx context.Context) (int, error)
	CloneVM(ctx context.Context, s CloneSpec) error
	ConfigureVM(ctx context.Context, vmid int, c VMConfig) error
	// ResizeDisk grows the VM's boot disk to sizeGiB.
	ResizeDisk(ctx context.Context, vmid int, sizeGiB int) error
	StartVM(ctx context.Context, vmid int) error
}

// vmControl is the parts of the Proxmox API that read, start and remove
// VMs: delete and reconcile (delete.go, reconcile.go), and a rollback's
// restart (snapshot.go).
type vmControl interface {
	// VM returns the VM's status and tags (ErrNotFound when absent).
	VM(ctx context.Context, vmid int) (VMInfo, error)
	// ListVMs lists every VM of the node (for reconcile).
	ListVMs(ctx context.Context) ([]VMInfo, error)
	StartVM(ctx context.Context, vmid int) error
	StopVM(ctx context.Context, vmid int) error
	// DeleteVM destroys the VM with purge (removes it from pools and jobs).
	DeleteVM(ctx context.Context, vmid int) error
}

// snapshotter is the parts of the Proxmox API the snapshot calls need
// (snapshot.go).
type snapshotter interface {
	Snapshot(ctx context.Context, vmid int, name string) error
	Rollback(ctx context.Context, vmid int, name string) error
}

// zoneBuilder is the parts of the SDN API a create needs for its zone
// (create.go, cidr.go).
type zoneBuilder interface {
	CreateZone(ctx context.Context, z ZoneSpec) error
	CreateVNet(ctx context.Context, v VNetSpec) error
	CreateSubnet(ctx context.Context, s SubnetSpec) error
	// ApplySDN applies pending SDN changes (PUT /cluster/sdn).
	ApplySDN(ctx context.Context) error
}

// zoneCleaner is the parts of the SDN API that remove a zone: delete and
// reconcile (delete.go, reconcile.go).
type zoneCleaner interface {
	// ListVNets lists every vnet (for reconcile and teardown).
	ListVNets(ctx context.Context) ([]VNetInfo, error)
	// VNetSubnets lists the CIDRs of one vnet's subnets.
	VNetSubnets(ctx context.Context, vnet string) ([]string, error)
	DeleteSubnet(ctx context.Context, vnet, cidr string) error
	DeleteVNet(ctx context.Context, id string) error
	DeleteZone(ctx context.Context, id string) error
	// ApplySDN applies pending SDN changes (PUT /cluster/sdn).
	ApplySDN(ctx context.Context) error
}

// pools is the part of the Proxmox API that finds the daemon's pool
// (create.go, reconcile.go).
type pools interface {
	// EnsurePool fails when the pool does not exist: pve-access-setup
	// creates it (the token may not: Pool.Allocate).
	EnsurePool(ctx context.Context, pool string) error
}

// vmTagger is the part of the Proxmox API a warm pool claim needs
// (pool.go): a member's VM gets its sandbox's tags and name in one request.
type vmTagger interface {
	// SetVMTags replaces the VM's tags and sets its name; nothing else of
	// its configuration changes (a running VM's NICs keep their MACs).
	SetVMTags(ctx context.Context, vmid int, name string, tags []string) error
}

// IPAMAddress is one address of Proxmox's IPAM: the IPv4 address it holds
// for a NIC of VM VMID on vnet VNet.
type IPAMAddress struct {
	VNet string
	// VMID is 0 for an entry that names no VM, only a MAC (a fixed
	// address: fixed.go).
	VMID int
	IP   netip.Addr
	// MAC is the NIC's the entry is for ("" when the IPAM names none).
	MAC string
}

// addresser is the part of the Proxmox API that tells which address each
// VM of a sandbox has (names.go): the node's own record, never the guest's.
type addresser interface {
	// IPAMAddresses lists the IPv4 entries of the pve IPAM on the given
	// vnets that name a VM or a MAC; entries of other vnets are not
	// returned.
	IPAMAddresses(ctx context.Context, vnets []string) ([]IPAMAddress, error)
}

// addressFixer is the part of the Proxmox API that gives a NIC a fixed
// IPv4 address (fixed.go): entries of the pve IPAM added and removed by
// hand (POST and DELETE /cluster/sdn/vnets/{vnet}/ips, pve-network
// API2/Network/SDN/Ips.pm ipcreate, ipdelete).
type addressFixer interface {
	// ReserveIP adds the IPAM entry of ip for mac on vnet of zone (no
	// VM named); an ip the IPAM holds already is refused.
	ReserveIP(ctx context.Context, zone, vnet string, ip netip.Addr, mac string) error
	// ReleaseIP removes the IPAM entry of ip on vnet of zone, with mac
	// the MAC the entry was added for (Proxmox drops its cache of the
	// MAC's address with it).
	ReleaseIP(ctx context.Context, zone, vnet string, ip netip.Addr, mac string) error
	// MACEntries lists the IPv4 entries of the pve IPAM whose MAC is one
	// of macs (in any case), on every vnet the token may see: with
	// pve-access-setup's grant, every zone of the cluster, whoever made
	// it (MACs in lower case, as IPAMAddresses).
	MACEntries(ctx context.Context, macs []string) ([]IPAMAddress, error)
}

// vmConfigReader reads a VM's configuration (*pveapi.Client): where an
// addresser has it, a VM with two NICs on one network has each NIC's
// address told apart by the NIC's MAC (names.go).
type vmConfigReader interface {
	VMConfig(ctx context.Context, vmid int) (map[string]string, error)
}

// CTConfig is the configuration set on a fresh container clone.
type CTConfig struct {
	// Tags are set as the CT's Proxmox tags (replacing the template's).
	Tags []string
	// Hostname is the CT's hostname (a DNS label); "" keeps the clone's.
	Hostname  string
	Cores     int
	MemoryMiB int // swap is set to 0
	// Bridges are attached as net0, net1, ...:
	// name=eth<k>,bridge=<b>,ip=dhcp, firewall off; the template's other
	// netN are deleted.
	Bridges []string
	// MACs are the NICs' MAC addresses, by Bridges' index; "" (or none)
	// lets Proxmox pick one.
	MACs []string
}

// Containers is the part of the Proxmox API the engine needs for
// unprivileged containers (pve-container), by the same token. Like
// Proxmox's, every method waits for the task it starts; errors wrap
// ErrNotFound or ErrExists where the caller branches. A CT is a guest of
// its own kind in the VMID space it shares with the VMs: a VM's id is no
// CT (ErrNotFound). Implemented by pveapi.Client.
type Containers interface {
	// CTTemplateID looks a CT template of this node up by name (its
	// hostname, as the node's CT list reports it); ErrNotFound when
	// absent.
	CTTemplateID(ctx context.Context, name string) (int, error)
	// CloneCT makes a linked clone of template s.Template as s.NewID in
	// s.Pool, hostname s.Name; ErrExists when the id is taken (by a CT
	// or a VM).
	CloneCT(ctx context.Context, s CloneSpec) error
	// ConfigureCT sets c on a CT in one synchronous update.
	ConfigureCT(ctx context.Context, vmid int, c CTConfig) error
	// SetCTTags replaces the CT's tags and sets its hostname in one
	// synchronous update, nothing else of its config (a warm pool claim,
	// pool.go): a running CT takes both at once (they are among
	// pve-container's fast-plug options, LXC/Config.pm
	// $LXC_FASTPLUG_OPTIONS), its NICs untouched.
	SetCTTags(ctx context.Context, vmid int, hostname string, tags []string) error
	StartCT(ctx context.Context, vmid int) error
	// StopCT kills the CT; one that does not run (or does not exist) is
	// no error.
	StopCT(ctx context.Context, vmid int) error
	// DeleteCT destroys the CT with purge, stopping it first when it
	// runs; ErrNotFound when absent.
	DeleteCT(ctx context.Context, vmid int) error
	// CT returns the CT's status, tags and pool; ErrNotFound when absent
	// (or when vmid is a VM's).
	CT(ctx context.Context, vmid int) (VMInfo, error)
	// ListCTs lists every CT of the node.
	ListCTs(ctx context.Context) ([]VMInfo, error)
	// CTConfigValues returns the CT's configuration (pending values
	// taken in), every value as the text of the config file: for the
	// hardening checks (unprivileged, features, mpN, devN).
	CTConfigValues(ctx context.Context, vmid int) (map[string]string, error)
	// SnapshotCT snapshots the CT's volumes and config; ErrExists when
	// the name is taken.
	SnapshotCT(ctx context.Context, vmid int, name string) error
	// RollbackCT rolls the CT back to snapshot name (stopping it when
	// it runs) and starts it; ErrNotFound when there is no such
	// snapshot.
	RollbackCT(ctx context.Context, vmid int, name string) error
}
