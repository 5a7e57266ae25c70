// Package access is the one table of what pve-inspectd's Proxmox API token
// may do: every call the daemon makes (pveapi.Client) with the privileges
// Proxmox checks for it and on which ACL path, and the roles, pool members
// and ACL grants packaging/deb/pve-access-setup creates. The emulator
// (testvm/pveemu) enforces the same checks, the tests of the daemon run
// with exactly these grants, a golden test keeps the setup script in step,
// and `pve-inspectd doctor` compares a node's effective privileges against
// it.
//
// The sources of each check are in testvm/pveemu/FIDELITY.md ("The
// daemon's role").
package access

import (
	"slices"
	"strconv"
	"strings"
)

// The objects pve-access-setup creates.
const (
	// User is the Proxmox user of the daemon.
	User = "pve-inspectd@pve"
	// TokenPrefix starts the name of a node's API token (privilege
	// separated): TokenName.
	TokenPrefix = "daemon-"
	// DefaultPool is the pool of the sandboxes (PVE_INSPECTD_POOL).
	DefaultPool = "pve-inspect"
	// DefaultStorage is the storage of the templates' disks
	// (PVE_INSPECTD_STORAGE), added to the pool.
	DefaultStorage = "local-lvm"
	// TransferStorage is the dir storage the examples and tests give disk
	// transfers (PVE_INSPECTD_TRANSFER_STORAGE=local, [api]
	// disk_transfer_storage = "local"). pve-access-setup grants a
	// transfer storage only when one is named.
	TransferStorage = "local"
)

// TokenName is the name pve-access-setup gives node's token by default:
// users and tokens are cluster-wide (pmxcfs user.cfg), so each node's
// daemon has a token of its own and setting up one node never replaces
// the secret another node's daemon holds.
func TokenName(node string) string { return TokenPrefix + node }

// TokenID is the full id of node's default token, as ACLs and the API
// name it.
func TokenID(node string) string { return User + "!" + TokenName(node) }

// NodeName is the name Proxmox gives the node whose host name is host:
// the host name without its domain (pve-common INotify.pm nodename).
func NodeName(host string) string {
	name, _, _ := strings.Cut(host, ".")
	return name
}

// Role names.
const (
	// RoleMain is granted on the pool (and so on its VMs and storages) and
	// on /sdn, both propagating; RoleNoAccess on LocalZonePath keeps it
	// from the host's bridges.
	RoleMain = "PVEInspect"
	// RoleNode is granted on /nodes/NODE only: the node firewall.
	RoleNode = "PVEInspectNode"
	// RoleCluster is granted on "/" without propagation: reading the
	// cluster firewall switch.
	RoleCluster = "PVEInspectCluster"
	// RoleTemplate is granted on each template (/vms/ID) without
	// propagation.
	RoleTemplate = "PVEInspectTemplate"
	// RoleTransfer is granted on /storage/TRANSFER without propagation:
	// freeing a transfer image.
	RoleTransfer = "PVEInspectTransfer"
	// RoleBridge is granted without propagation on each path below
	// LocalZonePath a template's NIC is checked on (a clone checks every
	// NIC of its template): using that one host bridge.
	RoleBridge = "PVEInspectBridge"
	// RoleNoAccess is Proxmox's built-in role without privileges
	// (pve-access-control AccessControl.pm): granted on LocalZonePath
	// with propagation, it takes /sdn's roles away from every host
	// bridge, the more specific RoleBridge grants excepted.
	RoleNoAccess = "NoAccess"
)

// LocalZone is the zone pve-guest-common's check_vnet_access names a NIC's
// bridge with when the bridge is no SDN vnet: a host's own Linux bridge
// (vmbr0). No SDN zone can have the name (pve-sdn-zone-id is at most 8
// characters).
const LocalZone = "localnetwork"

