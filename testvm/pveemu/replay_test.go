package pveemu

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// pluginClient speaks to the emulator the way the reference Inspect plugin
// (UKGovernmentBEIS/inspect_proxmox_sandbox, src/proxmoxsandbox/_impl/
// async_proxmox.py) does: a password login for a ticket, then the ticket
// cookie and CSRF header on every request, JSON bodies, and the "data" of
// the answer (or, without raising, the whole answer).
type pluginClient struct {
	t            *testing.T
	base         string
	hc           *http.Client
	ticket, csrf string
	step         int
}

// reply is one answer: the HTTP status, "data" and "message".
type reply struct {
	status  int
	data    any
	message string
}

func (c *pluginClient) request(method, path string, body any, form string) reply {
	c.t.Helper()
	var rd io.Reader
	ct := ""
	switch {
	case body != nil:
		b, err := json.Marshal(body)
		if err != nil {
			c.t.Fatal(err)
		}
		rd, ct = bytes.NewReader(b), "application/json"
	case form != "":
		rd, ct = strings.NewReader(form), "application/x-www-form-urlencoded"
	}
	req, err := http.NewRequest(method, c.base+path, rd)
	if err != nil {
		c.t.Fatal(err)
	}
	if ct != "" {
		req.Header.Set("Content-Type", ct)
	}
	if c.ticket != "" {
		req.Header.Set("Cookie", "PVEAuthCookie="+url.QueryEscape(c.ticket))
		req.Header.Set("CSRFPreventionToken", c.csrf)
	}
	res, err := c.hc.Do(req)
	if err != nil {
		c.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer res.Body.Close()
	var out struct {
		Data    any    `json:"data"`
		Message string `json:"message"`
	}
	raw, _ := io.ReadAll(res.Body)
	if len(raw) > 0 {
		if err := json.Unmarshal(raw, &out); err != nil {
			c.t.Fatalf("%s %s: answer %q is not JSON: %v", method, path, raw, err)
		}
	}
	return reply{status: res.StatusCode, data: out.Data, message: out.Message}
}

// call is async_proxmox.request with raise_errors: any HTTP error fails the
// step.
func (c *pluginClient) call(what, method, path string, body any) any {
	c.t.Helper()
	c.step++
	r := c.request(method, path, body, "")
	if r.status/100 != 2 {
		c.t.Fatalf("step %d (%s): %s %s: %d %s", c.step, what, method, path, r.status, r.message)
	}
	return r.data
}

// incompleteTasks is task_wrapper.new_incomplete_tasks: the UPIDs of
// GET /cluster/tasks without endtime.
func (c *pluginClient) incompleteTasks() []string {
	c.t.Helper()
	var out []string
	for _, x := range c.call("list tasks", "GET", "/cluster/tasks", nil).([]any) {
		t := x.(map[string]any)
		if _, done := t["endtime"]; !done {
			out = append(out, t["upid"].(string))
		}
	}
	return out
}

// waitTasks is task_wrapper.do_action_and_wait_for_tasks: the incomplete
// tasks before the action, the action, then GET /cluster/tasks until no
// new incomplete task remains. The plugin sleeps 2 s after the action
// because tasks "don't turn up immediately"; the emulator registers a task
// before answering, so the test does not sleep. Beyond the plugin, which
// never reads exit statuses, every task the action started must end OK.
func (c *pluginClient) waitTasks(what string, action func()) {
	c.t.Helper()
	before := c.incompleteTasks()
	var known []string
	for _, x := range c.call("list tasks", "GET", "/cluster/tasks", nil).([]any) {
		known = append(known, x.(map[string]any)["upid"].(string))
	}
	action()
	deadline := time.Now().Add(time.Minute)
	for {
		pending := slices.DeleteFunc(c.incompleteTasks(), func(u string) bool { return slices.Contains(before, u) })
		if len(pending) == 0 {
			break
		}
		if time.Now().After(deadline) {
			c.t.Fatalf("%s: tasks still running: %v", what, pending)
		}
		time.Sleep(10 * time.Millisecond)
	}
	for _, x := range c.call("list tasks", "GET", "/cluster/tasks", nil).([]any) {
		t := x.(map[string]any)
		if !slices.Contains(known, t["upid"].(string)) && t["status"] != "OK" {
			c.t.Fatalf("%s: task %v ended %v", what, t["upid"], t["status"])
		}
	}
}

// TestReferencePluginReplay replays, step by step, the API calls the
// reference Inspect plugin makes for one sample of two sandbox VMs on two
// vnets of one zone, from zone create to zone delete (transcribed from
// src/proxmoxsandbox/_impl/{infra,sdn,qemu}_commands.py and
// task_wrapper.py: create_sdn_and_vms, then delete_sdn_and_vms), and checks
// that every answer is what the plugin reads from it.
func TestReferencePluginReplay(t *testing.T) {
	dir := t.TempDir()
	run := filepath.Join(dir, "run")
	if err := os.MkdirAll(run, 0o755); err != nil {
		t.Fatal(err)
	}
	fb := NewFakeBackend(run)
	s, err := New(Options{Node: "pve", Backend: fb, DataDir: filepath.Join(dir, "data"), RootPassword: "pw"})
	if err != nil {
		t.Fatal(err)
	}
	ts := httptest.NewTLSServer(s)
	t.Cleanup(func() { ts.Close(); _ = s.Close(); _ = fb.Close() })
	disk := filepath.Join(dir, "tdisk")
	if err := os.MkdirAll(disk, 0o755); err != nil {
		t.Fatal(err)
	}
	// A template made by the plugin earlier (existing_vm_template_tag):
	// tagged "inspect" and its own tag, with its NIC removed.
	if err := s.AddTemplate(context.Background(), 9000, "ubuntu", disk, map[string]string{"tags": "inspect;ubuntu24", "agent": "enabled=1"}); err != nil {
		t.Fatal(err)
	}
	c := &pluginClient{t: t, base: ts.URL + "/api2/json", hc: ts.Client()}
	const node = "pve"

	// AsyncProxmoxAPI login: POST /access/ticket (form), GET /version.
	c.step++
	login := c.request("POST", "/access/ticket", nil, url.Values{"username": {"root@pam"}, "password": {"pw"}}.Encode())
	d, _ := login.data.(map[string]any)
	if login.status != 200 || d["ticket"] == nil || d["CSRFPreventionToken"] == nil {
		t.Fatalf("login: %d %v", login.status, login.data)
	}
	c.ticket, c.csrf = d["ticket"].(string), d["CSRFPreventionToken"].(string)
	if v := c.call("version", "GET", "/version", nil).(map[string]any); v["version"] == nil || v["release"] == nil {
		t.Fatalf("version %v", v)
	}

	// find_proxmox_ids_start: the zone id must be free.
	for _, z := range c.call("list zones", "GET", "/cluster/sdn/zones", nil).([]any) {
		if z.(map[string]any)["zone"] == "tst123z" {
			t.Fatal("zone id taken")
		}
	}
	// create_sdn -> check_cidrs -> read_all_simple_zone_cidrs: zones (each
	// with "zone" and "type"), vnets ("zone", "vnet"), subnets ("cidr").
	for _, z := range c.call("list zones", "GET", "/cluster/sdn/zones", nil).([]any) {
		if m := z.(map[string]any); m["zone"] == nil || m["type"] == nil {
			t.Fatalf("zone entry %v", m)
		}
	}
	if vs := c.call("list vnets", "GET", "/cluster/sdn/vnets", nil).([]any); len(vs) != 0 {
		t.Fatalf("vnets before the sample: %v", vs)
	}
	zone := "tst123z"
	c.call("create zone", "POST", "/cluster/sdn/zones", map[string]any{"type": "simple", "zone": zone, "ipam": "pve", "dhcp": "dnsmasq"})
	type vnetPlan struct{ id, alias, cidr, gw, start, end string }
	plan := []vnetPlan{
		{"tst123v0", "front", "192.168.31.0/24", "192.168.31.1", "192.168.31.50", "192.168.31.100"},
		{"tst123v1", "back", "192.168.32.0/24", "192.168.32.1", "192.168.32.50", "192.168.32.100"},
	}
	for _, p := range plan {
		c.call("create vnet", "POST", "/cluster/sdn/vnets", map[string]any{"vnet": p.id, "zone": zone, "alias": p.alias})
		c.call("create subnet", "POST", "/cluster/sdn/vnets/"+p.id+"/subnets", map[string]any{
			"subnet": p.cidr, "type": "subnet", "vnet": p.id, "gateway": p.gw, "snat": true,
			"dhcp-range": []string{"start-address=" + p.start + ",end-address=" + p.end},
		})
	}
	c.waitTasks("apply sdn", func() { c.call("apply sdn", "PUT", "/cluster/sdn", nil) })
	if z, ok := fb.Zone(zone); !ok || len(z.VNets) != 2 {
		t.Fatalf("zone on the node after apply: %+v", z)
	}
	// create_ipam_mappings: only for NICs with a static MAC and IPv4 on a
	// Proxmox with the "aisi" patch; the emulator's version has none, and
	// this sample's NICs name only a vnet alias.
	if v := c.call("version", "GET", "/version", nil).(map[string]any); strings.Contains(fmt.Sprint(v["version"]), "aisi") {
		t.Fatalf("version %v", v)
	}

	// create_and_start_vm for each VM (existing_vm_template_tag).
	var vmids []int
	for i, p := range plan {
		name := fmt.Sprintf("vm%d", i)
		// _find_inspect_template_id: GET /nodes/{node}/qemu, "tags" split on
		// ";" holding "inspect" and the tag, "template" == 1.
		tmpl := 0
		for _, x := range c.call("list vms", "GET", "/nodes/"+node+"/qemu", nil).([]any) {
			vm := x.(map[string]any)
			tags := strings.Split(fmt.Sprint(vm["tags"]), ";")
			if slices.Contains(tags, "inspect") && slices.Contains(tags, "ubuntu24") && vm["template"] == float64(1) {
				tmpl = int(vm["vmid"].(float64))
			}
		}
		if tmpl != 9000 {
			t.Fatalf("template not found by tag")
		}
		// _verify_disk_controller: the data disks are on scsiN.
		cfg := c.call("read template", "GET", fmt.Sprintf("/nodes/%s/qemu/%d/config", node, tmpl), nil).(map[string]any)
		if _, ok := cfg["scsi0"]; !ok {
			t.Fatalf("template config without scsi0: %v", cfg)
		}
		// clone_vm_and_start
		idStr, ok := c.call("next id", "GET", "/cluster/nextid", nil).(string)
		var newid int
		if _, err := fmt.Sscan(idStr, &newid); !ok || err != nil {
			t.Fatalf("nextid %v", idStr)
		}
		c.waitTasks("clone", func() {
			c.call("clone", "POST", fmt.Sprintf("/nodes/%s/qemu/%d/clone", node, tmpl), map[string]any{"newid": newid, "full": 0, "name": name})
		})
		tcfg := c.call("read template tags", "GET", fmt.Sprintf("/nodes/%s/qemu/%d/config", node, tmpl), nil).(map[string]any)
		extraTags := strings.Split(tcfg["tags"].(string), ";")
		// configure_network_and_tags -> update_network: GET vnets (alias ->
		// vnet), remove_existing_nics (PUT delete=netN, form-encoded), then
		// the NICs.
		c.waitTasks("network", func() {
			aliases := map[string]string{}
			for _, x := range c.call("list vnets", "GET", "/cluster/sdn/vnets", nil).([]any) {
				v := x.(map[string]any)
				if a, ok := v["alias"].(string); ok && a != "" {
					aliases[a] = v["vnet"].(string)
				}
			}
			if aliases[p.alias] != p.id {
				t.Fatalf("alias %s -> %q, want %s", p.alias, aliases[p.alias], p.id)
			}
			vcfg := c.call("read vm", "GET", fmt.Sprintf("/nodes/%s/qemu/%d/config", node, newid), nil).(map[string]any)
			for k := range vcfg {
				if strings.HasPrefix(k, "net") {
					c.step++
					if r := c.request("PUT", fmt.Sprintf("/nodes/%s/qemu/%d/config", node, newid), nil, "delete="+k); r.status != 200 {
						t.Fatalf("remove nic %s: %d %s", k, r.status, r.message)
					}
				}
			}
			c.call("set nics", "POST", fmt.Sprintf("/nodes/%s/qemu/%d/config", node, newid), map[string]any{"net0": "virtio,bridge=" + aliases[p.alias]})
		})
		c.waitTasks("tags", func() {
			c.call("set tags", "POST", fmt.Sprintf("/nodes/%s/qemu/%d/config", node, newid), map[string]any{"tags": strings.Join(append(extraTags, "inspect"), ",")})
		})
		c.waitTasks("other", func() {
			c.call("other config", "POST", fmt.Sprintf("/nodes/%s/qemu/%d/config", node, newid), map[string]any{
				"agent": "enabled=1", "memory": 1024, "cores": 1, "name": name, "sata5": "none,media=cdrom",
			})
		})
		c.waitTasks("start", func() {
			c.call("start", "POST", fmt.Sprintf("/nodes/%s/qemu/%d/status/start", node, newid), nil)
		})
		vmids = append(vmids, newid)
	}
	// await_vm for each: status/current "running", then agent/ping.
	for _, id := range vmids {
		if st := c.call("vm status", "GET", fmt.Sprintf("/nodes/%s/qemu/%d/status/current", node, id), nil).(map[string]any); st["status"] != "running" {
			t.Fatalf("vm %d: %v", id, st["status"])
		}
		c.call("agent ping", "POST", fmt.Sprintf("/nodes/%s/qemu/%d/agent/ping", node, id), nil)
	}
	// Each VM got an IPAM entry on its vnet (the plugin does not read them
	// on this path; its cleanup would, through ipams/pve/status).
	if got := s.IPAMEntries(zone); len(got) != 4 {
		t.Fatalf("ipam %v", got)
	}
	// The plugin reads tags back split on ";" (vm_is_inspect).
	for _, x := range c.call("list vms", "GET", "/nodes/"+node+"/qemu", nil).([]any) {
		vm := x.(map[string]any)
		if vm["template"] != float64(1) && !slices.Contains(strings.Split(fmt.Sprint(vm["tags"]), ";"), "inspect") {
			t.Fatalf("vm tags %v", vm["tags"])
		}
	}

	// delete_sdn_and_vms: destroy_vm for each VM.
	for _, id := range vmids {
		q := fmt.Sprintf("/nodes/%s/qemu/%d", node, id)
		c.call("stop", "POST", q+"/status/stop", nil)
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(10 * time.Millisecond) {
			if st := c.call("vm status", "GET", q+"/status/current", nil).(map[string]any); st["status"] == "stopped" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("vm %d never stopped", id)
			}
		}
		c.call("destroy", "DELETE", q, nil)
		// vm_deleted: status/current without raising, until no "vmid".
		for deadline := time.Now().Add(time.Minute); ; time.Sleep(10 * time.Millisecond) {
			r := c.request("GET", q+"/status/current", nil, "")
			if m, ok := r.data.(map[string]any); !ok || m["vmid"] == nil {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("vm %d never went", id)
			}
		}
	}
	// tear_down_sdn_zones_and_vnets: no tracked IPAM mappings; vnets of
	// the zone ("zone" on top), their subnets by "id", the vnets, the zone,
	// then the apply.
	for _, x := range c.call("list vnets", "GET", "/cluster/sdn/vnets", nil).([]any) {
		v := x.(map[string]any)
		if v["zone"] != zone {
			continue
		}
		vn := v["vnet"].(string)
		for _, y := range c.call("list subnets", "GET", "/cluster/sdn/vnets/"+vn+"/subnets", nil).([]any) {
			id, ok := y.(map[string]any)["id"].(string)
			if !ok {
				t.Fatalf("subnet without id: %v", y)
			}
			c.call("delete subnet", "DELETE", "/cluster/sdn/vnets/"+vn+"/subnets/"+id, nil)
		}
		c.call("delete vnet", "DELETE", "/cluster/sdn/vnets/"+vn, nil)
	}
	c.call("delete zone", "DELETE", "/cluster/sdn/zones/"+zone, nil)
	c.waitTasks("apply sdn", func() { c.call("apply sdn", "PUT", "/cluster/sdn", nil) })

	if z := fb.Zones(); len(z) != 0 {
		t.Errorf("zones left on the node: %v", z)
	}
	if got := s.IPAMEntries(zone); len(got) != 0 {
		t.Errorf("ipam left: %v", got)
	}
	if vs := c.call("list vms", "GET", "/nodes/"+node+"/qemu", nil).([]any); len(vs) != 1 {
		t.Errorf("vms left: %v", vs)
	}
	if v := s.Violations(); len(v) != 0 {
		t.Errorf("schema violations: %+v", v)
	}
	t.Logf("replayed %d plugin API calls", c.step)
}
