package pveemu

import (
	"fmt"
	"net/url"
	"slices"
	"strings"
	"testing"

	"github.com/pve-inspect/pve-inspect/pveapi/access"
)

// ctTemplateID is the CT template the container tests add.
const ctTemplateID = 9100

// ctEnv is newEnv with the SDN zone of setupZone and a CT template on
// vnet1 (its root an empty directory: the fake backend starts nothing).
func ctEnv(t *testing.T) *env {
	t.Helper()
	e := newEnv(t)
	e.setupZone()
	if err := e.s.AddCTTemplate(ctTemplateID, "ct-tmpl", t.TempDir(), map[string]string{"net0": "name=eth0,bridge=vnet1,ip=dhcp"}); err != nil {
		t.Fatal(err)
	}
	return e
}

// ctClone clones the CT template to newid as root and waits for it.
func (e *env) ctClone(newid string, extra url.Values) {
	e.t.Helper()
	form := url.Values{"newid": {newid}}
	for k, v := range extra {
		form[k] = v
	}
	if st := e.task("POST", fmt.Sprintf("/nodes/pve/lxc/%d/clone", ctTemplateID), form); st != "OK" {
		e.t.Fatalf("CT clone to %s: %s", newid, st)
	}
}

// wantFail asserts a refusal of the request itself: status and reason.
func (e *env) wantFail(method, path string, form url.Values, status int, reason string) {
	e.t.Helper()
	r := e.do(method, path, form, authTicket)
	if r.status != status || r.reason != reason {
		e.t.Errorf("%s %s %v: %d %q, want %d %q", method, path, form, r.status, r.reason, status, reason)
	}
}

// wantTaskFail asserts a call that starts a task whose exit status is want.
func (e *env) wantTaskFail(method, path string, form url.Values, want string) {
	e.t.Helper()
	if st := e.task(method, path, form); st != want {
		e.t.Errorf("%s %s %v: task %q, want %q", method, path, form, st, want)
	}
}

func ctConfig(e *env, vmid int, q url.Values) map[string]any {
	e.t.Helper()
	c, _ := e.ok("GET", fmt.Sprintf("/nodes/pve/lxc/%d/config", vmid), q).(map[string]any)
	return c
}