// LocalZonePath is the ACL path of LocalZone: SDN.Use on
// LocalZonePath/<bridge> lets a VM's NIC onto that host bridge.
const LocalZonePath = "/sdn/zones/" + LocalZone

// ACL path placeholders of Call.ACLPath and Grant.Path.
const (
	// PhNode is the daemon's node.
	PhNode = "{node}"
	// PhPool is the daemon's pool.
	PhPool = "{pool}"
	// PhVMID is a sandbox VM (a member of the pool).
	PhVMID = "{vmid}"
	// PhTemplate is a template VM.
	PhTemplate = "{template}"
	// PhStorage is a storage of a template's or a sandbox's disks (a pool
	// member).
	PhStorage = "{storage}"
	// PhTransfer is the transfer storage (a pool member).
	PhTransfer = "{transfer}"
	// PhZone is an SDN zone of the daemon.
	PhZone = "{zone}"
	// PhVNet is an SDN vnet of the daemon.
	PhVNet = "{vnet}"
	// PhBridge is the path below LocalZonePath a template's NIC on a
	// host bridge is checked on: "<bridge>", or "<bridge>/<tag>" for a
	// VLAN (NICPaths).
	PhBridge = "{bridge}"
	// PhTemplateVNet is the path below /sdn/zones a template's NIC on an
	// SDN vnet is checked on: "<zone>/<vnet>", or "<zone>/<vnet>/<tag>"
	// (NICPaths).
	PhTemplateVNet = "{template-vnet}"
)

// Call is one privilege check Proxmox makes for one API call of the daemon.
// A call with several checks (a clone checks the template, the target and
// each storage) has one Call per check, all with the same Method and Path.
type Call struct {
	// Method is the HTTP method.
	Method string
	// Path is the API path template as in the Proxmox API schema
	// ("/nodes/{node}/qemu/{vmid}/clone").
	Path string
	// ACLPath is the ACL path checked, with Ph* placeholders; "" when the
	// call needs no privilege (the schema's user => 'all', the handler
	// checking nothing the daemon reaches).
	ACLPath string
	// Privs are the privileges checked on ACLPath.
	Privs []string
	// AnyOf: one of Privs suffices (else all are needed).
	AnyOf bool
	// Why says what the daemon uses the call for and where Proxmox checks.
	Why string
}

// Role is a Proxmox role pve-access-setup creates.
type Role struct {
	// Name is the role id.
	Name string
	// Privs are its privileges, sorted.
	Privs []string
}

// Grant is an ACL entry pve-access-setup creates, for the user and the
// token alike.
type Grant struct {
	// Path is the ACL path with Ph* placeholders.
	Path string
	// Role is the role granted.
	Role string
	// Propagate: the role reaches the paths below.
	Propagate bool
}

// ACLEntry is a Grant made concrete for one node.
type ACLEntry struct {
	// Path is the ACL path.
	Path string
	// Role is the role granted.
	Role string
	// Propagate: the role reaches the paths below.
	Propagate bool
}

const (
	qemu    = "/nodes/{node}/qemu/{vmid}"
	lxc     = "/nodes/{node}/lxc/{vmid}"
	vmACL   = "/vms/" + PhVMID
	content = "/nodes/{node}/storage/{storage}/content"
)

