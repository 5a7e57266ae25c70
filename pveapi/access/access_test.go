package access

import (
	"slices"
	"strings"
	"testing"
)

// node is one concrete node for the table, set up with the disk path on
// (PVE_INSPECTD_TRANSFER_STORAGE=local): its pool holds sandbox VM 100
// and the pool storages; template 9000 is granted, its NICs are on the
// host bridge vmbr0 and the SDN vnet vtpl of zone ztpl.
var node = struct {
	name, pool string
	templates  []int
	vm         string
	storages   []string
	vars       *strings.Replacer
}{
	name: "pve", pool: DefaultPool, templates: []int{9000}, vm: "100", storages: Setup{Transfer: TransferStorage}.PoolStorages(),
	vars: strings.NewReplacer(PhNode, "pve", PhPool, DefaultPool, PhVMID, "100", PhTemplate, "9000",
		PhStorage, DefaultStorage, PhTransfer, TransferStorage, PhZone, "zsbx", PhVNet, "vsbx", PhBridge, "vmbr0", PhTemplateVNet, "ztpl/vtpl"),
}

// nodeEntries are node's ACL entries.
func nodeEntries() []ACLEntry {
	return Setup{Node: node.name, Templates: node.templates, Bridges: []string{"vmbr0"}, Transfer: TransferStorage}.ACLEntries()
}

// rolesOn is what RPCEnvironment's compile_acl_path gives one subject on
// path from the entries: the most specific path of the chain with entries
// that apply (exact, or propagating), NoAccess alone when that set has it
// (AccessControl.pm roles), else plus the pool's roles for the pool's VMs
// and storages. It also returns the entries that made the roles.
func rolesOn(entries []ACLEntry, path string) map[string][]ACLEntry {
	chain := []string{"/"}
	parts := strings.Split(strings.Trim(path, "/"), "/")
	for i := range parts {
		if parts[i] != "" {
			chain = append(chain, "/"+strings.Join(parts[:i+1], "/"))
		}
	}
	out := map[string][]ACLEntry{}
	for _, p := range chain {
		level := map[string][]ACLEntry{}
		for _, e := range entries {
			if e.Path == p && (p == path || e.Propagate) {
				level[e.Role] = append(level[e.Role], e)
			}
		}
		if len(level) > 0 {
			out = level
		}
	}
	if es, ok := out[RoleNoAccess]; ok {
		return map[string][]ACLEntry{RoleNoAccess: es}
	}
	member := path == "/vms/"+node.vm
	for _, sid := range node.storages {
		member = member || path == "/storage/"+sid
	}
	if member {
		for r, es := range rolesOn(entries, "/pool/"+node.pool) {
			out[r] = append(out[r], es...)
		}
	}
	return out
}

func privsOn(entries []ACLEntry, path string) map[string]bool {
	out := map[string]bool{}
	for r := range rolesOn(entries, path) {
		for _, p := range RolePrivs(r) {
			out[p] = true
		}
	}
	return out
}

// TestGrantsCoverCalls: every check of every call passes with the grants
// pve-access-setup creates.
func TestGrantsCoverCalls(t *testing.T) {
	entries := nodeEntries()
	for _, c := range Calls() {
		if c.ACLPath == "" {
			if len(c.Privs) != 0 {
				t.Errorf("%s %s: privileges without a path", c.Method, c.Path)
			}
			continue
		}
		path := node.vars.Replace(c.ACLPath)
		have := privsOn(entries, path)
		ok := !c.AnyOf
		for _, p := range c.Privs {
			if c.AnyOf {
				ok = ok || have[p]
			} else {
				ok = ok && have[p]
			}
		}
		if !ok {
			t.Errorf("%s %s: %v (any %v) on %s not granted (have %v)", c.Method, c.Path, c.Privs, c.AnyOf, path, have)
		}
	}
}

// TestRolesAreLeast: every privilege of every role is needed by some call
// on a path its grant reaches; none is there for nothing.
func TestRolesAreLeast(t *testing.T) {
	entries := nodeEntries()
	used := map[string]bool{} // role + " " + priv
	for _, c := range Calls() {
		if c.ACLPath == "" {
			continue
		}
		for r := range rolesOn(entries, node.vars.Replace(c.ACLPath)) {
			for _, p := range c.Privs {
				if slices.Contains(RolePrivs(r), p) {
					used[r+" "+p] = true
				}
			}
		}
	}
	for _, r := range Roles() {
		if !slices.IsSorted(r.Privs) {
			t.Errorf("role %s: privileges not sorted: %v", r.Name, r.Privs)
		}
		for _, p := range r.Privs {
			if !used[r.Name+" "+p] {
				t.Errorf("role %s: %s is needed by no call", r.Name, p)
			}
		}
	}
}