// TestCTLifecycle: clone of a CT template (linked, a task; new MAC, IPAM
// entry, pool), list, cluster resources, start (net0's IPAM address goes
// to the backend), status, stop and shutdown with pve-container's
// refusals, destroy (IPAM entry, ACLs and pool membership gone).
func TestCTLifecycle(t *testing.T) {
	e := ctEnv(t)
	if err := e.s.AddPool("sbx", ""); err != nil {
		t.Fatal(err)
	}
	e.ctClone("101", url.Values{"hostname": {"box1"}, "pool": {"sbx"}})
	c := ctConfig(e, 101, nil)
	tmpl := ctConfig(e, ctTemplateID, nil)
	if c["rootfs"] != "local-lvm:base-9100-disk-0/vm-101-disk-0,size=8G" || c["hostname"] != "box1" || c["unprivileged"] != float64(1) {
		t.Errorf("clone config: %v", c)
	}
	if _, ok := c["template"]; ok {
		t.Errorf("the clone is a template: %v", c)
	}
	if _, ok := c["lock"]; ok {
		t.Errorf("the clone kept a lock: %v", c)
	}
	if _, ok := tmpl["lock"]; ok {
		t.Errorf("the template kept the clone's lock: %v", tmpl)
	}
	net0 := parseLXCNet(c["net0"].(string))
	if net0["hwaddr"] == parseLXCNet(tmpl["net0"].(string))["hwaddr"] || net0["bridge"] != "vnet1" || net0["type"] != "veth" ||
		!strings.HasPrefix(c["net0"].(string), "name=eth0,bridge=vnet1,hwaddr=") {
		t.Errorf("clone net0 %q (template %q): want a new MAC, printed name first", c["net0"], tmpl["net0"])
	}
	ip := e.s.IPAMEntries("sbx1")
	if !strings.Contains(strings.Join(ip, "\n"), strings.ToUpper(net0["hwaddr"])) {
		t.Errorf("no IPAM entry for %s: %v", net0["hwaddr"], ip)
	}
	list, _ := e.ok("GET", "/nodes/pve/lxc", nil).([]any)
	if len(list) != 2 {
		t.Errorf("CT list: %v", list)
	}
	if vms, _ := e.ok("GET", "/nodes/pve/qemu", nil).([]any); len(vms) != 1 {
		t.Errorf("the qemu list shows containers: %v", vms)
	}
	e.s.RefreshStats()
	res, _ := e.ok("GET", "/cluster/resources", url.Values{"type": {"vm"}}).([]any)
	found := false
	for _, r := range res {
		m := r.(map[string]any)
		if m["id"] == "lxc/101" {
			found = m["type"] == "lxc" && m["pool"] == "sbx" && m["name"] == "box1" && m["status"] == "stopped"
		}
	}
	if !found {
		t.Errorf("no lxc/101 in /cluster/resources: %v", res)
	}
	if id := e.ok("GET", "/cluster/nextid", nil); id != "100" {
		t.Errorf("nextid %v", id)
	}
	e.wantFail("GET", "/cluster/nextid", url.Values{"vmid": {"101"}}, 400, "Parameter verification failed.")

	ct := "/nodes/pve/lxc/101"
	e.wantFail("POST", ct+"/status/stop", nil, 500, "CT 101 not running")
	e.wantFail("POST", ct+"/status/shutdown", nil, 500, "CT 101 not running")
	if st := e.task("POST", ct+"/status/start", nil); st != "OK" {
		t.Fatalf("start: %s", st)
	}
	spec, ok := e.fb.Container(101)
	if !ok || spec.Net == nil || spec.Net.Bridge != "vnet1" || spec.Net.IP != "dhcp" || spec.Net.Name != "eth0" ||
		!strings.Contains(strings.Join(ip, "\n"), spec.Net.DHCPIP.String()+" ") || spec.Hostname != "box1" || spec.MemoryMiB != 512 {
		t.Errorf("backend spec %+v (net %+v), IPAM %v", spec, spec.Net, ip)
	}
	st, _ := e.ok("GET", ct+"/status/current", nil).(map[string]any)
	if st["status"] != "running" || st["pid"] != float64(fakeCTPID(101)) || st["type"] != "lxc" || st["name"] != "box1" {
		t.Errorf("status/current: %v", st)
	}
	e.wantFail("POST", ct+"/status/start", nil, 500, "CT 101 already running")
	e.wantFail("DELETE", ct, nil, 500, "unable to destroy CT 101 - container is running")
	if st := e.task("POST", ct+"/status/stop", nil); st != "OK" {
		t.Fatalf("stop: %s", st)
	}
	if st := e.task("POST", ct+"/status/start", nil); st != "OK" {
		t.Fatalf("start: %s", st)
	}
	if st := e.task("POST", ct+"/status/shutdown", url.Values{"timeout": {"5"}}); st != "OK" {
		t.Fatalf("shutdown: %s", st)
	}
	// A CT whose init powered off is stopped, whatever the emulator did.
	if st := e.task("POST", ct+"/status/start", nil); st != "OK" {
		t.Fatalf("start: %s", st)
	}
	e.fb.PowerOffContainer(101)
	if st, _ := e.ok("GET", ct+"/status/current", nil).(map[string]any); st["status"] != "stopped" {
		t.Errorf("a powered-off CT: %v", st)
	}
	if err := e.s.SetACL("/vms/101", "root@pam", "PVEVMAdmin", true); err != nil {
		t.Fatal(err)
	}
	if st := e.task("DELETE", ct, nil); st != "OK" {
		t.Fatalf("destroy: %s", st)
	}
	e.wantFail("GET", ct+"/config", nil, 500, "Configuration file 'nodes/pve/lxc/101.conf' does not exist")
	if ip := e.s.IPAMEntries("sbx1"); strings.Contains(strings.Join(ip, "\n"), strings.ToUpper(net0["hwaddr"])) {
		t.Errorf("IPAM entry left: %v", ip)
	}
	acl, _ := e.ok("GET", "/access/acl", nil).([]any)
	for _, a := range acl {
		if a.(map[string]any)["path"] == "/vms/101" {
			t.Errorf("ACL left: %v", a)
		}
	}
	if p, _ := e.ok("GET", "/pools/sbx", nil).(map[string]any); len(p["members"].([]any)) != 0 {
		t.Errorf("pool members left: %v", p)
	}
	// A start of a CT that does not exist is a task that fails.
	e.wantTaskFail("POST", ct+"/status/start", nil, "Configuration file 'nodes/pve/lxc/101.conf' does not exist")
}

