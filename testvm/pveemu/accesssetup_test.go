package pveemu

import (
	"fmt"
	"net/url"
	"slices"
	"strings"
	"testing"

	"github.com/pve-inspect/pve-inspect/pveapi/access"
)

// TestAccessTableEndpoints: every call of the daemon's privilege table is
// an endpoint of Proxmox's schema and a route the emulator serves.
func TestAccessTableEndpoints(t *testing.T) {
	e := newEnv(t)
	routes := map[string]bool{}
	for _, r := range e.s.Routes() {
		routes[r.Method+" "+r.Path] = true
	}
	for _, c := range access.Calls() {
		k := c.Method + " " + c.Path
		if _, ok := e.s.Schema().Endpoint(c.Method, c.Path); !ok {
			t.Errorf("%s: not in the Proxmox API schema", k)
		}
		if !routes[k] {
			t.Errorf("%s: not served by the emulator", k)
		}
	}
}

// TestConfigPermissions is qemu-server's update_vm privilege checks with
// the shipped role: each change is accepted with the role and refused,
// naming the privilege, with the role minus that privilege; root-only keys
// are refused either way.
func TestConfigPermissions(t *testing.T) {
	e := newEnv(t)
	e.setupZone()
	id, secret, err := e.s.ApplyAccessSetup(AccessSetup{Templates: []int{templateID}, Transfer: access.TransferStorage})
	if err != nil {
		t.Fatal(err)
	}
	token := "PVEAPIToken=" + id + "=" + secret
	vm := "/nodes/pve/qemu/100"
	full := access.RolePrivs(access.RoleMain)
	// the sandbox VM: a clone into the pool with the devices the hardening
	// removes, set by root
	if st := e.task("POST", "/nodes/pve/qemu/9000/clone", url.Values{"newid": {"100"}, "pool": {access.DefaultPool}}); st != "OK" {
		t.Fatalf("clone: %s", st)
	}
	reset := func() {
		t.Helper()
		e.ok("PUT", vm+"/config", url.Values{"ide2": {"none,media=cdrom"}, "audio0": {"device=ich9-intel-hda,driver=none"},
			"usb0": {"host=spice"}, "serial1": {"socket"}, "tablet": {"1"}})
	}
	for _, c := range []struct {
		name string
		form url.Values
		priv string // "" : root only
		want string // the refusal without priv
	}{
		{"vga", url.Values{"vga": {"serial0"}}, "VM.Config.HWType", ""},
		{"serial0 socket", url.Values{"serial0": {"socket"}}, "VM.Config.HWType", ""},
		{"tablet", url.Values{"tablet": {"0"}}, "VM.Config.HWType", ""},
		{"machine", url.Values{"machine": {"q35"}}, "VM.Config.HWType", ""},
		{"delete audio0", url.Values{"delete": {"audio0"}}, "VM.Config.HWType", ""},
		{"delete usb0 spice", url.Values{"delete": {"usb0"}}, "VM.Config.HWType", ""},
		{"delete serial1 socket", url.Values{"delete": {"serial1"}}, "VM.Config.HWType", ""},
		{"delete cd-rom", url.Values{"delete": {"ide2"}}, "VM.Config.CDROM", ""},
		{"cores", url.Values{"cores": {"2"}}, "VM.Config.CPU", ""},
		{"balloon", url.Values{"balloon": {"0"}}, "VM.Config.Memory", ""},
		{"ostype", url.Values{"ostype": {"l26"}}, "VM.Config.Options", ""},
		{"ostype windows", url.Values{"ostype": {"win11"}}, "VM.Config.Options", ""},
		{"bios ovmf", url.Values{"bios": {"ovmf"}}, "VM.Config.Options", ""},
		{"cpu model", url.Values{"cpu": {"host,flags=-nested-virt"}}, "VM.Config.CPU", ""},
		{"new efidisk0 needs VM.Config.Disk", url.Values{"efidisk0": {"local-lvm:1,efitype=4m,pre-enrolled-keys=0"}}, "VM.Config.Disk", ""},
		{"new efidisk0 needs Datastore.AllocateSpace", url.Values{"efidisk0": {"local-lvm:1,efitype=4m,pre-enrolled-keys=0"}}, "Datastore.AllocateSpace", "/storage/local-lvm, Datastore.AllocateSpace"},
		{"agent", url.Values{"agent": {"enabled=1"}}, "VM.Config.Options", ""},
		{"tags and name (the claim's rename)", url.Values{"tags": {"pvei-n-pve;pvei-s-sbabcdef"}, "name": {"pvei-sbabcdef-vm0"}}, "VM.Config.Options", ""},
		{"tags alone", url.Values{"tags": {"pvei-s-sbother"}}, "VM.Config.Options", ""},
		{"nic", url.Values{"net1": {"virtio,bridge=vnet1,firewall=0"}}, "VM.Config.Network", ""},
		{"nic on vnet needs SDN.Use", url.Values{"net2": {"virtio,bridge=vnet1,firewall=0"}}, "SDN.Use", "/sdn/zones/sbx1/vnet1, SDN.Use"},
		{"startup needs Sys.Modify on /", url.Values{"startup": {"order=1"}}, "", "/, Sys.Modify"},
		{"args", url.Values{"args": {"-no-reboot"}}, "", "only root can set 'args' config"},
	} {
		t.Run(c.name, func(t *testing.T) {
			reset()
			if c.priv != "" {
				if err := e.s.AddRole(access.RoleMain, without(full, c.priv)); err != nil {
					t.Fatal(err)
				}
				r := e.do("PUT", vm+"/config", c.form, authNone, "Authorization", token)
				want := c.want
				if want == "" {
					want = "/vms/100, " + c.priv
				}
				if r.status == 200 || !strings.Contains(r.reason, want) {
					t.Errorf("without %s: %d %q, want a refusal naming %q", c.priv, r.status, r.reason, want)
				}
				if err := e.s.AddRole(access.RoleMain, full); err != nil {
					t.Fatal(err)
				}
			}
			r := e.do("PUT", vm+"/config", c.form, authNone, "Authorization", token)
			if c.priv == "" {
				if r.status == 200 || !strings.Contains(r.reason, c.want) {
					t.Errorf("root-only change: %d %q, want %q", r.status, r.reason, c.want)
				}
				return
			}
			if r.status != 200 {
				t.Errorf("with the shipped role: %d %q", r.status, r.reason)
			}
		})
	}
}