// Calls returns every Proxmox call pveapi.Client makes (the daemon's and
// `pve-inspectd doctor`'s), one entry per privilege check, in the
// client's order. SetClusterFirewall is root's (Sys.Modify on "/"), not
// the token's, and is not listed.
func Calls() []Call {
	const (
		tplBridge = LocalZonePath + "/" + PhBridge
		tplVNet   = "/sdn/zones/" + PhTemplateVNet
		ownVNet   = "/sdn/zones/" + PhZone + "/" + PhVNet
	)
	audit := []string{"SDN.Audit", "SDN.Allocate"}
	dsList := []string{"Datastore.Audit", "Datastore.AllocateSpace"}
	return []Call{
		{"GET", "/version", "", nil, false, "Proxmox version (doctor); user => 'all'"},
		{"GET", "/access/permissions", "", nil, false, "the token's own effective privileges (doctor); a token may read its own"},
		{"GET", "/cluster/nextid", "", nil, false, "a free VMID for a clone, and with vmid=N whether N is free cluster-wide; user => 'all'"},
		{"GET", "/cluster/resources", "", nil, false, "pools of the node's VMs and CTs; user => 'all', lists only guests with VM.Audit"},
		{"GET", "/nodes/{node}/qemu", "", nil, false, "the node's VMs and templates; user => 'all', lists only VMs with VM.Audit"},
		{"GET", "/nodes/{node}/qemu/{vmid}/config", vmACL, []string{"VM.Audit"}, false, "a sandbox's config (disk keys, hardening check; with current=1 the values in effect, for the disk path)"},
		{"GET", "/nodes/{node}/qemu/{vmid}/config", "/vms/" + PhTemplate, []string{"VM.Audit"}, false, "a template's config (hardening check before a clone; the doctor's template checks)"},
		{"GET", "/nodes/{node}/qemu/{vmid}/status/current", vmACL, []string{"VM.Audit"}, false, "a sandbox's live status"},
		{"POST", "/nodes/{node}/qemu/{vmid}/clone", "/vms/" + PhTemplate, []string{"VM.Clone"}, false, "linked clone of a template (schema check)"},
		{"POST", "/nodes/{node}/qemu/{vmid}/clone", "/pool/" + PhPool, []string{"VM.Allocate"}, false, "the clone's target pool (schema check, or VM.Allocate on /vms/{newid})"},
		{"POST", "/nodes/{node}/qemu/{vmid}/clone", "/storage/" + PhStorage, []string{"Datastore.AllocateSpace"}, false, "every storage of the template's disks (check_storage_access_clone)"},
		{"POST", "/nodes/{node}/qemu/{vmid}/clone", tplBridge, []string{"SDN.Use"}, false, "every NIC of the template on a host bridge (check_bridge_access: check_vnet_access's zone is localnetwork for a bridge that is no SDN vnet; /<tag> for a VLAN)"},
		{"POST", "/nodes/{node}/qemu/{vmid}/clone", tplVNet, []string{"SDN.Use"}, false, "every NIC of the template on an SDN vnet (check_bridge_access: the vnet's zone in vnets.cfg)"},
		{"POST", qemu + "/config", vmACL, []string{"VM.Config.CPU"}, false, "cores, cpu -nested-virt (check_vm_modify_config_perm)"},
		{"POST", qemu + "/config", vmACL, []string{"VM.Config.Memory"}, false, "memory, balloon=0 (check_vm_modify_config_perm)"},
		{"POST", qemu + "/config", vmACL, []string{"VM.Config.Network"}, false, "net0.. on the sandbox's vnets, each of the model asked for (virtio, e1000), deleting the template's other NICs (check_vm_modify_config_perm)"},
		{"POST", qemu + "/config", ownVNet, []string{"SDN.Use"}, false, "the vnet of each new NIC (check_bridge_access)"},
		{"POST", qemu + "/config", tplBridge, []string{"SDN.Use"}, false, "the template's NICs on a host bridge that each new NIC replaces or each delete removes (update_vm_api's worker: check_bridge_access on the NIC's old value)"},
		{"POST", qemu + "/config", tplVNet, []string{"SDN.Use"}, false, "the template's NICs on an SDN vnet that each new NIC replaces or each delete removes (check_bridge_access on the old value)"},
		{"POST", qemu + "/config", vmACL, []string{"VM.Config.HWType"}, false, "hardening: vga, serial0=socket, tablet, machine, audio0, watchdog, spice usb (check_vm_modify_config_perm, check_usb_perm, serial delete)"},
		{"POST", qemu + "/config", vmACL, []string{"VM.Config.CDROM"}, false, "hardening: deleting CD-ROM drives (check_drive_perms on delete)"},
		{"POST", qemu + "/config", vmACL, []string{"VM.Config.Cloudinit", "VM.Config.CDROM"}, false, "hardening: deleting a template's cloud-init drive (check_drive_perms: drive_is_cloudinit needs both)"},
		{"POST", qemu + "/config", vmACL, []string{"VM.Config.Disk"}, false, "hardening: deleting tpmstate0 (check_drive_perms on delete)"},
		{"POST", qemu + "/config", vmACL, []string{"VM.Config.Options"}, false, "hardening: ostype, agent (enabled=1, or 0 in the configure step for a VM created with agent false: a general option); tags (assert_tag_permissions: VM.Config.Options, and with the datacenter's default user-tag-access \"free\" any tag)"},
		{"POST", qemu + "/config", vmACL, []string{"VM.Config.Disk"}, false, "attach and detach a transfer image, revert a failed hot-plug left pending and delete the unusedN it leaves (check_drive_perms; the image is the VM's own, so check_volume_access needs no storage privilege)"},
		{"POST", qemu + "/config", "/storage/" + PhTransfer, []string{"Datastore.AllocateSpace"}, false, "free a transfer image through the VM's config: a forced detach, or deleting its unusedN (try_deallocate_drive)"},
		{"PUT", qemu + "/config", vmACL, []string{"VM.Config.Options"}, false, "a sandbox's name and tags in one synchronous update (update_vm_api as POST: name is a general option of check_vm_modify_config_perm; tags: assert_tag_permissions)"},
		{"PUT", qemu + "/resize", vmACL, []string{"VM.Config.Disk"}, false, "grow the boot disk (schema check)"},
		{"PUT", qemu + "/resize", "/storage/" + PhStorage, []string{"Datastore.AllocateSpace"}, false, "the boot disk's storage (resize_vm)"},
		{"POST", qemu + "/status/start", vmACL, []string{"VM.PowerMgmt"}, false, "start a sandbox"},
		{"POST", qemu + "/status/stop", vmACL, []string{"VM.PowerMgmt"}, false, "stop a sandbox"},
		{"DELETE", qemu, vmACL, []string{"VM.Allocate"}, false, "destroy a sandbox with purge (schema check); purge takes it out of the pool"},
		{"POST", qemu + "/snapshot", vmACL, []string{"VM.Snapshot"}, false, "disk snapshot"},
		{"POST", qemu + "/snapshot/{snapname}/rollback", vmACL, []string{"VM.Snapshot", "VM.Snapshot.Rollback"}, true, "rollback (schema check)"},
		{"POST", qemu + "/snapshot/{snapname}/rollback", vmACL, []string{"VM.PowerMgmt"}, false, "rollback with start=1"},
		{"GET", "/nodes/{node}/lxc", "", nil, false, "the node's containers and CT templates (pve-container API2/LXC.pm vmlist); user => 'all', lists only CTs with VM.Audit"},
		{"GET", lxc + "/status/current", vmACL, []string{"VM.Audit"}, false, "a sandbox CT's live status (API2/LXC/Status.pm vm_status)"},
		{"GET", lxc + "/config", vmACL, []string{"VM.Audit"}, false, "a sandbox CT's config (its NICs before the configure; the hardening check: unprivileged, features, mpN, devN) (API2/LXC/Config.pm vm_config)"},
		{"GET", lxc + "/config", "/vms/" + PhTemplate, []string{"VM.Audit"}, false, "a CT template's config (hardening check before a clone)"},
		{"POST", lxc + "/clone", "/vms/" + PhTemplate, []string{"VM.Clone"}, false, "linked clone of a CT template (API2/LXC.pm clone_vm, schema check)"},
		{"POST", lxc + "/clone", "/pool/" + PhPool, []string{"VM.Allocate"}, false, "the CT clone's target pool (schema check, or VM.Allocate on /vms/{newid})"},
		{"POST", lxc + "/clone", "/storage/" + PhStorage, []string{"Datastore.AllocateSpace"}, false, "the storage of the CT template's rootfs (clone_vm, for each volume)"},
		{"POST", lxc + "/clone", tplBridge, []string{"SDN.Use"}, false, "every NIC of the CT template on a host bridge (clone_vm: PVE::LXC check_bridge_access)"},
		{"POST", lxc + "/clone", tplVNet, []string{"SDN.Use"}, false, "every NIC of the CT template on an SDN vnet (check_bridge_access)"},
		{"PUT", lxc + "/config", vmACL, []string{"VM.Config.CPU"}, false, "a CT's cores (API2/LXC/Config.pm update_vm: PVE::LXC check_ct_modify_config_perm)"},
		{"PUT", lxc + "/config", vmACL, []string{"VM.Config.Memory"}, false, "a CT's memory and swap (check_ct_modify_config_perm)"},
		{"PUT", lxc + "/config", vmACL, []string{"VM.Config.Network"}, false, "a CT's hostname, net0.. on the sandbox's vnets, deleting the template's other NICs (check_ct_modify_config_perm)"},
		{"PUT", lxc + "/config", ownVNet, []string{"SDN.Use"}, false, "the vnet of each new CT NIC (check_ct_modify_config_perm: check_bridge_access on the new value)"},
		{"PUT", lxc + "/config", tplBridge, []string{"SDN.Use"}, false, "the CT template's NICs on a host bridge that each new NIC replaces or each delete removes (check_bridge_access on the old value)"},
		{"PUT", lxc + "/config", tplVNet, []string{"SDN.Use"}, false, "the CT template's NICs on an SDN vnet that each new NIC replaces or each delete removes (check_bridge_access on the old value)"},
		{"PUT", lxc + "/config", vmACL, []string{"VM.Config.Options"}, false, "a CT's tags (check_ct_modify_config_perm: assert_tag_permissions)"},
		{"POST", lxc + "/status/start", vmACL, []string{"VM.PowerMgmt"}, false, "start a sandbox CT (API2/LXC/Status.pm vm_start)"},
		{"POST", lxc + "/status/stop", vmACL, []string{"VM.PowerMgmt"}, false, "stop a sandbox CT (vm_stop)"},
		{"DELETE", lxc, vmACL, []string{"VM.Allocate"}, false, "destroy a sandbox CT with purge and force (API2/LXC.pm destroy_vm, schema check); its ACLs and pool membership go in any case"},
		{"POST", lxc + "/snapshot", vmACL, []string{"VM.Snapshot"}, false, "CT snapshot (API2/LXC/Snapshot.pm snapshot)"},
		{"POST", lxc + "/snapshot/{snapname}/rollback", vmACL, []string{"VM.Snapshot", "VM.Snapshot.Rollback"}, true, "CT rollback (Snapshot.pm rollback, schema check; the client starts the CT itself, not with start=1)"},
		{"GET", "/cluster/sdn/zones", "/sdn/zones/" + PhZone, audit, true, "pending zone edits of other clients before an apply, the doctor's SDN check and canary, the type of a shared vnet's zone (pending=1); user => 'all', lists only zones with SDN.Audit or SDN.Allocate"},
		{"POST", "/cluster/sdn/zones", "/sdn/zones", []string{"SDN.Allocate"}, false, "create the sandbox's zone"},
		{"DELETE", "/cluster/sdn/zones/{zone}", "/sdn/zones/" + PhZone, []string{"SDN.Allocate"}, false, "delete the sandbox's zone"},
		{"GET", "/cluster/sdn/vnets", ownVNet, audit, true, "list vnets (pending=1); user => 'all', lists only vnets with SDN.Audit or SDN.Allocate"},
		{"GET", "/cluster/sdn/vnets", tplVNet, audit, true, "the doctor: which template NICs are on SDN vnets, and their zones (vnets.cfg, as check_vnet_access reads it)"},
		{"POST", "/cluster/sdn/vnets", "/sdn/zones/" + PhZone, []string{"SDN.Allocate"}, false, "create the sandbox's vnet"},
		{"DELETE", "/cluster/sdn/vnets/{vnet}", ownVNet, []string{"SDN.Allocate"}, false, "delete the sandbox's vnet (check_vnet_access)"},
		{"GET", "/cluster/sdn/vnets/{vnet}/subnets", ownVNet, audit, true, "list a vnet's subnets, pending=1 (check_vnet_access)"},
		{"POST", "/cluster/sdn/vnets/{vnet}/subnets", ownVNet, []string{"SDN.Allocate"}, false, "create the sandbox's subnet (check_vnet_access)"},
		{"DELETE", "/cluster/sdn/vnets/{vnet}/subnets/{subnet}", ownVNet, []string{"SDN.Allocate"}, false, "delete the sandbox's subnet (check_vnet_access)"},
		{"GET", "/cluster/sdn/ipams/{ipam}/status", ownVNet, audit, true, "each VM's address on the sandbox's vnets (the API's addresses and the guests' /etc/hosts), IPAM entries left behind before a subnet delete, a fixed MAC's entries in every zone of the cluster (a create refuses a MAC another zone's NIC has: Proxmox caches a MAC's address cluster-wide), the doctor's IPAM check; user => 'all', lists only the entries of subnets whose vnet has SDN.Audit or SDN.Allocate (of zones with ipam pve and dhcp)"},
		{"POST", "/cluster/sdn/vnets/{vnet}/ips", ownVNet, []string{"SDN.Allocate"}, false, "reserve a NIC's fixed address for its MAC (pve-network API2/Network/SDN/Ips.pm ipcreate)"},
		{"DELETE", "/cluster/sdn/vnets/{vnet}/ips", ownVNet, []string{"SDN.Allocate"}, false, "delete a leftover IPAM entry, and the DHCP-range address the configure gave a NIC of a fixed address (Ips.pm ipdelete)"},
		{"PUT", "/cluster/sdn", "/sdn", []string{"SDN.Allocate"}, false, "apply the SDN configuration"},
		{"GET", "/pools", "/pool/" + PhPool, []string{"Pool.Audit"}, false, "find the pool (pve-access-setup creates it; the token cannot, Pool.Allocate); user => 'all', lists only pools with Pool.Audit"},
		{"GET", "/pools/{poolid}", "/pool/" + PhPool, []string{"Pool.Audit"}, false, "the doctor: the pool's storages (schema check)"},
		{"GET", "/storage", "/storage/" + PhStorage, dsList, true, "the doctor: the templates' storages' content types; user => 'all', lists only storages with Datastore.Audit or Datastore.AllocateSpace"},
		{"GET", "/storage", "/storage/" + PhTransfer, dsList, true, "the doctor: the transfer storage's content types (what its Datastore.Allocate reaches, whether its images are listed)"},
		{"GET", "/nodes/{node}/storage", "/storage/" + PhStorage, dsList, true, "the doctor: are the templates' storages active on the node; user => 'all', lists only storages with Datastore.Audit or Datastore.AllocateSpace"},
		{"GET", "/nodes/{node}/storage", "/storage/" + PhTransfer, dsList, true, "the doctor: is the transfer storage active on the node"},
		{"GET", content, "/storage/" + PhTransfer, dsList, true, "leftover transfer images (content=images; the doctor's canary with vmid=N) (schema check); each volume listed only when check_volume_access passes: Datastore.Allocate on the storage"},
		{"POST", content, "/storage/" + PhTransfer, []string{"Datastore.AllocateSpace"}, false, "allocate a transfer image (schema check)"},
		{"GET", content + "/{volume}", "/storage/" + PhTransfer, []string{"Datastore.Audit"}, false, "a transfer image's path (check_volume_access: Datastore.Audit and VM.Config.Disk on the owner, or Datastore.Allocate)"},
		{"GET", content + "/{volume}", vmACL, []string{"VM.Config.Disk"}, false, "a transfer image's owner (check_volume_access)"},
		{"DELETE", content + "/{volume}", "/storage/" + PhTransfer, []string{"Datastore.Allocate"}, false, "free a transfer image (Content.pm delete)"},
		{"GET", "/nodes", "", nil, false, "the doctor: the cluster's nodes (the node name, each node's staged network edits); user => 'all'"},
		{"GET", "/nodes/{node}/network", "", nil, false, "the doctor: staged host network edits (the \"changes\" of interfaces.new an apply would make live), and with type=any_local_bridge the host bridges the token may use; user => 'all', lists only bridges with SDN.Audit or SDN.Use on " + LocalZonePath + "/<bridge> (or a VLAN of it)"},
		{"GET", "/nodes/{node}/firewall/rules", "/nodes/" + PhNode, []string{"Sys.Audit"}, false, "the management-port rules"},
		{"POST", "/nodes/{node}/firewall/rules", "/nodes/" + PhNode, []string{"Sys.Modify"}, false, "add a management-port rule"},
		{"DELETE", "/nodes/{node}/firewall/rules/{pos}", "/nodes/" + PhNode, []string{"Sys.Modify"}, false, "delete a management-port rule (with the digest of the list it was read from)"},
		{"GET", "/nodes/{node}/firewall/options", "/nodes/" + PhNode, []string{"Sys.Audit"}, false, "is the node firewall on"},
		{"PUT", "/nodes/{node}/firewall/options", "/nodes/" + PhNode, []string{"Sys.Modify"}, false, "turn the node firewall on"},
		{"GET", "/cluster/firewall/options", "/", []string{"Sys.Audit"}, false, "is the cluster firewall on (root turns it on: pve-access-setup)"},
		{"GET", "/nodes/{node}/tasks/{upid}/status", "", nil, false, "the daemon's own tasks; another user's need Sys.Audit on /nodes/{node}"},
		{"GET", "/nodes/{node}/tasks/{upid}/log", "", nil, false, "the daemon's own task logs"},
	}
}

