package access

import (
	"fmt"
	"slices"
	"strings"
)

// GrantOf returns the grant that gives call c its privileges on a node
// set up by pve-access-setup: the pool's for its VMs, its member storages
// and itself, the bridge role's for a template NIC's host bridge,
// /sdn/zones' for every zone and vnet path, and each of the others (/sdn
// itself among them: the apply) for its own path; the
// transfer storage is a pool member too, so a call there is the transfer
// role's when that role holds what it needs, else the pool's. ok is false
// for a call that needs no privilege.
func GrantOf(c Call) (g Grant, ok bool) {
	p := c.ACLPath
	var want []string
	switch {
	case p == "":
		return Grant{}, false
	case p == "/vms/"+PhVMID, p == "/pool/"+PhPool, p == "/storage/"+PhStorage:
		want = []string{"/pool/" + PhPool}
	case p == "/storage/"+PhTransfer:
		want = []string{p, "/pool/" + PhPool}
	case strings.HasPrefix(p, LocalZonePath+"/"):
		want = []string{LocalZonePath + "/" + PhBridge}
	case p == "/sdn/zones" || strings.HasPrefix(p, "/sdn/zones/"):
		want = []string{"/sdn/zones"}
	default:
		want = []string{p}
	}
	for _, w := range want {
		for _, g := range Grants() {
			if g.Path == w && covers(RolePrivs(g.Role), c) {
				return g, true
			}
		}
	}
	return Grant{}, false
}

// covers reports whether privs hold what call c needs.
func covers(privs []string, c Call) bool {
	n := 0
	for _, p := range c.Privs {
		if slices.Contains(privs, p) {
			n++
		}
	}
	if c.AnyOf {
		return n > 0
	}
	return n == len(c.Privs)
}

// alsoAllows is what each grant lets the token do beyond the daemon's
// calls, by grant path: what a stolen token could do with it.
var alsoAllows = map[string]string{
	"/pool/" + PhPool:              "every one of these privileges on any VM, container and storage put in the pool, whoever put it there (keep other guests out of the pool): power, config (CPU, memory, disks, NICs, options, hardware, CD-ROM, cloud-init), snapshots and rollback, destroy; turning an unprivileged container's nesting feature on (VM.Allocate: pve-container's check_ct_modify_config_perm leaves only the other features to root); space on the pool's storages",
	"/sdn":                         "apply the whole pending SDN configuration of the cluster, every client's edits with it; not propagating: no IPAM, DNS, controller or fabric definition (an external IPAM or DNS server, FRR peers) is reachable",
	"/sdn/zones":                   "create, change and delete any SDN zone, vnet and subnet of the cluster, of any type (a VLAN, QinQ or VXLAN zone on a host bridge or towards peers it names, which no ACL below can stop), and SDN.Use on every SDN vnet (another tenant's too) and on a vnet it names like a host bridge and deletes again before a start (qemu-server plugs the NIC into the host bridge of that name): a stolen token can still put a pool VM on the host's networks, and a NIC with no bridge gets QEMU's user-mode network (the host's own traffic); the doctor's pool-VM check fails on a pool VM whose NIC is not on its own sandbox vnet. Not on the host's bridges by name (the next rows)",
	LocalZonePath:                  "nothing: NoAccess, propagating, takes /sdn/zones' role from every host bridge (`" + LocalZonePath + "/<bridge>`, VLANs included); without it a pool VM could be put on `vmbr0` or any other bridge of the host",
	LocalZonePath + "/" + PhBridge: "put a pool VM's NIC on that one host bridge (VLAN): the one a template's NIC is on (every NIC of a template must be usable to clone it, and replacing or deleting it checks it again), `vmbr0` for the usual templates; give the templates no NIC, or one on a bridge of its own without uplink, and this grant reaches nothing else (pve-access-setup grants exactly the templates' NIC paths and takes back the token's others)",
	"/nodes/" + PhNode:             "Sys.Modify on the node beyond its firewall: stage and apply edits of the host network, start, stop and restart its services, replace its TLS certificate, refresh APT lists, set node options, stop any user's running task on the node (a backup, a migration, another client's download: pve-manager Tasks.pm stop_task wants Sys.Modify on the node of a caller that is not the task's owner; the daemon stops no task with the token, a template build stops its own download as its builder_user); Sys.Audit: read the node's status and its tasks",
	"/":                            "read the datacenter options and the cluster firewall's options and rules (Sys.Audit on `/` only, not propagating)",
	"/storage/" + PhTransfer:       "read, free and attach any volume of that storage (pve-storage's check_volume_access returns early for Datastore.Allocate): name a storage holding nothing but transfer images",
	"/vms/" + PhTemplate:           "clone the template and read its config; nothing else on it",
}

// GrantTable is the table of every grant pve-access-setup makes: its path,
// role and privileges, the daemon's calls that need it, and what else it
// allows (markdown).
func GrantTable() string {
	var b strings.Builder
	b.WriteString("| ACL path | role (propagates) | privileges | the daemon's calls that need it | what else it allows |\n|---|---|---|---|---|\n")
	for _, g := range Grants() {
		var calls []string
		for _, c := range Calls() {
			if cg, ok := GrantOf(c); ok && cg == g {
				calls = append(calls, fmt.Sprintf("`%s %s` (%s on `%s`)", c.Method, c.Path, strings.Join(c.Privs, anyOr(c.AnyOf)), c.ACLPath))
			}
		}
		calls = slices.Compact(calls)
		prop := "no"
		if g.Propagate {
			prop = "yes"
		}
		privs := strings.Join(RolePrivs(g.Role), ", ")
		if privs == "" {
			privs = "none"
		}
		if len(calls) == 0 {
			calls = []string{"none"}
		}
		fmt.Fprintf(&b, "| `%s` | %s (%s) | %s | %s | %s |\n", g.Path, g.Role, prop, privs,
			strings.Join(calls, "; "), alsoAllows[g.Path])
	}
	var free []string
	for _, c := range Calls() {
		if _, ok := GrantOf(c); !ok {
			free = append(free, fmt.Sprintf("`%s %s`", c.Method, c.Path))
		}
	}
	fmt.Fprintf(&b, "\nCalls that need no grant (open to every user, or the caller's own): %s.\n", strings.Join(slices.Compact(free), ", "))
	return b.String()
}

func anyOr(anyOf bool) string {
	if anyOf {
		return " or "
	}
	return " and "
}