// TestTransferImagePermissions: with the shipped grants the token
// allocates an image for its VM on the transfer storage, reads its path
// and frees it; freeing needs Datastore.Allocate on the storage (pve-storage
// Content.pm delete), which only the transfer role gives: without it the
// image could not be freed and would leak.
func TestTransferImagePermissions(t *testing.T) {
	e := newEnv(t)
	e.setupZone()
	id, secret, err := e.s.ApplyAccessSetup(AccessSetup{Templates: []int{templateID}, Transfer: access.TransferStorage})
	if err != nil {
		t.Fatal(err)
	}
	token := "PVEAPIToken=" + id + "=" + secret
	if st := e.task("POST", "/nodes/pve/qemu/9000/clone", url.Values{"newid": {"100"}, "pool": {access.DefaultPool}}); st != "OK" {
		t.Fatalf("clone: %s", st)
	}
	content := "/nodes/pve/storage/" + access.TransferStorage + "/content"
	alloc := func(name string) string {
		t.Helper()
		r := e.do("POST", content, url.Values{"filename": {name}, "vmid": {"100"}, "size": {"1024"}, "format": {"raw"}}, authNone, "Authorization", token)
		volid, _ := r.body["data"].(string)
		if r.status != 200 || volid == "" {
			t.Fatalf("allocate %s: %d %q", name, r.status, r.reason)
		}
		if r := e.do("GET", content+"/"+url.PathEscape(volid), nil, authNone, "Authorization", token); r.status != 200 {
			t.Fatalf("path of %s: %d %q", volid, r.status, r.reason)
		}
		return volid
	}
	volid := alloc("vm-100-xfer-a.raw")
	r := e.do("DELETE", content+"/"+url.PathEscape(volid), nil, authNone, "Authorization", token)
	upid, _ := r.body["data"].(string)
	if r.status != 200 || e.wait(upid) != "OK" {
		t.Fatalf("free with the shipped grants: %d %q", r.status, r.reason)
	}
	volid = alloc("vm-100-xfer-b.raw")
	e.ok("PUT", "/access/acl", url.Values{"path": {"/storage/" + access.TransferStorage}, "tokens": {id}, "roles": {access.RoleTransfer}, "delete": {"1"}})
	r = e.do("DELETE", content+"/"+url.PathEscape(volid), nil, authNone, "Authorization", token)
	if r.status != 403 || !strings.Contains(r.reason, "/storage/local, Datastore.Allocate") {
		t.Fatalf("free without the transfer role: %d %q", r.status, r.reason)
	}
}

