package pveemu

import (
	"context"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestRealNodeSemantics covers the behaviours of FIDELITY.md that issue 12
// added, each against the Proxmox source it follows.
func TestRealNodeSemantics(t *testing.T) {
	cases := []struct {
		name string
		run  func(t *testing.T, e *env)
	}{
		{"resources: unknown before the first statistics update, stale after", func(t *testing.T, e *env) {
			e.clone("120")
			vm := func() map[string]any {
				for _, x := range e.ok("GET", "/cluster/resources", url.Values{"type": {"vm"}}).([]any) {
					if m := x.(map[string]any); m["vmid"] == float64(120) {
						return m
					}
				}
				t.Fatal("vm 120 not listed")
				return nil
			}
			if m := vm(); m["status"] != "unknown" || m["name"] != nil {
				t.Fatalf("before the first update: %v", m)
			}
			e.s.RefreshStats()
			if m := vm(); m["status"] != "stopped" || m["name"] != "Copy-of-VM-tmpl" {
				t.Fatalf("after an update: %v", m)
			}
			e.setupZone()
			if st := e.task("POST", "/nodes/pve/qemu/120/status/start", url.Values{}); st != "OK" {
				t.Fatal(st)
			}
			e.ok("PUT", "/nodes/pve/qemu/120/config", url.Values{"tags": {"t1"}})
			if m := vm(); m["status"] != "stopped" || m["tags"] != "t1" {
				t.Fatalf("status must be stale, tags live: %v", m)
			}
			if st := e.ok("GET", "/nodes/pve/qemu/120/status/current", nil).(map[string]any); st["status"] != "running" {
				t.Fatalf("status/current is live: %v", st)
			}
		}},
		{"stop of a stopped VM is a task that ends OK; of a missing one a failed task", func(t *testing.T, e *env) {
			e.clone("120")
			if st := e.task("POST", "/nodes/pve/qemu/120/status/stop", url.Values{}); st != "OK" {
				t.Fatalf("stop of a stopped vm: %s", st)
			}
			if st := e.task("POST", "/nodes/pve/qemu/404/status/stop", url.Values{}); st != "Configuration file 'nodes/pve/qemu-server/404.conf' does not exist" {
				t.Fatalf("stop of a missing vm: %s", st)
			}
		}},
		{"delete of a locked VM fails inside the task", func(t *testing.T, e *env) {
			e.clone("120")
			e.s.mu.Lock()
			e.s.vms[120].conf["lock"] = "backup"
			e.s.mu.Unlock()
			if st := e.task("DELETE", "/nodes/pve/qemu/120", url.Values{}); st != "VM is locked (backup)" {
				t.Fatalf("delete of a locked vm: %s", st)
			}
		}},
		{"unknown or malformed task: 400", func(t *testing.T, e *env) {
			r := e.do("GET", "/nodes/pve/tasks/"+url.PathEscape("UPID:pve:00000001:00000001:00000001:qmstart:1:root@pam:")+"/status", nil, authTicket)
			if r.status != 400 || r.errors()["upid"] != "no such task" {
				t.Fatalf("unknown task: %d %v", r.status, r.body)
			}
			r = e.do("GET", "/nodes/pve/tasks/nonsense/status", nil, authTicket)
			if r.status != 400 || r.errors()["upid"] != "unable to parse worker upid" {
				t.Fatalf("malformed upid: %d %v", r.status, r.body)
			}
		}},
		{"a token's task reports user and tokenid apart", func(t *testing.T, e *env) {
			id, secret, err := e.s.RootToken("tk")
			if err != nil {
				t.Fatal(err)
			}
			auth := "PVEAPIToken=" + id + "=" + secret
			r := e.do("POST", "/nodes/pve/qemu/9000/clone", url.Values{"newid": {"121"}}, authNone, "Authorization", auth)
			upid, _ := r.body["data"].(string)
			if !strings.Contains(upid, ":root@pam!tk:") {
				t.Fatalf("upid %q", upid)
			}
			e.wait(upid)
			st := e.ok("GET", "/nodes/pve/tasks/"+url.PathEscape(upid)+"/status", nil).(map[string]any)
			if st["user"] != "root@pam" || st["tokenid"] != "tk" {
				t.Fatalf("status %v", st)
			}
		}},
		{"firewall rule create goes to the top with enable 0", func(t *testing.T, e *env) {
			e.ok("POST", "/nodes/pve/firewall/rules", url.Values{"type": {"in"}, "action": {"ACCEPT"}, "comment": {"first"}, "enable": {"1"}})
			e.ok("POST", "/nodes/pve/firewall/rules", url.Values{"type": {"in"}, "action": {"DROP"}, "comment": {"second"}, "pos": {"1"}})
			rules := e.ok("GET", "/nodes/pve/firewall/rules", nil).([]any)
			first, second := rules[0].(map[string]any), rules[1].(map[string]any)
			if len(rules) != 2 || first["comment"] != "second" || first["enable"] != float64(0) || second["comment"] != "first" || second["enable"] != float64(1) {
				t.Fatalf("rules %v", rules)
			}
		}},
		{"sdn errors are wrapped by lock_sdn_config", func(t *testing.T, e *env) {
			e.ok("POST", "/cluster/sdn/zones", url.Values{"zone": {"z1"}, "type": {"simple"}})
			r := e.do("POST", "/cluster/sdn/zones", url.Values{"zone": {"z1"}, "type": {"simple"}}, authTicket)
			if r.status != 500 || r.body["message"] != "create sdn zone object failed: sdn zone object ID 'z1' already defined\n" {
				t.Fatalf("zone twice: %d %v", r.status, r.body)
			}
			r = e.do("DELETE", "/cluster/sdn/zones/nozone", nil, authTicket)
			if r.status != 500 || r.body["message"] != "delete sdn zone object failed: sdn 'nozone' does not exist\n" {
				t.Fatalf("missing zone: %d %v", r.status, r.body)
			}
		}},
		{"ipam: an entry per NIC on a DHCP vnet, subnet delete refused while any remain", func(t *testing.T, e *env) {
			e.setupZone()
			e.clone("120")                                                                                                   // the template's NIC is on vnet1
			if st := e.task("POST", "/nodes/pve/qemu/120/config", url.Values{"net1": {"virtio,bridge=vnet1"}}); st != "OK" { // a task: wait for it
				t.Fatalf("config: %s", st)
			}
			got := e.s.IPAMEntries("sbx1")
			if len(got) != 3 || !strings.HasPrefix(got[0], "10.10.1.0/24 10.10.1.1 gateway") || !strings.HasPrefix(got[1], "10.10.1.0/24 10.10.1.100 ") || !strings.HasPrefix(got[2], "10.10.1.0/24 10.10.1.101 ") {
				t.Fatalf("ipam %v", got)
			}
			status := e.ok("GET", "/cluster/sdn/ipams/pve/status", nil).([]any)
			if len(status) != 3 || status[1].(map[string]any)["vmid"] != float64(120) || status[1].(map[string]any)["vnet"] != "vnet1" {
				t.Fatalf("ipam status %v", status)
			}
			r := e.do("DELETE", "/cluster/sdn/vnets/vnet1/subnets/sbx1-10.10.1.0-24", nil, authTicket)
			if r.status != 500 || r.body["message"] != "delete sdn subnet object failed: cannot delete subnet '10.10.1.0/24', not empty\n" {
				t.Fatalf("subnet delete: %d %v", r.status, r.body)
			}
			e.ok("POST", "/cluster/sdn/vnets/vnet1/ips", url.Values{"zone": {"sbx1"}, "ip": {"10.10.1.250"}, "mac": {"BC:24:11:00:00:09"}})
			r = e.do("POST", "/cluster/sdn/vnets/vnet1/ips", url.Values{"zone": {"sbx1"}, "ip": {"10.10.1.250"}}, authTicket)
			if r.status != 500 || r.body["message"] != "IP '10.10.1.250' already exist\n" {
				t.Fatalf("ip twice: %d %v", r.status, r.body)
			}
			if st := e.task("DELETE", "/nodes/pve/qemu/120", url.Values{"purge": {"1"}}); st != "OK" {
				t.Fatal(st)
			}
			if got := e.s.IPAMEntries("sbx1"); len(got) != 2 {
				t.Fatalf("after destroy: %v", got)
			}
			e.ok("DELETE", "/cluster/sdn/vnets/vnet1/ips", url.Values{"zone": {"sbx1"}, "ip": {"10.10.1.250"}})
			e.ok("DELETE", "/cluster/sdn/vnets/vnet1/subnets/sbx1-10.10.1.0-24", nil)
			if got := e.s.IPAMEntries("sbx1"); len(got) != 0 {
				t.Fatalf("after subnet delete: %v", got)
			}
		}},
		{"an injected reload warning: task WARNINGS, nothing applied", func(t *testing.T, e *env) {
			e.s.InjectReloadWarning("reloading network config failed")
			e.ok("POST", "/cluster/sdn/zones", url.Values{"zone": {"sbx1"}, "type": {"simple"}})
			upid := e.ok("PUT", "/cluster/sdn", nil).(string)
			if st := e.wait(upid); st != "WARNINGS: 1" {
				t.Fatalf("apply: %s", st)
			}
			log := e.ok("GET", "/nodes/pve/tasks/"+url.PathEscape(upid)+"/log", nil).([]any)
			if !slices.ContainsFunc(log, func(x any) bool { return x.(map[string]any)["t"] == "WARN: pve: reloading network config failed" }) {
				t.Fatalf("log %v", log)
			}
			if _, ok := e.fb.Zone("sbx1"); ok {
				t.Fatal("zone applied despite the failed reload")
			}
			if st := e.task("PUT", "/cluster/sdn", nil); st != "OK" {
				t.Fatalf("second apply: %s", st)
			}
			if _, ok := e.fb.Zone("sbx1"); !ok {
				t.Fatal("zone not applied by the next apply")
			}
		}},
		{"clone and resize need Datastore.AllocateSpace on the storage", func(t *testing.T, e *env) {
			if err := e.s.AddPool("p", ""); err != nil {
				t.Fatal(err)
			}
			if err := e.s.AddUser("u@pve", ""); err != nil {
				t.Fatal(err)
			}
			id, secret, err := e.s.AddToken("u@pve", "tok", false)
			if err != nil {
				t.Fatal(err)
			}
			auth := "PVEAPIToken=" + id + "=" + secret
			for _, a := range [][2]string{{"/pool/p", "PVEVMAdmin"}, {"/vms/9000", "PVEVMAdmin"}, {"/sdn/zones/localnetwork", "PVESDNUser"}} {
				if err := e.s.SetACL(a[0], "u@pve", a[1], true); err != nil {
					t.Fatal(err)
				}
			}
			r := e.do("POST", "/nodes/pve/qemu/9000/clone", url.Values{"newid": {"130"}, "pool": {"p"}}, authNone, "Authorization", auth)
			if r.status != 403 || r.reason != "Permission check failed (/storage/local-lvm, Datastore.AllocateSpace)" {
				t.Fatalf("clone: %d %q", r.status, r.reason)
			}
			if err := e.s.SetACL("/storage/local-lvm", "u@pve", "PVEDatastoreUser", false); err != nil {
				t.Fatal(err)
			}
			r = e.do("POST", "/nodes/pve/qemu/9000/clone", url.Values{"newid": {"130"}, "pool": {"p"}}, authNone, "Authorization", auth)
			if upid, _ := r.body["data"].(string); r.status != 200 || e.wait(upid) != "OK" {
				t.Fatalf("clone with an ACL on the storage: %d %q", r.status, r.reason)
			}
			// The storage ACL goes; a resize fails inside its task.
			e.s.mu.Lock()
			e.s.acl = slices.DeleteFunc(e.s.acl, func(a aclEntry) bool { return a.path == "/storage/local-lvm" })
			e.s.mu.Unlock()
			r = e.do("PUT", "/nodes/pve/qemu/130/resize", url.Values{"disk": {"scsi0"}, "size": {"+1G"}}, authNone, "Authorization", auth)
			if upid, _ := r.body["data"].(string); r.status != 200 || e.wait(upid) != "403 Permission check failed (/storage/local-lvm, Datastore.AllocateSpace)" {
				t.Fatalf("resize without the grant: %d %q %v", r.status, r.reason, r.body)
			}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tc.run(t, newEnv(t))
		})
	}
}

// TestStatsLoop: the statistics refresh on their own at StatsInterval.
func TestStatsLoop(t *testing.T) {
	dir := t.TempDir()
	fb := NewFakeBackend(filepath.Join(dir, "run"))
	defer fb.Close()
	s, err := New(Options{Backend: fb, DataDir: filepath.Join(dir, "data"), StatsInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := os.MkdirAll(filepath.Join(dir, "disk"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := s.AddTemplate(context.Background(), 9000, "tmpl", filepath.Join(dir, "disk"), nil); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for {
		s.mu.Lock()
		e := s.vmStatsLocked(s.vms[9000])
		s.mu.Unlock()
		if e["name"] == "tmpl" && e["status"] == "stopped" {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("statistics never refreshed: %v", e)
		case <-time.After(10 * time.Millisecond):
		}
	}
}