// TestCTKindsApart: a VM's id is no CT and a CT's no VM, in every
// handler's opening and in the VMID space they share.
func TestCTKindsApart(t *testing.T) {
	e := ctEnv(t)
	e.ctClone("101", nil)
	e.clone("102")
	e.wantFail("GET", "/nodes/pve/qemu/101/config", nil, 500, "Configuration file 'nodes/pve/qemu-server/101.conf' does not exist")
	e.wantFail("GET", "/nodes/pve/lxc/102/config", nil, 500, "Configuration file 'nodes/pve/lxc/102.conf' does not exist")
	e.wantFail("POST", "/nodes/pve/lxc/9100/clone", url.Values{"newid": {"102"}}, 500, "VM 102 already exists on node 'pve'")
	e.wantFail("POST", "/nodes/pve/lxc/9100/clone", url.Values{"newid": {"101"}}, 500, "CT 101 already exists on node 'pve'")
	e.wantFail("POST", "/nodes/pve/qemu", url.Values{"vmid": {"101"}}, 500, "unable to create VM 101 - CT 101 already exists on node 'pve'")
	// qemu-server's clone checks its own config directory only: the id of
	// a CT is found when pmxcfs refuses the temporary config's rename.
	e.wantTaskFail("POST", "/nodes/pve/qemu/9000/clone", url.Values{"newid": {"101"}},
		"close (rename) atomic file '/etc/pve/nodes/pve/qemu-server/101.conf' failed: File exists")
	e.wantFail("POST", "/nodes/pve/qemu/9100/clone", url.Values{"newid": {"103"}}, 500, "Configuration file 'nodes/pve/qemu-server/9100.conf' does not exist")
}