// TestHostBridgeAccess: with pve-access-setup's grants the token uses the
// host bridge a template's NIC is on (cloning the template, replacing and
// deleting that NIC) and no other host bridge, nor another VLAN of it:
// /sdn's SDN.Use stops at /sdn/zones/localnetwork (NoAccess, propagating),
// and only the template's bridge has it back (a more specific entry).
// Without the NoAccess entry (the grants before issue 36) the token puts a
// pool VM on any host bridge; without the bridge entry it cannot replace
// the clone's NIC (update_vm's worker checks the NIC's old bridge too).
func TestHostBridgeAccess(t *testing.T) {
	e, id, as := tokenOnHostBridges(t)
	asTask := func(method, path string, form url.Values) string {
		t.Helper()
		r := as(method, path, form)
		upid, _ := r.body["data"].(string)
		if r.status != 200 || upid == "" {
			return fmt.Sprintf("%d %s", r.status, r.reason)
		}
		return e.wait(upid)
	}
	if st := asTask("POST", "/nodes/pve/qemu/9001/clone", url.Values{"newid": {"101"}, "pool": {access.DefaultPool}}); st != "OK" {
		t.Fatalf("the token's clone of a template on vmbr0: %s", st)
	}
	cfg := "/nodes/pve/qemu/101/config"
	for _, c := range []struct {
		name, nic, refused string // refused: the 403's path, "" for accepted
	}{
		{"another host bridge", "virtio,bridge=vmbr1", access.LocalZonePath + "/vmbr1, SDN.Use"},
		{"a bridge the node does not have", "virtio,bridge=vmbr9", access.LocalZonePath + "/vmbr9, SDN.Use"},
		{"a VLAN of the template's bridge", "virtio,bridge=vmbr0,tag=5", access.LocalZonePath + "/vmbr0/5, SDN.Use"},
		{"trunks on the template's bridge", "virtio,bridge=vmbr0,trunks=7", access.LocalZonePath + "/vmbr0/7, SDN.Use"},
		{"the template's bridge", "virtio,bridge=vmbr0", ""},
		{"the daemon's vnet", "virtio,bridge=vnet1", ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			r := as("POST", cfg, url.Values{"net1": {c.nic}})
			switch {
			case c.refused != "" && (r.status != 403 || !strings.Contains(r.reason, c.refused)):
				t.Errorf("net1=%s: %d %q, want 403 naming %q", c.nic, r.status, r.reason, c.refused)
			case c.refused == "" && r.status != 200:
				t.Errorf("net1=%s: %d %q", c.nic, r.status, r.reason)
			case c.refused == "":
				if st := e.wait(r.body["data"].(string)); st != "OK" {
					t.Errorf("net1=%s: task %s", c.nic, st)
				}
			}
		})
	}
	// The network list shows the token the template's bridge only.
	r := as("GET", "/nodes/pve/network", url.Values{"type": {"any_local_bridge"}})
	if list, _ := r.body["data"].([]any); len(list) != 1 || list[0].(map[string]any)["iface"] != "vmbr0" {
		t.Errorf("bridges the token sees: %v", r.body["data"])
	}

	// The grants before issue 36: /sdn's role reaches every host bridge.
	noAccess := url.Values{"path": {access.LocalZonePath}, "users": {access.User}, "tokens": {id}, "roles": {access.RoleNoAccess}}
	noAccess.Set("delete", "1")
	e.ok("PUT", "/access/acl", noAccess)
	if r := as("PUT", cfg, url.Values{"net2": {"virtio,bridge=vmbr1"}}); r.status != 200 {
		t.Errorf("without NoAccess on %s: net2 on vmbr1 refused: %d %q", access.LocalZonePath, r.status, r.reason)
	}
	noAccess.Del("delete")
	e.ok("PUT", "/access/acl", noAccess)
	// Without the template's bridge: the NIC on it can be neither replaced
	// nor deleted (the worker's check of the old value: the task fails).
	e.ok("PUT", cfg, url.Values{"net2": {"virtio,bridge=vmbr0"}})
	e.ok("PUT", "/access/acl", url.Values{"path": {access.LocalZonePath + "/vmbr0"}, "tokens": {id}, "roles": {access.RoleBridge}, "delete": {"1"}})
	for _, form := range []url.Values{{"net0": {"virtio,bridge=vnet1"}}, {"delete": {"net2"}}} {
		if st := asTask("POST", cfg, form); !strings.Contains(st, access.LocalZonePath+"/vmbr0, SDN.Use") {
			t.Errorf("%v with the NIC's old bridge not granted: %s", form, st)
		}
	}
}

