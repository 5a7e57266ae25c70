package pveemu

import (
	"net/url"
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
	// pve-inspectd doctor's (its schema entry and route come with it)
	notServed := map[string]bool{"GET /access/permissions": true}
	for _, c := range access.Calls() {
		k := c.Method + " " + c.Path
		if _, ok := e.s.Schema().Endpoint(c.Method, c.Path); !ok && !notServed[k] {
			t.Errorf("%s: not in the Proxmox API schema", k)
		}
		if !routes[k] && !notServed[k] {
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
		{"agent", url.Values{"agent": {"enabled=1"}}, "VM.Config.Options", ""},
		{"nic", url.Values{"net1": {"virtio,bridge=vnet1,firewall=0"}}, "VM.Config.Network", ""},
		{"nic on vnet needs SDN.Use", url.Values{"net2": {"virtio,bridge=vnet1,firewall=0"}}, "SDN.Use", "/sdn/zones/sbx1/vnet1, SDN.Use"},
		{"startup needs Sys.Modify on /", url.Values{"startup": {"order=1"}}, "", "/, Sys.Modify"},
		{"args", url.Values{"args": {"-no-reboot"}}, "", "only root can set 'args' config"},
	} {
		t.Run(c.name, func(t *testing.T) {
			reset()
			if c.priv != "" {
				var less []string
				for _, p := range full {
					if p != c.priv {
						less = append(less, p)
					}
				}
				if err := e.s.AddRole(access.RoleMain, less); err != nil {
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