// TestCTCloneRaces: while a clone runs the template is "lock: disk" and
// the new CT "lock: create" (clone_vm's set_lock and
// create_and_lock_config, before the worker): a second clone of the
// template fails at once, whatever its new id; a start of the new CT
// fails in its task; a config change and a destroy are refused; a clone
// from another template to the same id finds the id taken. After the
// clone both locks are gone.
func TestCTCloneRaces(t *testing.T) {
	e := ctEnv(t)
	if err := e.s.AddCTTemplate(9101, "other", t.TempDir(), nil); err != nil {
		t.Fatal(err)
	}
	held, release := e.s.HoldClones()
	defer release()
	upid, _ := e.ok("POST", "/nodes/pve/lxc/9100/clone", url.Values{"newid": {"101"}}).(string)
	<-held
	ct := "/nodes/pve/lxc/101"
	e.wantFail("POST", "/nodes/pve/lxc/9100/clone", url.Values{"newid": {"102"}}, 500, "CT is locked (disk)")
	e.wantFail("POST", "/nodes/pve/lxc/9100/clone", url.Values{"newid": {"101"}}, 500, "CT is locked (disk)")
	e.wantFail("POST", "/nodes/pve/lxc/9101/clone", url.Values{"newid": {"101"}}, 500, "CT 101 already exists on node 'pve'")
	e.wantTaskFail("POST", ct+"/status/start", nil, "CT is locked (create)")
	e.wantFail("PUT", ct+"/config", url.Values{"memory": {"256"}}, 500, "CT is locked (create)")
	e.wantFail("DELETE", ct, nil, 500, "CT is locked (create)")
	e.wantTaskFail("POST", "/nodes/pve/lxc/9100/status/start", nil, "you can't start a CT if it's a template")
	if c := ctConfig(e, 101, nil); c["lock"] != "create" {
		t.Errorf("the new CT during the clone: %v", c)
	}
	if c := ctConfig(e, ctTemplateID, nil); c["lock"] != "disk" {
		t.Errorf("the template during the clone: %v", c)
	}
	release()
	if st := e.wait(upid); st != "OK" {
		t.Fatalf("held clone: %s", st)
	}
	if c := ctConfig(e, 101, nil); c["lock"] != nil {
		t.Errorf("the new CT after the clone: %v", c)
	}
	if c := ctConfig(e, ctTemplateID, nil); c["lock"] != nil {
		t.Errorf("the template after the clone: %v", c)
	}
	e.ctClone("102", nil)
}

// TestCTCloneRefusals: what clone_vm refuses before its worker, each
// answer of the request itself, leaving no lock and no new config behind.
func TestCTCloneRefusals(t *testing.T) {
	e := ctEnv(t)
	e.ctClone("101", nil)
	for _, c := range []struct {
		name   string
		path   string
		form   url.Values
		status int
		reason string
	}{
		{"storage for a linked clone", "/nodes/pve/lxc/9100/clone", url.Values{"newid": {"110"}, "storage": {"local-lvm"}}, 500, "parameter 'storage' not allowed for linked clones"},
		{"linked clone of a CT", "/nodes/pve/lxc/101/clone", url.Values{"newid": {"110"}, "full": {"0"}}, 500, "Linked clone feature for 'local-lvm:base-9100-disk-0/vm-101-disk-0' is not available"},
		{"no such pool", "/nodes/pve/lxc/9100/clone", url.Values{"newid": {"110"}, "pool": {"nope"}}, 403, "Permission check failed (pool 'nope' does not exist)"},
		{"no such source", "/nodes/pve/lxc/555/clone", url.Values{"newid": {"110"}}, 500, "Configuration file 'nodes/pve/lxc/555.conf' does not exist"},
		{"target node with local storage", "/nodes/pve/lxc/9100/clone", url.Values{"newid": {"110"}, "target": {"pve2"}}, 500, "no such cluster node 'pve2'"},
	} {
		t.Run(c.name, func(t *testing.T) {
			e.wantFail("POST", c.path, c.form, c.status, c.reason)
			e.wantFail("GET", "/nodes/pve/lxc/110/config", nil, 500, "Configuration file 'nodes/pve/lxc/110.conf' does not exist")
			for _, id := range []int{ctTemplateID, 101} {
				if cf := ctConfig(e, id, nil); cf["lock"] != nil {
					t.Errorf("CT %d locked after a refused clone: %v", id, cf)
				}
			}
		})
	}
	// A full clone of a stopped CT copies its own volume.
	if st := e.task("POST", "/nodes/pve/lxc/101/clone", url.Values{"newid": {"111"}}); st != "OK" {
		t.Fatalf("full clone: %s", st)
	}
	if c := ctConfig(e, 111, nil); c["rootfs"] != "local-lvm:vm-111-disk-0,size=8G" {
		t.Errorf("full clone rootfs: %v", c["rootfs"])
	}
}

