package doctor

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/pve-inspect/pve-inspect/pveapi/access"
	"github.com/pve-inspect/pve-inspect/sandbox"
)

// API is what the read-only checks need of Proxmox: a GET of an API path
// (relative to /api2/json, query included) decoded into v.
type API interface {
	Get(ctx context.Context, path string, v any) error
}

// Node is what the checks compare the node against: the daemon's
// configuration.
type Node struct {
	// Name is the Proxmox node; Pool the sandboxes' pool; TokenID the
	// daemon's API token.
	Name, Pool, TokenID string
	// Templates maps template names to VM ids ([api] templates).
	Templates map[string]int
	// TransferStorage is [api] disk_transfer_storage ("" = the disk path
	// is off).
	TransferStorage string
	// RequireHardened is [api] require_hardened_templates.
	RequireHardened bool
	// MinMajor is the oldest Proxmox VE major version supported.
	MinMajor int
	// SharedVNets are [api] shared_vnets: vnets of the operator's a
	// sandbox VM's NIC may be on.
	SharedVNets []string
}

// templateIDs returns the templates' ids, sorted, without repeats.
func (n Node) templateIDs() []int {
	var ids []int
	for _, id := range n.Templates {
		if !slices.Contains(ids, id) {
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids
}

// VersionCheck reads GET /version and wants at least n.MinMajor.
func VersionCheck(px API, n Node) Check {
	return Check{Name: "proxmox version", Run: func(ctx context.Context) Outcome {
		var v struct {
			Version string `json:"version"`
			Release string `json:"release"`
			RepoID  string `json:"repoid"`
		}
		if err := px.Get(ctx, "/version", &v); err != nil {
			return failf("check [api.proxmox] url, ca_file, token_id and the secret file; is pveproxy running?", "GET /version: %v", err)
		}
		major, err := strconv.Atoi(strings.SplitN(v.Version, ".", 2)[0])
		if err != nil {
			return failf("report this: the daemon cannot tell the Proxmox version", "version %q: not a version", v.Version)
		}
		if major < n.MinMajor {
			return failf(fmt.Sprintf("upgrade the node to Proxmox VE %d or newer", n.MinMajor), "Proxmox VE %s: the daemon needs %d or newer", v.Version, n.MinMajor)
		}
		return passf("Proxmox VE %s (repoid %s)", v.Version, v.RepoID)
	}}
}

// rePlaceholder matches a path segment such as {zone}.
var rePlaceholder = regexp.MustCompile(`\{[a-z_-]+\}`)

// scope is what the placeholders of the call table stand for on this node.
type scope struct {
	n        Node
	storages []string // the templates' disk storages
	// bridges are the paths below access.LocalZonePath the templates'
	// NICs on host bridges are checked on, vnets those below /sdn/zones
	// of their NICs on SDN vnets (access.TemplateBridges).
	bridges, vnets []string
}

// aclPaths expands an ACL path template (access.Ph*) into the concrete
// paths to ask about: {node} and {pool} are the node's; {template} every
// configured template; {vmid} a sandbox VM, whose privileges come from the
// pool (sandbox VMs are created into it, and a pool's ACL reaches its
// members: pve-access-control RPCEnvironment.pm compile_acl_path), so the
// pool's path; {storage} each template disk's storage; {transfer} the
// transfer storage (none when the disk path is off); {bridge} each
// template NIC's host bridge path, {template-vnet} each template NIC's
// vnet path. {zone} and {vnet} (objects the daemon creates later) end the
// path at their parent: the grant must propagate from there.
func (sc scope) aclPaths(c access.Call) []string {
	if c.ACLPath == "" {
		return nil
	}
	p := strings.NewReplacer(access.PhNode, sc.n.Name, access.PhPool, sc.n.Pool).Replace(c.ACLPath)
	each := func(ph string, vals []string) []string {
		var out []string
		for _, v := range vals {
			out = append(out, truncateAtPlaceholder(strings.ReplaceAll(p, ph, v)))
		}
		return out
	}
	switch {
	case strings.Contains(p, access.PhTemplate):
		var ids []string
		for _, id := range sc.n.templateIDs() {
			ids = append(ids, strconv.Itoa(id))
		}
		return each(access.PhTemplate, ids)
	case strings.HasPrefix(p, "/vms/"+access.PhVMID):
		return []string{"/pool/" + sc.n.Pool}
	case strings.Contains(p, access.PhStorage):
		return each(access.PhStorage, sc.storages)
	case strings.Contains(p, access.PhTransfer):
		if sc.n.TransferStorage == "" {
			return nil
		}
		return each(access.PhTransfer, []string{sc.n.TransferStorage})
	case strings.Contains(p, access.PhBridge):
		return each(access.PhBridge, sc.bridges)
	case strings.Contains(p, access.PhTemplateVNet):
		return each(access.PhTemplateVNet, sc.vnets)
	}
	return []string{truncateAtPlaceholder(p)}
}

func truncateAtPlaceholder(p string) string {
	loc := rePlaceholder.FindStringIndex(p)
	if loc == nil {
		return p
	}
	p = strings.TrimRight(p[:loc[0]], "/")
	if p == "" {
		return "/"
	}
	return p
}

// effectivePrivs asks GET /access/permissions for the token's privileges
// on one path (pve-access-control API2/AccessControl.pm permissions: a map
// path -> privilege -> propagate).
func effectivePrivs(ctx context.Context, px API, path string) (map[string]bool, error) {
	var m map[string]map[string]any
	if err := px.Get(ctx, "/access/permissions?path="+url.QueryEscape(path), &m); err != nil {
		return nil, err
	}
	out := map[string]bool{}
	for priv := range m[path] {
		out[priv] = true
	}
	return out, nil
}

// PrivilegeCheck compares the token's effective privileges with every
// call's needs.
func PrivilegeCheck(px API, n Node, calls []access.Call) Check {
	return Check{Name: "token privileges", Run: func(ctx context.Context) Outcome {
		if len(calls) == 0 {
			return failf("report this: the daemon was built without its privilege table", "no calls to check")
		}
		sc, err := newScope(ctx, px, n)
		if err != nil {
			return failf("make the templates readable by the token (see the template checks)", "%v", err)
		}
		cache := map[string]map[string]bool{}
		var missing []string
		var fixes []string
		checked := 0
		for _, c := range calls {
			for _, p := range sc.aclPaths(c) {
				have, ok := cache[p]
				if !ok {
					if have, err = effectivePrivs(ctx, px, p); err != nil {
						return failf("the token needs to read its own permissions (GET /access/permissions); check [api.proxmox] token_id", "GET /access/permissions?path=%s: %v", p, err)
					}
					cache[p] = have
				}
				checked++
				var lack []string
				for _, priv := range c.Privs {
					if !have[priv] {
						lack = append(lack, priv)
					}
				}
				if len(lack) == 0 || c.AnyOf && len(lack) < len(c.Privs) {
					continue
				}
				need := strings.Join(lack, ", ")
				if c.AnyOf {
					need = "one of " + strings.Join(c.Privs, ", ")
				}
				missing = append(missing, fmt.Sprintf("%s %s needs %s on %s (%s)", c.Method, c.Path, need, p, c.Why))
				fix := fmt.Sprintf("grant %s on %s to %s", strings.Join(lack, ","), p, n.TokenID)
				if !slices.Contains(fixes, fix) {
					fixes = append(fixes, fix)
				}
			}
		}
		if len(missing) > 0 {
			return failf("run pve-access-setup again, or "+strings.Join(fixes, "; ")+" (the token's user needs them too: a privilege-separated token gets only what both have)",
				"%d call(s) would be refused: %s", len(missing), strings.Join(missing, "; "))
		}
		return passf("%d calls on %d ACL paths: every privilege held", checked, len(cache))
	}}
}

// vmConfig reads a VM's config as strings.
func vmConfig(ctx context.Context, px API, node string, vmid int) (map[string]string, error) {
	var raw map[string]any
	if err := px.Get(ctx, fmt.Sprintf("/nodes/%s/qemu/%d/config", url.PathEscape(node), vmid), &raw); err != nil {
		return nil, fmt.Errorf("read config of %d: %w", vmid, err)
	}
	out := make(map[string]string, len(raw))
	for k, v := range raw {
		switch x := v.(type) {
		case string:
			out[k] = x
		case float64:
			out[k] = strconv.FormatFloat(x, 'f', -1, 64)
		default:
			out[k] = fmt.Sprint(x)
		}
	}
	return out, nil
}

// reDiskKey matches the config keys that hold a VM's disks.
var reDiskKey = regexp.MustCompile(`^(scsi|virtio|sata|ide|efidisk|tpmstate)\d+$`)

// diskStorages returns the storages of a config's disks (CD-ROMs and
// "none" excluded).
func diskStorages(conf map[string]string) []string {
	var out []string
	for k, v := range conf {
		if !reDiskKey.MatchString(k) || strings.Contains(v, "media=cdrom") {
			continue
		}
		vol, _, _ := strings.Cut(v, ",")
		sid, _, ok := strings.Cut(vol, ":")
		if !ok || sid == "" || slices.Contains(out, sid) {
			continue
		}
		out = append(out, sid)
	}
	slices.Sort(out)
	return out
}

// newScope reads the templates' disks and NICs, and for NICs the SDN
// vnets (GET /cluster/sdn/vnets: vnets.cfg, which check_vnet_access reads
// for a vnet's zone).
func newScope(ctx context.Context, px API, n Node) (scope, error) {
	sc := scope{n: n}
	var confs []map[string]string
	nics := false
	for _, id := range n.templateIDs() {
		conf, err := vmConfig(ctx, px, n.Name, id)
		if err != nil {
			return sc, err
		}
		for _, s := range diskStorages(conf) {
			if !slices.Contains(sc.storages, s) {
				sc.storages = append(sc.storages, s)
			}
		}
		for k := range conf {
			nics = nics || reNetKey.MatchString(k)
		}
		confs = append(confs, conf)
	}
	slices.Sort(sc.storages)
	if !nics {
		return sc, nil
	}
	var vnets []struct {
		VNet string `json:"vnet"`
		Zone string `json:"zone"`
	}
	if err := px.Get(ctx, "/cluster/sdn/vnets", &vnets); err != nil {
		return sc, fmt.Errorf("GET /cluster/sdn/vnets (which of the templates' NICs are on SDN vnets): %w", err)
	}
	zones := map[string]string{}
	for _, v := range vnets {
		zones[v.VNet] = v.Zone
	}
	sc.bridges, sc.vnets = access.TemplateBridges(confs, func(b string) string { return zones[b] })
	return sc, nil
}

// reNetKey matches the config keys of a VM's NICs.
var reNetKey = regexp.MustCompile(`^net\d+$`)

// StorageInfo is a storage as GET /storage describes it (its
// storage.cfg section).
type StorageInfo struct {
	// Storage is the id; Type the plugin (dir, lvmthin, zfspool, ...).
	Storage string `json:"storage"`
	Type    string `json:"type"`
	// Content lists the content types, comma-separated.
	Content string `json:"content"`
	// Path is a file storage's directory.
	Path string `json:"path"`
	// VGName and ThinPool name an LVM storage's volume group and thin
	// pool; Pool a ZFS storage's dataset.
	VGName   string `json:"vgname"`
	ThinPool string `json:"thinpool"`
	Pool     string `json:"pool"`
}

// hasContent says whether the storage allows a content type.
func (s StorageInfo) hasContent(c string) bool {
	return slices.Contains(strings.Split(s.Content, ","), c)
}

// Block says whether the storage's volumes are block devices (the disk
// path opens a device node) rather than files.
func (s StorageInfo) Block() bool {
	switch s.Type {
	case "dir", "nfs", "cifs", "glusterfs", "cephfs", "btrfs":
		return false
	}
	return true
}

// readStorage finds a storage in GET /storage: the storage.cfg sections
// the token may see (Datastore.Audit or Datastore.AllocateSpace;
// pve-storage API2/Storage/Config.pm index). GET /storage/{storage} would
// need Datastore.Allocate, which the token has on the transfer storage
// only.
func readStorage(ctx context.Context, px API, id string) (StorageInfo, error) {
	var all []StorageInfo
	if err := px.Get(ctx, "/storage", &all); err != nil {
		return StorageInfo{}, fmt.Errorf("GET /storage: %w", err)
	}
	for _, s := range all {
		if s.Storage == id {
			return s, nil
		}
	}
	return StorageInfo{}, fmt.Errorf("storage %s: not defined, or the token lacks Datastore.Audit on /storage/%s", id, id)
}

// StorageCheck wants every storage the daemon touches configured for VM
// images, active on this node, and in the pool (the pool's ACL reaches a
// storage only when it is a member).
func StorageCheck(px API, n Node) Check {
	return Check{Name: "storages", Run: func(ctx context.Context) Outcome {
		sc, err := newScope(ctx, px, n)
		if err != nil {
			return failf("make the templates readable by the token (see the template checks)", "%v", err)
		}
		ids := slices.Clone(sc.storages)
		if n.TransferStorage != "" && !slices.Contains(ids, n.TransferStorage) {
			ids = append(ids, n.TransferStorage)
		}
		if len(ids) == 0 {
			return skipf("no template and no transfer storage configured")
		}
		var nodeStorages []struct {
			Storage string `json:"storage"`
			Active  any    `json:"active"`
			Enabled any    `json:"enabled"`
		}
		if err := px.Get(ctx, "/nodes/"+url.PathEscape(n.Name)+"/storage", &nodeStorages); err != nil {
			return failf("the token needs Datastore.Audit on the storages", "GET /nodes/%s/storage: %v", n.Name, err)
		}
		active := map[string]bool{}
		for _, s := range nodeStorages {
			active[s.Storage] = truthy(s.Active)
		}
		var pool struct {
			Members []struct {
				Type    string `json:"type"`
				Storage string `json:"storage"`
			} `json:"members"`
		}
		if err := px.Get(ctx, "/pools/"+url.PathEscape(n.Pool), &pool); err != nil {
			return failf(fmt.Sprintf("create the pool: pveum pool add %s (pve-access-setup does)", n.Pool), "GET /pools/%s: %v", n.Pool, err)
		}
		inPool := map[string]bool{}
		for _, m := range pool.Members {
			if m.Type == "storage" {
				inPool[m.Storage] = true
			}
		}
		var bad, fixes, seen []string
		for _, id := range ids {
			s, err := readStorage(ctx, px, id)
			if err != nil {
				bad = append(bad, err.Error())
				fixes = append(fixes, fmt.Sprintf("define storage %s or change the template/disk_transfer_storage", id))
				continue
			}
			if slices.Contains(sc.storages, id) && !s.hasContent("images") {
				bad = append(bad, fmt.Sprintf("%s (%s) holds a template's disk but has content %q, without images: a clone cannot allocate there", id, s.Type, s.Content))
				fixes = append(fixes, fmt.Sprintf("pvesm set %s --content %s", id, strings.TrimPrefix(s.Content+",images", ",")))
			}
			if !active[id] {
				bad = append(bad, fmt.Sprintf("%s is not active on node %s", id, n.Name))
				fixes = append(fixes, fmt.Sprintf("enable %s on %s (pvesm set %s --disable 0, and its nodes list)", id, n.Name, id))
			}
			if !inPool[id] {
				bad = append(bad, fmt.Sprintf("%s is not in pool %s: the pool's ACL does not reach it", id, n.Pool))
				fixes = append(fixes, fmt.Sprintf("pveum pool modify %s --storage %s", n.Pool, id))
			}
			seen = append(seen, fmt.Sprintf("%s (%s, %s)", id, s.Type, s.Content))
		}
		if len(bad) > 0 {
			return failf(strings.Join(fixes, "; "), "%s", strings.Join(bad, "; "))
		}
		return passf("%s: active, in pool %s; the templates' storages allow images", strings.Join(seen, ", "), n.Pool)
	}}
}

// truthy reads Proxmox's booleans (1, "1", true).
func truthy(v any) bool {
	switch x := v.(type) {
	case bool:
		return x
	case float64:
		return x != 0
	case string:
		return x == "1" || x == "true"
	}
	return false
}

// SDNCheck reads the SDN zones and wants no pending edits of other
// clients: the daemon's PUT /cluster/sdn applies the whole pending
// configuration (pve-network API2/Network/SDN.pm reload), theirs too.
// Pending zones of pve-inspectd daemons (a sandbox id, or a vnet tagged
// with a daemon's node) are another node's create or delete in flight:
// named, not failed on.
func SDNCheck(px API, lookDnsmasq func() (string, error)) Check {
	return Check{Name: "sdn and dnsmasq", Run: func(ctx context.Context) Outcome {
		var zones []struct {
			Zone  string `json:"zone"`
			Type  string `json:"type"`
			State string `json:"state"`
		}
		if err := px.Get(ctx, "/cluster/sdn/zones?pending=1", &zones); err != nil {
			return failf("the token needs SDN.Audit and SDN.Allocate on /sdn (pve-access-setup grants them); is libpve-network-perl installed?", "GET /cluster/sdn/zones: %v", err)
		}
		// pending=1 lists a new vnet's properties under "pending" only
		// (pve-network SDN.pm pending_config).
		var vnets []struct {
			VNet    string `json:"vnet"`
			Zone    string `json:"zone"`
			Alias   string `json:"alias"`
			State   string `json:"state"`
			Pending struct {
				Zone  string `json:"zone"`
				Alias string `json:"alias"`
			} `json:"pending"`
		}
		if err := px.Get(ctx, "/cluster/sdn/vnets?pending=1", &vnets); err != nil {
			return failf("the token needs SDN.Audit on /sdn (pve-access-setup grants it)", "GET /cluster/sdn/vnets: %v", err)
		}
		for i := range vnets {
			if vnets[i].Zone == "" {
				vnets[i].Zone = vnets[i].Pending.Zone
			}
			if vnets[i].Alias == "" {
				vnets[i].Alias = vnets[i].Pending.Alias
			}
		}
		// A daemon's zone: a sandbox id whose vnets carry a daemon's node
		// tag (the id alone could be anyone's).
		daemonZone := map[string]bool{}
		for _, v := range vnets {
			if strings.Contains(v.Alias, "pvei-n-") && sandbox.ValidID(v.Zone) {
				daemonZone[v.Zone] = true
			}
		}
		var pending, inFlight []string
		for _, z := range zones {
			if z.State == "" {
				continue
			}
			e := fmt.Sprintf("%s (%s)", z.Zone, z.State)
			if daemonZone[z.Zone] {
				inFlight = append(inFlight, e)
				continue
			}
			pending = append(pending, e)
		}
		for _, v := range vnets {
			if v.State != "" && !daemonZone[v.Zone] {
				pending = append(pending, fmt.Sprintf("vnet %s of zone %s (%s)", v.VNet, v.Zone, v.State))
			}
		}
		if len(pending) > 0 {
			return failf("apply or revert them first (Datacenter > SDN > Apply, or pvesh set /cluster/sdn): the daemon's next apply would apply them too",
				"pending SDN edits not applied: %s", strings.Join(pending, ", "))
		}
		p, err := lookDnsmasq()
		if err != nil {
			return failf("apt install dnsmasq && systemctl disable --now dnsmasq (SDN DHCP runs its own instances)", "dnsmasq: %v", err)
		}
		msg := fmt.Sprintf("%d zone(s), none pending", len(zones))
		if len(inFlight) > 0 {
			msg = fmt.Sprintf("%d zone(s); pending only in pve-inspectd creates or deletes in flight: %s", len(zones), strings.Join(inFlight, ", "))
		}
		return passf("%s; dnsmasq at %s", msg, p)
	}}
}

// sdnLockFile is pve-network's SDN global lock (SDN.pm $LOCK_TOKEN_FILE).
const sdnLockFile = "/etc/pve/sdn/.lock"

// SDNLockCheck wants no client holding the SDN global lock (POST
// /cluster/sdn/lock writes its token to /etc/pve/sdn/.lock): while it is
// held every SDN edit without the token fails "invalid lock token
// provided!" (pve-network SDN.pm lock_sdn_config), every create and
// delete of the daemon with it. path "" is the real file.
func SDNLockCheck(path string) Check {
	if path == "" {
		path = sdnLockFile
	}
	return Check{Name: "sdn global lock", Run: func(context.Context) Outcome {
		fi, err := os.Stat(path)
		switch {
		case errors.Is(err, os.ErrNotExist):
			return passf("not held")
		case err != nil:
			return failf("run the doctor as root on the node (it reads "+path+")", "%v", err)
		}
		return failf("find the client holding it (Datacenter > SDN shows the lock) and let it finish, or release it: pvesh delete /cluster/sdn/lock --force 1",
			"a client holds the SDN global lock since %s: every SDN edit of the daemon fails (\"invalid lock token provided!\")", fi.ModTime().UTC().Format(time.RFC3339))
	}}
}

// NodeCheck wants the daemon's Proxmox node to be a node of the cluster,
// as Proxmox names it (the host name without its domain).
func NodeCheck(px API, n Node) Check {
	return Check{Name: "node name", Run: func(ctx context.Context) Outcome {
		var nodes []struct {
			Node string `json:"node"`
		}
		if err := px.Get(ctx, "/nodes", &nodes); err != nil {
			return failf("GET /nodes is open to every user; check [api.proxmox] url", "GET /nodes: %v", err)
		}
		var names []string
		for _, nd := range nodes {
			if nd.Node == n.Name {
				return passf("%s is one of the cluster's %d node(s)", n.Name, len(nodes))
			}
			names = append(names, nd.Node)
		}
		return failf("set [api.proxmox] node (or node.id) to this node's name as Proxmox has it: the host name without its domain",
			"%q is not a node of the cluster (nodes: %s)", n.Name, strings.Join(names, ", "))
	}}
}

// IPAMCheck reads the pve IPAM the daemon's zones use.
func IPAMCheck(px API) Check {
	return Check{Name: "ipam", Run: func(ctx context.Context) Outcome {
		var entries []map[string]any
		if err := px.Get(ctx, "/cluster/sdn/ipams/pve/status", &entries); err != nil {
			return failf("the daemon's zones use the built-in IPAM \"pve\": pvesh create /cluster/sdn/ipams --ipam pve --type pve (its status is open to every user, listing the entries of the vnets the token has SDN.Audit or SDN.Allocate on)",
				"GET /cluster/sdn/ipams/pve/status: %v", err)
		}
		return passf("IPAM pve: %d entries", len(entries))
	}}
}

// broadPrivs are privileges that reach far beyond the daemon's work, each
// with what a leaked token could do with it. The call table may need one
// on a path of its own (Sys.Modify on /nodes/NODE for the management-port
// rules, Datastore.Allocate on the transfer storage): held anywhere else,
// the token is broader than the work.
var broadPrivs = map[string]string{
	"Permissions.Modify":         "grant itself anything",
	"Sys.Modify":                 "change the node's network, certificates, services or the cluster firewall",
	"Sys.PowerMgmt":              "reboot or shut down nodes",
	"Sys.Console":                "open a root shell on a node",
	"Sys.AccessNetwork":          "make the node fetch any URL (download-url): a probe of the node's own network; only `template build`, an operator's action, needs it",
	"User.Modify":                "change users",
	"Group.Allocate":             "change groups",
	"Realm.Allocate":             "change authentication realms",
	"Realm.AllocateUser":         "move users between realms",
	"VM.GuestAgent.Unrestricted": "run anything in any guest through the Proxmox API (the daemon talks to the agent socket itself)",
	"VM.Console":                 "open any guest's console",
	"Datastore.Allocate":         "change or delete storages and any volume on them",
	"Datastore.AllocateTemplate": "upload ISOs, container templates and import images (pve-storage Status.pm upload overwrites a file of the name): a disk `template build` imports, an installer a VM boots",
	"Mapping.Modify":             "change hardware mappings",
}

// hostBridgeUse is what SDN.Use on a host bridge path lets a leaked token
// do.
const hostBridgeUse = "put pool VMs on the host's bridge there (" + access.LocalZonePath + " is the zone of every host bridge: vmbr0 and the others); the daemon needs it only on its templates' NIC bridges"

// broadOn says whether priv on path reaches beyond the daemon's work
// wherever the call table does not need it there, and what a leaked token
// could do with it.
func broadOn(path, priv string) (string, bool) {
	if what, ok := broadPrivs[priv]; ok {
		return what, true
	}
	if priv == "SDN.Use" && (path == access.LocalZonePath || strings.HasPrefix(path, access.LocalZonePath+"/")) {
		return hostBridgeUse, true
	}
	for _, sub := range sdnDefinitions {
		if strings.HasPrefix(priv, "SDN.") && (path == sub || strings.HasPrefix(path, sub+"/")) {
			return "define " + strings.TrimPrefix(sub, "/sdn/") + " (an external IPAM or DNS server, FRR peers the node's routing follows)", true
		}
	}
	return "", false
}

// sdnDefinitions are the SDN paths beside /sdn/zones that the token needs
// nothing on: IPAM, DNS, controller and fabric definitions (pve-network
// API2/Network/SDN/Ipams.pm, Dns.pm, Controllers.pm, Fabrics), reached by
// an older pve-access-setup's propagating grant on /sdn.
var sdnDefinitions = []string{"/sdn/ipams", "/sdn/dns", "/sdn/controllers", "/sdn/fabrics"}

// probeVLAN is a VLAN tag the scope check asks for below each host bridge:
// SDN.Use there that no template's NIC needs means a bridge grant that
// propagates (every VLAN of the bridge).
const probeVLAN = "4094"

// ScopeCheck reads every path the token has privileges on (GET
// /access/permissions without a path: the ACL tree's paths and the pools'
// members), /sdn/zones/localnetwork and each host bridge the token may
// use (GET /nodes/{node}/network?type=any_local_bridge lists those with
// SDN.Audit or SDN.Use: pve-manager API2/Network.pm index, check_sdn_bridge)
// and a VLAN of each (a propagating bridge grant), the SDN definitions
// beside /sdn/zones,
// and fails on a broad privilege the call table does not need there: what
// an older pve-access-setup granted (Sys.Modify on /,
// VM.GuestAgent.Unrestricted, SDN.Use propagated from /sdn onto the host's
// bridges) or a hand-made grant.
func ScopeCheck(px API, n Node, calls []access.Call) Check {
	return Check{Name: "token scope", Run: func(ctx context.Context) Outcome {
		sc, err := newScope(ctx, px, n)
		if err != nil {
			return failf("make the templates readable by the token (see the template checks)", "%v", err)
		}
		allowed := map[string]bool{} // path + " " + priv
		for _, c := range calls {
			for _, p := range sc.aclPaths(c) {
				for _, priv := range c.Privs {
					allowed[p+" "+priv] = true
				}
			}
		}
		const readOwn = "the token needs to read its own permissions (GET /access/permissions); check [api.proxmox] token_id"
		var all map[string]map[string]any
		if err := px.Get(ctx, "/access/permissions", &all); err != nil {
			return failf(readOwn, "GET /access/permissions: %v", err)
		}
		privsOf := map[string][]string{}
		for p, m := range all {
			for priv := range m {
				privsOf[p] = append(privsOf[p], priv)
			}
		}
		// SDN.Use propagated onto the host bridges has no ACL entry of
		// its own there: ask for localnetwork and each bridge.
		var bridges []struct {
			Iface string `json:"iface"`
		}
		if err := px.Get(ctx, "/nodes/"+url.PathEscape(n.Name)+"/network?type=any_local_bridge", &bridges); err != nil {
			return failf("GET /nodes/{node}/network is open to every user; check [api.proxmox] node", "GET /nodes/%s/network: %v", n.Name, err)
		}
		probe := append([]string{access.LocalZonePath}, sdnDefinitions...)
		for _, b := range bridges {
			probe = append(probe, access.LocalZonePath+"/"+b.Iface, access.LocalZonePath+"/"+b.Iface+"/"+probeVLAN)
		}
		for _, p := range probe {
			if _, ok := privsOf[p]; ok {
				continue
			}
			have, err := effectivePrivs(ctx, px, p)
			if err != nil {
				return failf(readOwn, "GET /access/permissions?path=%s: %v", p, err)
			}
			for priv := range have {
				privsOf[p] = append(privsOf[p], priv)
			}
		}
		paths := make([]string, 0, len(privsOf))
		for p := range privsOf {
			paths = append(paths, p)
		}
		slices.Sort(paths)
		var broad []string
		for _, p := range paths {
			privs := privsOf[p]
			slices.Sort(privs)
			for _, priv := range privs {
				if what, ok := broadOn(p, priv); ok && !allowed[p+" "+priv] {
					broad = append(broad, fmt.Sprintf("%s on %s (it could %s)", priv, p, what))
				}
			}
		}
		if len(broad) > 0 {
			return failf("run pve-access-setup again (it takes the older grants back), or remove the grants by hand (pveum acl delete PATH --tokens "+n.TokenID+" --roles ROLE)",
				"the token is broader than the work: %s", strings.Join(broad, "; "))
		}
		return passf("%d ACL paths, no privilege beyond the call table's", len(paths))
	}}
}