// Roles returns the roles pve-access-setup creates, privileges sorted.
func Roles() []Role {
	return []Role{
		{RoleMain, sorted(
			"VM.Allocate", "VM.Audit", "VM.PowerMgmt", "VM.Snapshot", "VM.Snapshot.Rollback",
			"VM.Config.CPU", "VM.Config.Memory", "VM.Config.Disk", "VM.Config.Network", "VM.Config.Options",
			"VM.Config.HWType", "VM.Config.CDROM", "VM.Config.Cloudinit",
			"Datastore.AllocateSpace", "Datastore.Audit",
			"SDN.Allocate", "SDN.Audit", "SDN.Use",
			"Pool.Audit")},
		{RoleNode, sorted("Sys.Audit", "Sys.Modify")},
		{RoleCluster, sorted("Sys.Audit")},
		{RoleTemplate, sorted("VM.Audit", "VM.Clone")},
		{RoleTransfer, sorted("Datastore.Allocate")},
		{RoleBridge, sorted("SDN.Use")},
	}
}

// Grants returns the ACL entries pve-access-setup creates for the user and
// for the token; a RoleTemplate grant on /vms/{template} stands for one per
// template, a RoleBridge grant on LocalZonePath/{bridge} for one per path
// a template's NIC on a host bridge is checked on.
//
// Proxmox takes a subject's roles on a path from the most specific path
// of its chain with an entry for the subject that is the path itself or
// propagates, and a set with NoAccess gives nothing (pve-access-control
// AccessControl.pm roles): /sdn's role reaches every zone and vnet, the
// propagating NoAccess on LocalZonePath takes it from every host bridge,
// and each RoleBridge entry, more specific, gives SDN.Use back on its
// path alone.
func Grants() []Grant {
	return []Grant{
		{"/pool/" + PhPool, RoleMain, true},
		{"/sdn", RoleMain, false},
		{"/sdn/zones", RoleMain, true},
		{LocalZonePath, RoleNoAccess, true},
		{LocalZonePath + "/" + PhBridge, RoleBridge, false},
		{"/nodes/" + PhNode, RoleNode, false},
		{"/", RoleCluster, false},
		{"/storage/" + PhTransfer, RoleTransfer, false},
		{"/vms/" + PhTemplate, RoleTemplate, false},
	}
}