// TestCTConfigUpdate: PUT config is synchronous; a stopped CT takes every
// change, a running one its hot-pluggable options and keeps the rest
// pending (shown by GET config unless current=1) until its next start;
// update_pct_config's refusals.
func TestCTConfigUpdate(t *testing.T) {
	e := ctEnv(t)
	e.ctClone("101", nil)
	cfg := "/nodes/pve/lxc/101/config"
	if r := e.ok("PUT", cfg, url.Values{"memory": {"256"}, "description": {"d"}}); r != nil {
		t.Errorf("PUT config answered %v, want null (synchronous)", r)
	}
	if c := ctConfig(e, 101, nil); c["memory"] != float64(256) || c["description"] != "d" {
		t.Errorf("stopped CT: %v", c)
	}
	if st := e.task("POST", "/nodes/pve/lxc/101/status/start", nil); st != "OK" {
		t.Fatal(st)
	}
	e.ok("PUT", cfg, url.Values{"hostname": {"renamed"}, "memory": {"384"}, "net0": {"name=eth0,bridge=vnet1,ip=10.10.1.50/24,gw=10.10.1.1"}})
	cur := ctConfig(e, 101, url.Values{"current": {"1"}})
	pend := ctConfig(e, 101, nil)
	if cur["hostname"] != "renamed" || cur["memory"] != float64(384) || strings.Contains(cur["net0"].(string), "10.10.1.50") {
		t.Errorf("running CT, current: %v", cur)
	}
	if !strings.Contains(pend["net0"].(string), "ip=10.10.1.50/24") {
		t.Errorf("running CT, with pending: %v", pend)
	}
	if st := e.task("POST", "/nodes/pve/lxc/101/status/stop", nil); st != "OK" {
		t.Fatal(st)
	}
	if st := e.task("POST", "/nodes/pve/lxc/101/status/start", nil); st != "OK" {
		t.Fatal(st)
	}
	if spec, _ := e.fb.Container(101); spec.Net == nil || spec.Net.IP != "10.10.1.50/24" || spec.Net.Gateway.String() != "10.10.1.1" || len(spec.Net.MAC) != 6 {
		t.Errorf("the start applied no pending net0: %+v", spec.Net)
	}
	for _, c := range []struct {
		name   string
		form   url.Values
		status int
		reason string
	}{
		{"nothing", url.Values{}, 500, "no options specified"},
		{"required", url.Values{"delete": {"memory"}}, 500, "unable to delete required option 'memory'"},
		{"read-only", url.Values{"unprivileged": {"0"}}, 500, "unable to modify read-only option: 'unprivileged'"},
		{"digest", url.Values{"description": {"x"}, "digest": {"0123456789abcdef"}}, 500, "detected modified configuration - file changed by other user? Try again."},
		{"set and delete", url.Values{"description": {"x"}, "delete": {"description"}}, 400, "Parameter verification failed."},
		{"unknown delete", url.Values{"delete": {"bogus"}}, 400, "Parameter verification failed."},
	} {
		t.Run(c.name, func(t *testing.T) { e.wantFail("PUT", cfg, c.form, c.status, c.reason) })
	}
}