// TestIPAMStatusPerVNet: GET /cluster/sdn/ipams/pve/status is open to every
// user and lists the entries of a subnet only to a caller with SDN.Audit or
// SDN.Allocate on /sdn/zones/<zone>/<vnet> of its vnet (pve-network
// Ipams.pm ipamindex), whether granted there or propagated from the zone.
func TestIPAMStatusPerVNet(t *testing.T) {
	e := newEnv(t)
	e.setupZone()
	e.ok("POST", "/cluster/sdn/zones", url.Values{"zone": {"sbx2"}, "type": {"simple"}, "ipam": {"pve"}, "dhcp": {"dnsmasq"}})
	e.ok("POST", "/cluster/sdn/vnets", url.Values{"vnet": {"vnet2"}, "zone": {"sbx2"}})
	e.ok("POST", "/cluster/sdn/vnets/vnet2/subnets", url.Values{"subnet": {"10.10.2.0/24"}, "type": {"subnet"}, "gateway": {"10.10.2.1"},
		"dhcp-range": {"start-address=10.10.2.100,end-address=10.10.2.200"}})
	if st := e.task("PUT", "/cluster/sdn", nil); st != "OK" {
		t.Fatalf("sdn apply: %s", st)
	}
	if err := e.s.AddUser("ipam@pve", ""); err != nil {
		t.Fatal(err)
	}
	tok, secret, err := e.s.AddToken("ipam@pve", "tk", false)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.s.AddRole("SDNAudit", []string{"SDN.Audit"}); err != nil {
		t.Fatal(err)
	}
	vnets := func() []string {
		t.Helper()
		r := e.do("GET", "/cluster/sdn/ipams/pve/status", nil, authNone, "Authorization", "PVEAPIToken="+tok+"="+secret)
		if r.status != 200 {
			t.Fatalf("ipam status: %d %s", r.status, r.reason)
		}
		var out []string
		for _, x := range r.body["data"].([]any) {
			if v := x.(map[string]any)["vnet"].(string); !slices.Contains(out, v) {
				out = append(out, v)
			}
		}
		slices.Sort(out)
		return out
	}
	for _, c := range []struct {
		path      string
		propagate bool
		want      []string
	}{
		{"", false, nil},
		{"/sdn/zones/sbx1/vnet1", false, []string{"vnet1"}},
		{"/sdn/zones/sbx2", true, []string{"vnet1", "vnet2"}},
	} {
		if c.path != "" {
			if err := e.s.SetACL(c.path, "ipam@pve", "SDNAudit", c.propagate); err != nil {
				t.Fatal(err)
			}
		}
		if got := vnets(); !slices.Equal(got, c.want) {
			t.Errorf("after a grant on %q: entries of %v, want %v", c.path, got, c.want)
		}
	}
}

// without is privs without priv.
func without(privs []string, priv string) []string {
	var out []string
	for _, p := range privs {
		if p != priv {
			out = append(out, p)
		}
	}
	return out
}
