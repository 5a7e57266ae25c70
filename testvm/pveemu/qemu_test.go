package pveemu

import (
	"net/url"
	"testing"
)

// TestVMHandlerOpening pins the order of the checks the VM handlers make
// before they answer or start a worker (openVM): the node first, then the
// handler's own parameters, then the VM's existence, then the checks on the
// loaded VM. Each case fails at exactly one step, so a reordering changes
// the answer.
func TestVMHandlerOpening(t *testing.T) {
	e := newEnv(t)
	e.setupZone()
	e.clone("120")
	e.clone("121")
	if st := e.task("POST", "/nodes/pve/qemu/121/status/start", url.Values{}); st != "OK" {
		t.Fatalf("start 121: %s", st)
	}
	if err := e.s.AddUser("admin@pve", "pw"); err != nil {
		t.Fatal(err)
	}
	if err := e.s.SetACL("/", "admin@pve", "Administrator", true); err != nil {
		t.Fatal(err)
	}
	admin := *e
	var err error
	if admin.ticket, admin.csrf, err = e.s.Ticket("admin@pve"); err != nil {
		t.Fatal(err)
	}
	const (
		otherNode = "hostname lookup 'other' failed - failed to get address info for: other: Name or service not known"
		missing   = "Configuration file 'nodes/pve/qemu-server/404.conf' does not exist"
	)
	cases := []struct {
		name         string
		as           *env
		method, path string
		form         url.Values
		status       int
		reason       string
		param        string // the parameter a 400 names
	}{
		{"index: node", e, "GET", "/nodes/other/qemu/404", nil, 500, otherNode, ""},
		{"index: missing", e, "GET", "/nodes/pve/qemu/404", nil, 500, missing, ""},
		{"config: missing", e, "GET", "/nodes/pve/qemu/404/config", nil, 500, missing, ""},
		{"config: no such snapshot", e, "GET", "/nodes/pve/qemu/120/config", url.Values{"snapshot": {"s9"}}, 500, "snapshot 's9' does not exist", ""},
		{"status: node", e, "GET", "/nodes/other/qemu/120/status/current", nil, 500, otherNode, ""},
		{"status: missing", e, "GET", "/nodes/pve/qemu/404/status/current", nil, 500, missing, ""},
		{"snapshots: missing", e, "GET", "/nodes/pve/qemu/404/snapshot", nil, 500, missing, ""},
		{"start: node before skiplock", &admin, "POST", "/nodes/other/qemu/404/status/start", url.Values{"skiplock": {"1"}}, 500, otherNode, ""},
		{"start: skiplock before missing", &admin, "POST", "/nodes/pve/qemu/404/status/start", url.Values{"skiplock": {"1"}}, 400, "Parameter verification failed.", "skiplock"},
		{"start: missing", e, "POST", "/nodes/pve/qemu/404/status/start", url.Values{}, 500, missing, ""},
		{"stop: skiplock", &admin, "POST", "/nodes/pve/qemu/404/status/stop", url.Values{"skiplock": {"1"}}, 400, "Parameter verification failed.", "skiplock"},
		{"shutdown: missing", e, "POST", "/nodes/pve/qemu/404/status/shutdown", url.Values{}, 500, missing, ""},
		{"shutdown: not running", e, "POST", "/nodes/pve/qemu/120/status/shutdown", url.Values{}, 500, "VM 120 not running", ""},
		{"delete: skiplock before missing", &admin, "DELETE", "/nodes/pve/qemu/404", url.Values{"skiplock": {"1"}}, 400, "Parameter verification failed.", "skiplock"},
		{"delete: missing", e, "DELETE", "/nodes/pve/qemu/404", nil, 500, missing, ""},
		{"delete: running", e, "DELETE", "/nodes/pve/qemu/121", nil, 500, "VM 121 is running - destroy failed", ""},
		{"template: missing", e, "POST", "/nodes/pve/qemu/404/template", url.Values{}, 500, missing, ""},
		{"template: of a template", e, "POST", "/nodes/pve/qemu/9000/template", url.Values{}, 500, "you can't convert a template to a template", ""},
		{"template: running", e, "POST", "/nodes/pve/qemu/121/template", url.Values{}, 500, "you can't convert a VM to template if VM is running", ""},
		{"snapshot: node before name", e, "POST", "/nodes/other/qemu/404/snapshot", url.Values{"snapname": {"current"}}, 500, otherNode, ""},
		{"snapshot: name before missing", e, "POST", "/nodes/pve/qemu/404/snapshot", url.Values{"snapname": {"current"}}, 500, "invalid snapshot name 'current'", ""},
		{"snapshot: vmstate before missing", e, "POST", "/nodes/pve/qemu/404/snapshot", url.Values{"snapname": {"s1"}, "vmstate": {"1"}}, 500, "snapshot feature is not available", ""},
		{"snapshot: missing", e, "POST", "/nodes/pve/qemu/404/snapshot", url.Values{"snapname": {"s1"}}, 500, missing, ""},
		{"rollback: missing", e, "POST", "/nodes/pve/qemu/404/snapshot/s1/rollback", url.Values{}, 500, missing, ""},
		{"rollback: no such snapshot", e, "POST", "/nodes/pve/qemu/120/snapshot/s1/rollback", url.Values{}, 500, "snapshot 's1' does not exist", ""},
		{"delsnapshot: missing", e, "DELETE", "/nodes/pve/qemu/404/snapshot/s1", nil, 500, missing, ""},
		{"resize: missing", e, "PUT", "/nodes/pve/qemu/404/resize", url.Values{"disk": {"scsi0"}, "size": {"+1G"}}, 500, missing, ""},
		{"resize: no such disk", e, "PUT", "/nodes/pve/qemu/120/resize", url.Values{"disk": {"scsi5"}, "size": {"+1G"}}, 500, "disk 'scsi5' does not exist", ""},
		{"update: skiplock before options", &admin, "PUT", "/nodes/pve/qemu/404/config", url.Values{"skiplock": {"1"}}, 400, "Parameter verification failed.", "skiplock"},
		{"update: options before missing", e, "PUT", "/nodes/pve/qemu/404/config", url.Values{}, 500, "no options specified", ""},
		{"update: set and delete", e, "PUT", "/nodes/pve/qemu/404/config", url.Values{"tags": {"a"}, "delete": {"tags"}}, 400, "Parameter verification failed.", "delete"},
		{"update: missing", e, "PUT", "/nodes/pve/qemu/404/config", url.Values{"tags": {"a"}}, 500, missing, ""},
		{"async update: missing", e, "POST", "/nodes/pve/qemu/404/config", url.Values{"tags": {"a"}}, 500, missing, ""},
		{"agent exec: missing", e, "POST", "/nodes/pve/qemu/404/agent/exec", url.Values{"command": {"true"}}, 500, missing, ""},
	}
	for _, c := range cases {
		r := c.as.do(c.method, c.path, c.form, authTicket)
		if r.status != c.status || r.reason != c.reason {
			t.Errorf("%s: %s %s: %d %q, want %d %q", c.name, c.method, c.path, r.status, r.reason, c.status, c.reason)
			continue
		}
		if c.param != "" {
			if _, ok := r.errors()[c.param]; !ok || len(r.errors()) != 1 {
				t.Errorf("%s: %s %s: errors %v, want one for %s", c.name, c.method, c.path, r.errors(), c.param)
			}
		}
	}
}