// TestNoBroadGrant: nothing but the cluster role's Sys.Audit reaches "/",
// nothing propagates from "/" or /nodes, and Sys.Modify is only on the
// node itself.
func TestNoBroadGrant(t *testing.T) {
	for _, e := range nodeEntries() {
		if e.Propagate && (e.Path == "/" || strings.HasPrefix(e.Path, "/nodes") || strings.HasPrefix(e.Path, "/storage") || strings.HasPrefix(e.Path, "/vms")) {
			t.Errorf("%s on %s propagates", e.Role, e.Path)
		}
		if slices.Contains(RolePrivs(e.Role), "Sys.Modify") && e.Path != "/nodes/"+node.name {
			t.Errorf("Sys.Modify on %s", e.Path)
		}
	}
	if got := privsOn(nodeEntries(), "/"); len(got) != 1 || !got["Sys.Audit"] {
		t.Errorf("privileges on /: %v", got)
	}
	for _, p := range []string{"/nodes/" + node.name + "/network", "/storage/other", "/vms/101", "/access", "/mapping/pci/x",
		"/sdn/ipams/pve", "/sdn/dns/pdns", "/sdn/controllers/evpn", "/sdn/fabrics/f",
		LocalZonePath, LocalZonePath + "/vmbr1", LocalZonePath + "/vmbr0/5", LocalZonePath + "/eth0"} {
		if got := privsOn(nodeEntries(), p); len(got) != 0 {
			t.Errorf("privileges on %s: %v", p, got)
		}
	}
	// the template's host bridge: SDN.Use alone; SDN vnets: /sdn's role
	if got := privsOn(nodeEntries(), LocalZonePath+"/vmbr0"); len(got) != 1 || !got["SDN.Use"] {
		t.Errorf("privileges on the template's bridge: %v", got)
	}
	if got := privsOn(nodeEntries(), "/sdn/zones/other/vnet"); !got["SDN.Use"] || !got["SDN.Allocate"] {
		t.Errorf("privileges on an SDN vnet: %v", got)
	}
}

func TestACLEntries(t *testing.T) {
	got := ACLEntries("n1", "p", []int{9000, 9001}, []string{"vmbr0", "vmbr1/5"})
	want := []ACLEntry{
		{"/pool/p", RoleMain, true}, {"/sdn", RoleMain, false}, {"/sdn/zones", RoleMain, true}, {LocalZonePath, RoleNoAccess, true},
		{LocalZonePath + "/vmbr0", RoleBridge, false}, {LocalZonePath + "/vmbr1/5", RoleBridge, false},
		{"/nodes/n1", RoleNode, false}, {"/", RoleCluster, false},
		{"/vms/9000", RoleTemplate, false}, {"/vms/9001", RoleTemplate, false},
	}
	if !slices.Equal(got, want) {
		t.Errorf("ACLEntries (no transfer storage)\n%v\nwant\n%v", got, want)
	}
	got = Setup{Node: "n1", Pool: "p", Templates: []int{9000}, Transfer: "xfer"}.ACLEntries()
	want = []ACLEntry{
		{"/pool/p", RoleMain, true}, {"/sdn", RoleMain, false}, {"/sdn/zones", RoleMain, true}, {LocalZonePath, RoleNoAccess, true},
		{"/nodes/n1", RoleNode, false}, {"/", RoleCluster, false},
		{"/storage/xfer", RoleTransfer, false}, {"/vms/9000", RoleTemplate, false},
	}
	if !slices.Equal(got, want) {
		t.Errorf("ACLEntries with transfer storage xfer\n%v\nwant\n%v", got, want)
	}
	if got := PoolStorages(); !slices.Equal(got, []string{DefaultStorage}) {
		t.Errorf("PoolStorages() %v, want the template storage only", got)
	}
	if got := ACLEntries("n1", "", nil, nil)[0].Path; got != "/pool/"+DefaultPool {
		t.Errorf("default pool path %s", got)
	}
	if got := PoolStorages("local-lvm", "local", "zfs"); !slices.Equal(got, []string{"local", "local-lvm", "zfs"}) {
		t.Errorf("PoolStorages %v", got)
	}
}

// TestNICPaths: the paths check_bridge_access checks for a config's NICs,
// split into host bridges and SDN vnets.
func TestNICPaths(t *testing.T) {
	zones := map[string]string{"vtpl": "ztpl"}
	zoneOf := func(b string) string { return zones[b] }
	for _, c := range []struct {
		name        string
		conf        map[string]string
		local, vnet []string
	}{
		{"plain bridge", map[string]string{"net0": "virtio=BC:24:11:00:00:01,bridge=vmbr0,firewall=1"}, []string{"vmbr0"}, nil},
		{"vnet", map[string]string{"net0": "virtio,bridge=vtpl"}, nil, []string{"ztpl/vtpl"}},
		{"tag: the VLAN only", map[string]string{"net0": "virtio,bridge=vmbr0,tag=5"}, []string{"vmbr0/5"}, nil},
		{"trunks with a range, and one ending below its start", map[string]string{"net1": "e1000,bridge=vmbr1,trunks=10;20-22;30-3"}, []string{"vmbr1/10", "vmbr1/20", "vmbr1/21", "vmbr1/22", "vmbr1/30"}, nil},
		{"tag and trunks", map[string]string{"net0": "virtio,bridge=vtpl,tag=7,trunks=8"}, nil, []string{"ztpl/vtpl/7", "ztpl/vtpl/8"}},
		{"no bridge, other keys, repeats", map[string]string{"net0": "virtio", "net1": "virtio,bridge=vmbr0", "net2": "virtio,bridge=vmbr0", "scsi0": "local-lvm:vm-1-disk-0,bridge=x"}, []string{"vmbr0"}, nil},
	} {
		t.Run(c.name, func(t *testing.T) {
			local, vnet := TemplateBridges([]map[string]string{c.conf}, zoneOf)
			if !slices.Equal(local, c.local) || !slices.Equal(vnet, c.vnet) {
				t.Errorf("got %v %v, want %v %v", local, vnet, c.local, c.vnet)
			}
		})
	}
}