// PoolStorages returns the storages pve-access-setup adds to the pool
// without a transfer storage: the templates' disk storages
// (DefaultStorage when none is given), sorted, without repeats.
func PoolStorages(storages ...string) []string {
	return Setup{}.PoolStorages(storages...)
}

// PoolStorages is the package's PoolStorages with the run's transfer
// storage, when it names one.
func (s Setup) PoolStorages(storages ...string) []string {
	if len(storages) == 0 {
		storages = []string{DefaultStorage}
	}
	out := slices.Clone(storages)
	if s.Transfer != "" {
		out = append(out, s.Transfer)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// ACLEntries returns the concrete ACL entries pve-access-setup creates on
// node for pool ("" is DefaultPool), the template VMIDs and their NICs'
// host bridge paths (TemplateBridges), each for the user and the token
// alike, in Grants order, without a transfer storage.
func ACLEntries(node, pool string, templates []int, bridges []string) []ACLEntry {
	return Setup{Node: node, Pool: pool, Templates: templates, Bridges: bridges}.ACLEntries()
}

// Setup is one run of pve-access-setup: its node and environment.
type Setup struct {
	// Node is the node's name (hostname).
	Node string
	// Pool is PVE_INSPECTD_POOL ("": DefaultPool).
	Pool string
	// Templates is PVE_INSPECTD_TEMPLATES.
	Templates []int
	// Bridges are the paths below LocalZonePath the templates' NICs on
	// host bridges are checked on (TemplateBridges of their configs):
	// "vmbr0", "vmbr0/5".
	Bridges []string
	// Transfer is PVE_INSPECTD_TRANSFER_STORAGE, the daemon's [api]
	// disk_transfer_storage ("": none, no grant for one).
	Transfer string
}

// ACLEntries returns the concrete ACL entries of the run, each for the
// user and the token alike, in Grants order.
func (s Setup) ACLEntries() []ACLEntry {
	pool := s.Pool
	if pool == "" {
		pool = DefaultPool
	}
	r := strings.NewReplacer(PhNode, s.Node, PhPool, pool, PhTransfer, s.Transfer)
	var out []ACLEntry
	for _, g := range Grants() {
		if strings.Contains(g.Path, PhTransfer) && s.Transfer == "" {
			continue
		}
		if strings.Contains(g.Path, PhTemplate) {
			for _, id := range s.Templates {
				out = append(out, ACLEntry{strings.ReplaceAll(g.Path, PhTemplate, strconv.Itoa(id)), g.Role, g.Propagate})
			}
			continue
		}
		if strings.Contains(g.Path, PhBridge) {
			for _, b := range s.Bridges {
				out = append(out, ACLEntry{strings.ReplaceAll(g.Path, PhBridge, b), g.Role, g.Propagate})
			}
			continue
		}
		out = append(out, ACLEntry{r.Replace(g.Path), g.Role, g.Propagate})
	}
	return out
}

// RolePrivs returns the privileges of the role name, nil when the table has
// no such role (and for RoleNoAccess, which has none).
func RolePrivs(name string) []string {
	for _, r := range Roles() {
		if r.Name == name {
			return r.Privs
		}
	}
	return nil
}

func sorted(p ...string) []string {
	slices.Sort(p)
	return p
}