// TestCTPermissions: each container call as the daemon's token with the
// roles pve-access-setup creates (pveapi/access: no change for
// containers), once without the privilege pve-container checks, which
// refuses it naming path and privilege, and once with the shipped roles,
// which allow it. Feature flags: nesting alone needs VM.Allocate (which
// the pool role has: Proxmox lets the token turn nesting on, so keeping
// it off is the daemon's own rule), any other feature is root's.
func TestCTPermissions(t *testing.T) {
	e := ctEnv(t)
	id, secret, err := e.s.ApplyAccessSetup(AccessSetup{Templates: []int{templateID, ctTemplateID}})
	if err != nil {
		t.Fatal(err)
	}
	as := func(method, path string, form url.Values) resp {
		t.Helper()
		return e.do(method, path, form, authNone, "Authorization", "PVEAPIToken="+id+"="+secret)
	}
	pool := url.Values{"pool": {access.DefaultPool}}
	e.ctClone("101", pool)
	ct := "/nodes/pve/lxc/101"
	running := func(want bool) func() {
		return func() {
			if e.s.ctRunning(101) != want {
				verb := map[bool]string{true: "start", false: "stop"}[want]
				if st := e.task("POST", ct+"/status/"+verb, nil); st != "OK" {
					t.Fatalf("%s: %s", verb, st)
				}
			}
		}
	}
	next := 110
	cloneForm := func() url.Values {
		next++
		return url.Values{"newid": {fmt.Sprint(next)}, "pool": {access.DefaultPool}}
	}
	for _, c := range []struct {
		name         string
		setup        func()
		method, path string
		form         func() url.Values
		role, priv   string // the privilege taken from role
		want         string // the refusal's reason without it ("" : "<path>, <priv>" of /vms/101)
	}{
		{"status", nil, "GET", ct + "/status/current", nil, access.RoleMain, "VM.Audit", ""},
		{"config", nil, "GET", ct + "/config", nil, access.RoleMain, "VM.Audit", ""},
		{"start", running(false), "POST", ct + "/status/start", nil, access.RoleMain, "VM.PowerMgmt", ""},
		{"stop", running(true), "POST", ct + "/status/stop", nil, access.RoleMain, "VM.PowerMgmt", ""},
		{"shutdown", running(true), "POST", ct + "/status/shutdown", nil, access.RoleMain, "VM.PowerMgmt", ""},
		{"memory", running(false), "PUT", ct + "/config", func() url.Values { return url.Values{"memory": {"256"}} }, access.RoleMain, "VM.Config.Memory", ""},
		{"cores", nil, "PUT", ct + "/config", func() url.Values { return url.Values{"cores": {"2"}} }, access.RoleMain, "VM.Config.CPU", ""},
		{"hostname", nil, "PUT", ct + "/config", func() url.Values { return url.Values{"hostname": {"h2"}} }, access.RoleMain, "VM.Config.Network", ""},
		{"description", nil, "PUT", ct + "/config", func() url.Values { return url.Values{"description": {"x"}} }, access.RoleMain, "VM.Config.Options", ""},
		{"net0 on a vnet", nil, "PUT", ct + "/config", func() url.Values { return url.Values{"net0": {"name=eth0,bridge=vnet1,ip=dhcp"}} },
			access.RoleMain, "SDN.Use", "/sdn/zones/sbx1/vnet1, SDN.Use"},
		{"nesting", nil, "PUT", ct + "/config", func() url.Values { return url.Values{"features": {"nesting=1"}} }, access.RoleMain, "VM.Allocate", ""},
		{"snapshot", nil, "POST", ct + "/snapshot", func() url.Values { return url.Values{"snapname": {"s1"}} }, access.RoleMain, "VM.Snapshot", ""},
		{"clone: the template", nil, "POST", "/nodes/pve/lxc/9100/clone", cloneForm, access.RoleTemplate, "VM.Clone", "/vms/9100, VM.Clone"},
		{"clone: the pool", nil, "POST", "/nodes/pve/lxc/9100/clone", cloneForm, access.RoleMain, "VM.Allocate", "Permission check failed"},
		{"clone: the storage", nil, "POST", "/nodes/pve/lxc/9100/clone", cloneForm, access.RoleMain, "Datastore.AllocateSpace", "/storage/local-lvm, Datastore.AllocateSpace"},
		{"clone: the bridge", nil, "POST", "/nodes/pve/lxc/9100/clone", cloneForm, access.RoleMain, "SDN.Use", "/sdn/zones/sbx1/vnet1, SDN.Use"},
		{"destroy", running(false), "DELETE", "/nodes/pve/lxc/" + fmt.Sprint(120), nil, access.RoleMain, "VM.Allocate", "/vms/120, VM.Allocate"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if c.setup != nil {
				c.setup()
			}
			if c.name == "destroy" {
				e.ctClone("120", pool)
			}
			form := url.Values{}
			if c.form != nil {
				form = c.form()
			}
			var full []string
			for _, r := range access.Roles() {
				if r.Name == c.role {
					full = r.Privs
				}
			}
			if err := e.s.AddRole(c.role, without(full, c.priv)); err != nil {
				t.Fatal(err)
			}
			want := c.want
			if want == "" {
				want = "/vms/101, " + c.priv
			}
			if r := as(c.method, c.path, form); r.status != 403 || !strings.Contains(r.reason, want) {
				t.Errorf("without %s: %d %q, want a 403 naming %q", c.priv, r.status, r.reason, want)
			}
			if err := e.s.AddRole(c.role, full); err != nil {
				t.Fatal(err)
			}
			r := as(c.method, c.path, form)
			if r.status != 200 {
				t.Fatalf("with the shipped roles: %d %q", r.status, r.reason)
			}
			if upid, ok := r.body["data"].(string); ok && strings.HasPrefix(upid, "UPID:") {
				if st := e.wait(upid); st != "OK" {
					t.Errorf("with the shipped roles: task %s", st)
				}
			}
		})
	}
	// The list shows a CT only with VM.Audit; other features than
	// nesting are root's; a privileged CT's features too.
	running(false)()
	if r := as("PUT", ct+"/config", url.Values{"features": {"nesting=1,keyctl=1"}}); r.status != 403 ||
		r.reason != "Permission check failed (changing feature flags (except nesting) is only allowed for root@pam)" {
		t.Errorf("keyctl: %d %q", r.status, r.reason)
	}
	list := func() []float64 {
		t.Helper()
		l, _ := as("GET", "/nodes/pve/lxc", nil).body["data"].([]any)
		var ids []float64
		for _, c := range l {
			ids = append(ids, c.(map[string]any)["vmid"].(float64))
		}
		return ids
	}
	if got := list(); !slices.Contains(got, 101) || !slices.Contains(got, ctTemplateID) {
		t.Errorf("list with VM.Audit (the pool's CTs, the template by its grant): %v", got)
	}
	if err := e.s.AddRole(access.RoleMain, []string{"VM.PowerMgmt"}); err != nil {
		t.Fatal(err)
	}
	if got := list(); slices.Contains(got, 101) || !slices.Contains(got, ctTemplateID) {
		t.Errorf("list without VM.Audit on the pool: %v", got)
	}
	if err := e.s.AddCTTemplate(9102, "priv", t.TempDir(), map[string]string{"unprivileged": "0"}); err != nil {
		t.Fatal(err)
	}
	e.ctCloneFrom(9102, "130")
	if r := e.do("PUT", "/nodes/pve/lxc/130/config", url.Values{"features": {"nesting=1"}}, authTicket); r.status != 200 {
		t.Errorf("root sets a privileged CT's features: %d %q", r.status, r.reason)
	}
	if err := e.s.SetACL("/vms/130", id, "PVEVMAdmin", false); err != nil {
		t.Fatal(err)
	}
	if err := e.s.SetACL("/vms/130", access.User, "PVEVMAdmin", false); err != nil {
		t.Fatal(err)
	}
	if r := as("PUT", "/nodes/pve/lxc/130/config", url.Values{"features": {"nesting=0"}}); r.status != 403 ||
		r.reason != "Permission check failed (changing feature flags for privileged container is only allowed for root@pam)" {
		t.Errorf("a privileged CT's features: %d %q", r.status, r.reason)
	}
}

// ctCloneFrom clones CT template src to newid as root.
func (e *env) ctCloneFrom(src int, newid string) {
	e.t.Helper()
	if st := e.task("POST", fmt.Sprintf("/nodes/pve/lxc/%d/clone", src), url.Values{"newid": {newid}}); st != "OK" {
		e.t.Fatalf("CT clone of %d to %s: %s", src, newid, st)
	}
}
