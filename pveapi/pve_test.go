package pveapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/firewall/mgmtport"
	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitest"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// fakeServer is a small Proxmox API over HTTP: it checks every request
// against the official schema extract (unknown parameter, missing required
// parameter, value outside an enum: 400) and keeps just enough state for the
// calls this package makes. Tasks finish at once.
type fakeServer struct {
	t      *testing.T
	schema trimmed
	mu     sync.Mutex
	calls  []string
	vms    map[int]map[string]any // config; "name","tags","pool","template","status"
	zones  map[string]bool
	vnets  map[string]map[string]any
	subs   map[string][]map[string]any
	pools  map[string]bool
	rules  []map[string]any
	// rulesGen changes with every change of rules (their digest).
	rulesGen int
	fw       map[string]int
	tasks    map[string]string // upid -> exit status
	failOp   map[string]string // path suffix -> task exit status
	// applied are the vnets PUT /cluster/sdn applied; the others are
	// listed the pending way (only vnet and type on top).
	applied map[string]bool
	// ipam holds pve IPAM entries: vnet, zone, subnet, ip, mac, gateway.
	ipam []map[string]any
	// warns are the WARN lines of a task ending in warnings (one about
	// pve1 when nil); nodes are the cluster's nodes (pve1 when nil).
	warns, nodes []string

	// cts are the containers (ct_test.go), as vms ("hostname" for name).
	cts map[int]map[string]any
	// imports are the volumes of content import (images_test.go).
	imports []map[string]any
}

func newFakeServer(t *testing.T) (*fakeServer, *Client) {
	b, err := os.ReadFile("testdata/apidata-trimmed.json")
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeServer{t: t, vms: map[int]map[string]any{}, cts: map[int]map[string]any{}, zones: map[string]bool{}, vnets: map[string]map[string]any{},
		subs: map[string][]map[string]any{}, pools: map[string]bool{}, fw: map[string]int{}, tasks: map[string]string{}, failOp: map[string]string{}, applied: map[string]bool{}}
	if err := json.Unmarshal(b, &f.schema); err != nil {
		t.Fatal(err)
	}
	f.vms[9000] = map[string]any{"name": "debian", "template": 1, "status": "stopped", "net0": "virtio=AA:BB:CC:00:00:01,bridge=vmbr0", "net1": "virtio,bridge=vmbr1", "scsi0": "local-lvm:base-9000-disk-0,size=8G", "boot": "order=scsi0;net0"}
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	c, err := New(Options{URL: srv.URL + "/api2/json", TokenID: "pve-inspect@pve!daemon", Secret: "s3cret", Node: "pve1", HTTPClient: srv.Client(), TaskPoll: time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	return f, c
}

// match finds the schema operation for a concrete path.
func (f *fakeServer) match(method, path string) (string, map[string]string, bool) {
	segs := strings.Split(strings.Trim(path, "/"), "/")
	for op := range f.schema {
		m, tmpl, _ := strings.Cut(op, " ")
		if m != method {
			continue
		}
		tsegs := strings.Split(strings.Trim(tmpl, "/"), "/")
		if len(tsegs) != len(segs) {
			continue
		}
		vals := map[string]string{}
		ok := true
		for i, ts := range tsegs {
			switch {
			case strings.HasPrefix(ts, "{"):
				vals[strings.Trim(ts, "{}")] = segs[i]
			case ts != segs[i]:
				ok = false
			}
		}
		if ok {
			return op, vals, true
		}
	}
	return "", nil, false
}

func fail(w http.ResponseWriter, code int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(map[string]any{"data": nil, "message": msg})
}

func (f *fakeServer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if r.Header.Get("Authorization") != "PVEAPIToken=pve-inspect@pve!daemon=s3cret" {
		fail(w, 401, "authentication failure")
		return
	}
	path := strings.TrimPrefix(r.URL.Path, "/api2/json")
	op, pathVals, ok := f.match(r.Method, path)
	if !ok {
		f.t.Errorf("request to a path outside the schema: %s %s", r.Method, path)
		fail(w, 501, "Method not implemented")
		return
	}
	params := map[string]any{}
	for k, v := range r.URL.Query() {
		params[k] = v[0]
	}
	if r.Body != nil {
		b, _ := io.ReadAll(r.Body)
		if len(b) > 0 {
			if err := json.Unmarshal(b, &params); err != nil {
				fail(w, 400, "bad body")
				return
			}
		}
	}
	for k, v := range pathVals {
		params[k] = v
	}
	for k, v := range params {
		ps, ok := f.schema[op][k]
		if !ok {
			// indexed keys (net0) appear as net[n] in the schema
			ps, ok = f.schema[op][strings.TrimRight(k, "0123456789")+"[n]"]
		}
		if !ok {
			f.t.Errorf("%s: parameter %q is not in the schema", op, k)
			fail(w, 400, "Parameter verification failed: "+k)
			return
		}
		if len(ps.Enum) > 0 && !slices.Contains(ps.Enum, fmt.Sprint(v)) {
			f.t.Errorf("%s: %s=%v not in %v", op, k, v, ps.Enum)
		}
	}
	for k, ps := range f.schema[op] {
		if _, ok := params[k]; !ok && !ps.Optional {
			f.t.Errorf("%s: required parameter %q missing", op, k)
			fail(w, 400, "Parameter verification failed: "+k+" missing")
			return
		}
	}
	f.calls = append(f.calls, op)
	data, code, msg := f.handle(op, params)
	if code != 0 {
		fail(w, code, msg)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"data": data})
}

func (f *fakeServer) task(kind, id string) string {
	upid := fmt.Sprintf("UPID:pve1:0000%04X:00000001:6500%04X:%s:%s:pve-inspect@pve!daemon:", len(f.tasks), len(f.tasks), kind, id)
	f.tasks[upid] = "OK"
	if st, ok := f.failOp[kind]; ok {
		f.tasks[upid] = st
	}
	return upid
}

// updateConfig applies a config update's parameters p to c: every key
// but node and vmid set, the keys of "delete" removed.
func updateConfig(c, p map[string]any) {
	for k, v := range p {
		if k != "node" && k != "vmid" && k != "delete" {
			c[k] = v
		}
	}
	if d, ok := p["delete"].(string); ok {
		for _, k := range strings.Split(d, ",") {
			delete(c, k)
		}
	}
}

func atoi(v any) int { n, _ := strconv.Atoi(fmt.Sprint(v)); return n }

func (f *fakeServer) handle(op string, p map[string]any) (any, int, string) {
	vmid := atoi(p["vmid"])
	if strings.Contains(op, " /nodes/{node}/lxc") {
		return f.handleCT(op, vmid, p)
	}
	if data, code, msg, ok := f.handleImages(op, vmid, p); ok {
		return data, code, msg
	}
	switch op {
	case "GET /nodes/{node}/tasks/{upid}/status":
		st, ok := f.tasks[fmt.Sprint(p["upid"])]
		if !ok {
			return nil, 400, "no such task"
		}
		return map[string]any{"status": "stopped", "exitstatus": st, "upid": p["upid"]}, 0, ""
	case "GET /cluster/nextid":
		if v, ok := p["vmid"]; ok { // pve-manager Cluster.pm nextid: is this one free
			n, _ := strconv.Atoi(fmt.Sprint(v))
			if f.vms[n] != nil {
				return nil, 400, fmt.Sprintf("Parameter verification failed. vmid: VM %d already exists", n)
			}
			return strconv.Itoa(n), 0, ""
		}
		id := 100
		for f.vms[id] != nil {
			id++
		}
		return strconv.Itoa(id), 0, ""
	case "GET /nodes/{node}/tasks/{upid}/log":
		st := f.tasks[fmt.Sprint(p["upid"])]
		out := []map[string]any{{"n": 1, "t": "starting"}}
		if strings.HasPrefix(st, "WARNINGS") {
			warns := f.warns
			if warns == nil {
				warns = []string{"pve1: reloading network config failed"}
			}
			for _, w := range warns {
				out = append(out, map[string]any{"n": len(out) + 1, "t": "WARN: " + w})
			}
		}
		return append(out, map[string]any{"n": len(out) + 1, "t": "TASK " + st}), 0, ""
	case "GET /cluster/resources":
		// As before pvestatd's first update: status unknown, no name, no
		// template flag; only the VM list, tags, lock and pool are live.
		var out []map[string]any
		for id, c := range f.vms {
			out = append(out, map[string]any{"type": "qemu", "id": fmt.Sprintf("qemu/%d", id), "vmid": id, "node": "pve1", "status": "unknown", "tags": c["tags"], "pool": c["pool"]})
		}
		for id, c := range f.cts {
			out = append(out, map[string]any{"type": "lxc", "id": fmt.Sprintf("lxc/%d", id), "vmid": id, "node": "pve1", "status": "unknown", "tags": c["tags"], "pool": c["pool"]})
		}
		return out, 0, ""
	case "GET /nodes/{node}/qemu":
		var out []map[string]any
		for id, c := range f.vms {
			out = append(out, map[string]any{"vmid": id, "name": c["name"], "status": c["status"], "tags": c["tags"], "template": c["template"]})
		}
		return out, 0, ""
	case "GET /nodes/{node}/qemu/{vmid}/status/current":
		c, ok := f.vms[vmid]
		if !ok {
			return nil, 500, fmt.Sprintf("Configuration file 'nodes/pve1/qemu-server/%d.conf' does not exist", vmid)
		}
		st := map[string]any{"vmid": vmid, "name": c["name"], "status": c["status"], "tags": c["tags"], "template": c["template"]}
		if q, ok := c["qmpstatus"]; ok {
			st["qmpstatus"] = q
		}
		return st, 0, ""
	case "POST /nodes/{node}/qemu/{vmid}/clone":
		src, ok := f.vms[vmid]
		if !ok {
			return nil, 500, fmt.Sprintf("Configuration file 'nodes/pve1/qemu-server/%d.conf' does not exist", vmid)
		}
		nid := atoi(p["newid"])
		if f.vms[nid] != nil {
			return nil, 500, fmt.Sprintf("unable to create VM %d: config file already exists", nid)
		}
		if _, full := p["full"]; full {
			f.t.Error("clone asked for a full clone")
		}
		c := map[string]any{}
		for k, v := range src {
			c[k] = v
		}
		c["name"], c["template"], c["status"], c["pool"] = p["name"], 0, "stopped", p["pool"]
		f.vms[nid] = c
		return f.task("qmclone", strconv.Itoa(vmid)), 0, ""
	case "GET /nodes/{node}/qemu/{vmid}/config":
		c, ok := f.vms[vmid]
		if !ok {
			return nil, 500, "Configuration file does not exist"
		}
		return c, 0, ""
	case "POST /nodes/{node}/qemu/{vmid}/config":
		c, ok := f.vms[vmid]
		if !ok {
			return nil, 500, "Configuration file does not exist"
		}
		updateConfig(c, p)
		return f.task("qmconfig", strconv.Itoa(vmid)), 0, ""
	case "PUT /nodes/{node}/qemu/{vmid}/config": // synchronous: no task
		c, ok := f.vms[vmid]
		if !ok {
			return nil, 500, "Configuration file does not exist"
		}
		for k, v := range p {
			if k != "node" && k != "vmid" {
				c[k] = v
			}
		}
		return nil, 0, ""
	case "PUT /nodes/{node}/qemu/{vmid}/resize":
		f.vms[vmid]["resized"] = fmt.Sprint(p["disk"], "=", p["size"])
		return f.task("qmresize", strconv.Itoa(vmid)), 0, ""
	case "POST /nodes/{node}/qemu/{vmid}/status/start":
		f.vms[vmid]["status"] = "running"
		return f.task("qmstart", strconv.Itoa(vmid)), 0, ""
	case "POST /nodes/{node}/qemu/{vmid}/status/stop":
		// vm_stop forks at once; a missing VM fails inside the task.
		if _, ok := f.vms[vmid]; !ok {
			upid := f.task("qmstop", strconv.Itoa(vmid))
			f.tasks[upid] = fmt.Sprintf("Configuration file 'nodes/pve1/qemu-server/%d.conf' does not exist", vmid)
			return upid, 0, ""
		}
		f.vms[vmid]["status"] = "stopped"
		return f.task("qmstop", strconv.Itoa(vmid)), 0, ""
	case "DELETE /nodes/{node}/qemu/{vmid}":
		if _, ok := f.vms[vmid]; !ok {
			return nil, 500, "Configuration file does not exist"
		}
		if p["purge"] != "1" {
			f.t.Error("delete without purge")
		}
		if f.vms[vmid]["status"] == "running" {
			return nil, 500, fmt.Sprintf("VM %d is running - destroy failed", vmid)
		}
		delete(f.vms, vmid)
		return f.task("qmdestroy", strconv.Itoa(vmid)), 0, ""
	case "POST /nodes/{node}/qemu/{vmid}/snapshot":
		return f.task("qmsnapshot", strconv.Itoa(vmid)), 0, ""
	case "POST /nodes/{node}/qemu/{vmid}/snapshot/{snapname}/rollback":
		// No RAM in the snapshot: the rollback stops the VM, start=1 starts it.
		f.vms[vmid]["status"] = "stopped"
		if fmt.Sprint(p["start"]) == "1" {
			f.vms[vmid]["status"] = "running"
		}
		return f.task("qmrollback", strconv.Itoa(vmid)), 0, ""
	case "POST /cluster/sdn/zones":
		f.zones[fmt.Sprint(p["zone"])] = true
		return nil, 0, ""
	case "DELETE /cluster/sdn/zones/{zone}":
		z := fmt.Sprint(p["zone"])
		if !f.zones[z] {
			return nil, 500, "sdn zone '" + z + "' does not exist"
		}
		delete(f.zones, z)
		return nil, 0, ""
	case "POST /cluster/sdn/vnets":
		f.vnets[fmt.Sprint(p["vnet"])] = map[string]any{"vnet": p["vnet"], "zone": p["zone"], "alias": p["alias"], "type": "vnet"}
		return nil, 0, ""
	case "GET /cluster/sdn/vnets":
		var out []map[string]any
		for id, v := range f.vnets {
			if !f.applied[id] {
				v = map[string]any{"vnet": id, "type": "vnet", "state": "new", "pending": map[string]any{"zone": v["zone"], "alias": v["alias"]}}
			}
			out = append(out, v)
		}
		return out, 0, ""
	case "GET /cluster/sdn/ipams/{ipam}/status":
		return f.ipam, 0, ""
	case "POST /cluster/sdn/vnets/{vnet}/ips":
		for _, e := range f.ipam {
			if e["vnet"] == p["vnet"] && e["ip"] == p["ip"] {
				return nil, 500, fmt.Sprintf("IP '%v' already exist", p["ip"])
			}
		}
		f.ipam = append(f.ipam, map[string]any{"vnet": p["vnet"], "zone": p["zone"], "subnet": "10.9.0.0/24", "ip": p["ip"], "mac": p["mac"]})
		return nil, 0, ""
	case "DELETE /cluster/sdn/vnets/{vnet}/ips":
		n := len(f.ipam)
		f.ipam = slices.DeleteFunc(f.ipam, func(e map[string]any) bool {
			return e["vnet"] == p["vnet"] && e["zone"] == p["zone"] && e["ip"] == p["ip"]
		})
		if len(f.ipam) == n {
			return nil, 500, fmt.Sprintf("IP '%v' does not exist in IPAM DB", p["ip"])
		}
		return nil, 0, ""
	case "DELETE /cluster/sdn/vnets/{vnet}":
		delete(f.vnets, fmt.Sprint(p["vnet"]))
		return nil, 0, ""
	case "POST /cluster/sdn/vnets/{vnet}/subnets":
		vn := fmt.Sprint(p["vnet"])
		cidr := fmt.Sprint(p["subnet"])
		id := fmt.Sprint(f.vnets[vn]["zone"], "-", strings.Replace(cidr, "/", "-", 1))
		f.subs[vn] = append(f.subs[vn], map[string]any{"subnet": id, "cidr": cidr, "gateway": p["gateway"], "snat": p["snat"], "dhcp-range": p["dhcp-range"]})
		return nil, 0, ""
	case "GET /cluster/sdn/vnets/{vnet}/subnets":
		return f.subs[fmt.Sprint(p["vnet"])], 0, ""
	case "DELETE /cluster/sdn/vnets/{vnet}/subnets/{subnet}":
		vn := fmt.Sprint(p["vnet"])
		for _, e := range f.ipam {
			if e["vnet"] == vn && e["gateway"] != 1 && strings.HasSuffix(fmt.Sprint(p["subnet"]), strings.Replace(fmt.Sprint(e["subnet"]), "/", "-", 1)) {
				return nil, 500, fmt.Sprintf("cannot delete subnet '%v', not empty", e["subnet"])
			}
		}
		f.subs[vn] = slices.DeleteFunc(f.subs[vn], func(s map[string]any) bool { return s["subnet"] == p["subnet"] })
		return nil, 0, ""
	case "PUT /cluster/sdn":
		upid := f.task("reloadnetworkall", "")
		if f.tasks[upid] == "OK" {
			for id := range f.vnets {
				f.applied[id] = true
			}
			for id := range f.zones {
				f.applied["zone/"+id] = true
			}
		}
		return upid, 0, ""
	case "GET /cluster/sdn/zones":
		out := []map[string]any{}
		for _, id := range slices.Sorted(maps.Keys(f.zones)) {
			e := map[string]any{"zone": id, "type": "simple"}
			if !f.applied["zone/"+id] {
				e["state"] = "new"
			}
			out = append(out, e)
		}
		return out, 0, ""
	case "GET /nodes":
		nodes := f.nodes
		if nodes == nil {
			nodes = []string{"pve1"}
		}
		out := []map[string]any{}
		for _, n := range nodes {
			out = append(out, map[string]any{"node": n, "status": "online"})
		}
		return out, 0, ""
	case "GET /pools":
		var out []map[string]any
		for id := range f.pools {
			out = append(out, map[string]any{"poolid": id})
		}
		return out, 0, ""
	case "GET /nodes/{node}/firewall/rules":
		out := []map[string]any{}
		for i, r := range f.rules {
			c := map[string]any{"pos": i, "digest": fmt.Sprintf("d%d", f.rulesGen)}
			for k, v := range r {
				c[k] = v
			}
			out = append(out, c)
		}
		return out, 0, ""
	case "POST /nodes/{node}/firewall/rules":
		r := map[string]any{}
		for k, v := range p {
			if k != "node" {
				r[k] = v
			}
		}
		f.rules = append([]map[string]any{r}, f.rules...)
		f.rulesGen++
		return nil, 0, ""
	case "DELETE /nodes/{node}/firewall/rules/{pos}":
		// Rules.pm delete_rule: assert_if_modified on the digest
		if p["digest"] != fmt.Sprintf("d%d", f.rulesGen) {
			return nil, 500, "detected modified configuration - file changed by other user? Try again."
		}
		i := atoi(p["pos"])
		f.rules = slices.Delete(f.rules, i, i+1)
		f.rulesGen++
		return nil, 0, ""
	case "GET /nodes/{node}/firewall/options":
		return map[string]any{"enable": f.fw["node"]}, 0, ""
	case "PUT /nodes/{node}/firewall/options":
		f.fw["node"] = atoi(p["enable"])
		return nil, 0, ""
	case "GET /cluster/firewall/options":
		return map[string]any{"enable": f.fw["cluster"]}, 0, ""
	case "PUT /cluster/firewall/options":
		f.fw["cluster"] = atoi(p["enable"])
		return nil, 0, ""
	}
	f.t.Errorf("fake server: unhandled %s", op)
	return nil, 501, "not implemented"
}

func TestClientAgainstSchema(t *testing.T) {
	f, c := newFakeServer(t)
	ctx := context.Background()
	id, err := c.NextID(ctx)
	if err != nil || id != 100 {
		t.Fatalf("next id %d %v", id, err)
	}
	if tid, err := c.TemplateID(ctx, "debian"); err != nil || tid != 9000 {
		t.Fatalf("template id %d %v", tid, err)
	}
	if _, err := c.TemplateID(ctx, "nope"); !errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("unknown template: %v", err)
	}
	// The pool is pve-access-setup's: a missing one is an error naming
	// it, and the client never creates one (Pool.Allocate, not granted).
	if err := c.EnsurePool(ctx, "pve-inspect"); err == nil || !strings.Contains(err.Error(), "pve-access-setup") {
		t.Fatalf("missing pool: %v", err)
	}
	f.mu.Lock()
	if slices.Contains(f.calls, "POST /pools") {
		t.Error("the client created a pool")
	}
	f.pools["pve-inspect"] = true
	f.mu.Unlock()
	if err := c.EnsurePool(ctx, "pve-inspect"); err != nil {
		t.Fatal(err)
	}
	if err := c.CloneVM(ctx, sandbox.CloneSpec{Template: 9000, NewID: 100, Name: "pvei-x-vm0", Pool: "pve-inspect"}); err != nil {
		t.Fatal(err)
	}
	if err := c.CloneVM(ctx, sandbox.CloneSpec{Template: 9000, NewID: 100, Name: "again"}); !errors.Is(err, sandbox.ErrExists) {
		t.Fatalf("clone onto a taken id: %v", err)
	}
	if err := c.ConfigureVM(ctx, 100, sandbox.VMConfig{Tags: []string{"pvei-n-node1", "pvei-s-sbabcdef"}, Cores: 2, MemoryMiB: 2048, Bridges: []string{"vabcdef0"}}); err != nil {
		t.Fatal(err)
	}
	cfg := f.vms[100]
	if cfg["net0"] != "virtio,bridge=vabcdef0,firewall=0" || cfg["net1"] != nil || cfg["tags"] != "pvei-n-node1;pvei-s-sbabcdef" {
		t.Errorf("config after configure: %v", cfg)
	}
	if err := c.ResizeDisk(ctx, 100, 20); err != nil || f.vms[100]["resized"] != "scsi0=20G" {
		t.Fatalf("resize: %v %v", err, f.vms[100]["resized"])
	}
	if err := c.StartVM(ctx, 100); err != nil {
		t.Fatal(err)
	}
	info, err := c.VM(ctx, 100)
	if err != nil || info.Status != "running" || !slices.Equal(info.Tags, []string{"pvei-n-node1", "pvei-s-sbabcdef"}) || info.Pool != "pve-inspect" || info.Template {
		t.Fatalf("vm info %+v %v", info, err)
	}
	if _, err := c.VM(ctx, 4242); !errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("missing vm: %v", err)
	}
	f.failOp["qmsnapshot"] = "snapshot feature is not available"
	if err := c.Snapshot(ctx, 100, "s1"); err == nil || !strings.Contains(err.Error(), "snapshot feature is not available") {
		t.Fatalf("failed task not reported: %v", err)
	}
	f.failOp["qmsnapshot"] = "snapshot name 's1' already used"
	if err := c.Snapshot(ctx, 100, "s1"); !errors.Is(err, sandbox.ErrExists) {
		t.Fatalf("a snapshot name taken: %v, want ErrExists (a conflict, not a Proxmox failure)", err)
	}
	delete(f.failOp, "qmsnapshot")
	// A warm pool claim: tags and name only, in one synchronous request
	// (the NIC, with its MAC, stays as it is).
	net0 := cfg["net0"]
	calls := len(f.calls)
	if err := c.SetVMTags(ctx, 100, "pvei-sbabcdef-web", []string{"pvei-n-node1", "pvei-s-sbabcdef"}); err != nil {
		t.Fatal(err)
	}
	if got := f.calls[calls:]; len(got) != 1 || !strings.HasPrefix(got[0], "PUT /nodes/{node}/qemu/{vmid}/config") {
		t.Errorf("SetVMTags made %v, want one PUT of the config", got)
	}
	if cfg := f.vms[100]; cfg["name"] != "pvei-sbabcdef-web" || cfg["tags"] != "pvei-n-node1;pvei-s-sbabcdef" || cfg["net0"] != net0 {
		t.Errorf("config after SetVMTags: %v", cfg)
	}
	if err := c.StopVM(ctx, 100); err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteVM(ctx, 100); err != nil {
		t.Fatal(err)
	}
	if err := c.DeleteVM(ctx, 100); !errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("delete of a missing vm: %v", err)
	}
	if err := c.DeleteZone(ctx, "nozone"); !errors.Is(err, sandbox.ErrNotFound) {
		t.Fatalf("delete of a missing zone: %v", err)
	}
	if _, err := New(Options{URL: "https://x", Node: "n", TokenID: "root@pam", Secret: "pw"}); err == nil {
		t.Error("a password login was accepted")
	}
}

// TestSandboxLifecycleThroughAPI runs the sandbox API over this client and
// the schema-checking server, and counts the Proxmox calls of one
// lifecycle.
func TestSandboxLifecycleThroughAPI(t *testing.T) {
	f, c := newFakeServer(t)
	f.pools["pve-inspect"] = true // pve-access-setup's
	g := apitest.NewGuests()
	// The fake guests come up when the HTTP fake starts a VM.
	up := func(ctx context.Context) {
		for ctx.Err() == nil {
			f.mu.Lock()
			for id, cfg := range f.vms {
				if cfg["status"] == "running" {
					g.Dial(fmt.Sprintf("/q/%d.qga", id))
					startGuest(g, id)
				}
			}
			f.mu.Unlock()
			time.Sleep(time.Millisecond)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go up(ctx)
	eng, err := sandbox.New(sandbox.Options{
		Node:     "node1",
		Proxmox:  c,
		Guests:   g.Dial,
		StateDir: t.TempDir(),
		Logger:   slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	srv, err := sandboxapi.New(eng, sandboxapi.Options{
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := eng.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	f.mu.Lock()
	f.calls = nil
	f.mu.Unlock()
	ts := httptest.NewServer(srv.LocalHandler())
	defer ts.Close()
	resp, err := http.Post(ts.URL+"/v1/sandboxes", "application/json", strings.NewReader(`{"vms":[{"template":"debian"},{"template":"debian","disk_gib":16}]}`))
	if err != nil {
		t.Fatal(err)
	}
	var sb apitype.Sandbox
	_ = json.NewDecoder(resp.Body).Decode(&sb)
	resp.Body.Close()
	if resp.StatusCode != 201 {
		t.Fatalf("create: %d %+v", resp.StatusCode, sb)
	}
	f.mu.Lock()
	if len(f.vnets) != 1 || len(f.zones) != 1 || f.vnets[sb.Networks[0].VNet]["alias"] != "pvei-n-node1 pvei-s-"+sb.ID {
		t.Errorf("sdn after create: zones %v vnets %v", f.zones, f.vnets)
	}
	for _, v := range sb.VMs {
		if f.vms[v.VMID]["net1"] != nil {
			t.Errorf("vm %d kept the template's second NIC", v.VMID)
		}
	}
	f.mu.Unlock()
	req, _ := http.NewRequest("DELETE", ts.URL+"/v1/sandboxes/"+sb.ID, nil)
	resp, err = http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != 204 {
		t.Fatalf("delete: %v %v", resp, err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.vms) != 1 || len(f.vnets) != 0 || len(f.zones) != 0 {
		t.Errorf("left after delete: vms %d vnets %v zones %v", len(f.vms), f.vnets, f.zones)
	}
	t.Logf("Proxmox API calls for one 2-VM sandbox lifecycle (create+delete, task polls included): %d", len(f.calls))
}

// startGuest marks a fake guest running (the HTTP fake has no hook into
// apitest.Guests, so the test does it through a start/stop round trip).
func startGuest(g *apitest.Guests, id int) {
	p := apitest.NewProxmox(g, nil)
	p.AddVM(sandbox.VMInfo{VMID: id, Status: "running"})
}

var _ mgmtport.Firewall = (*Client)(nil)

func TestManagementRulesThroughAPI(t *testing.T) {
	f, c := newFakeServer(t)
	f.rules = []map[string]any{{"type": "in", "action": "ACCEPT", "proto": "tcp", "dport": "3128", "comment": "operator", "enable": 1}}
	f.fw["cluster"] = 1 // root turns the cluster firewall on (pve-access-setup)
	conv := mgmtport.New(c, 8443, slog.New(slog.NewTextHandler(io.Discard, nil)))
	ctx := context.Background()
	if changed, err := conv.Converge(ctx, "vmbr0"); err != nil || !changed {
		t.Fatalf("converge: %v %v", changed, err)
	}
	f.mu.Lock()
	n := len(f.rules)
	calls := len(f.calls)
	f.mu.Unlock()
	if n != 10 || f.fw["node"] != 1 || f.fw["cluster"] != 1 {
		t.Fatalf("rules %d fw %v", n, f.fw)
	}
	if changed, err := conv.Converge(ctx, "vmbr0"); err != nil || changed {
		t.Fatalf("second converge changed things: %v %v", changed, err)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, op := range f.calls[calls:] {
		if !strings.HasPrefix(op, "GET ") {
			t.Errorf("converged state still wrote: %s", op)
		}
	}
	if f.rules[6]["sport"] != "8006" || f.rules[6]["type"] != "out" || f.rules[6]["iface"] != "vmbr0" {
		t.Errorf("node OUT rule for the API's replies: %v", f.rules[6])
	}
	if f.rules[9]["comment"] != "operator" {
		t.Errorf("operator rule moved: %v", f.rules)
	}
}

// TestRealNodeSemantics covers what a real node does and the fake above
// models: stale /cluster/resources, rollback stopping the VM, destroy
// refusing a running VM, pending vnets, apply warnings, IPAM entries
// blocking a subnet delete.
func TestRealNodeSemantics(t *testing.T) {
	ctx := context.Background()
	clone := func(t *testing.T, f *fakeServer, c *Client) {
		t.Helper()
		if err := c.CloneVM(ctx, sandbox.CloneSpec{Template: 9000, NewID: 100, Name: "pvei-x-vm0", Pool: "pve-inspect"}); err != nil {
			t.Fatal(err)
		}
	}
	sdn := func(t *testing.T, f *fakeServer, c *Client) {
		t.Helper()
		if err := c.CreateZone(ctx, sandbox.ZoneSpec{ID: "sbz"}); err != nil {
			t.Fatal(err)
		}
		if err := c.CreateVNet(ctx, sandbox.VNetSpec{ID: "sbv0", Zone: "sbz", Alias: "pvei-n-node1 pvei-s-sbz"}); err != nil {
			t.Fatal(err)
		}
		if err := c.CreateSubnet(ctx, sandbox.SubnetSpec{VNet: "sbv0", CIDR: "10.9.0.0/24", Gateway: "10.9.0.1", DHCPRanges: []apitype.DHCPRange{{Start: "10.9.0.10", End: "10.9.0.20"}}}); err != nil {
			t.Fatal(err)
		}
	}
	cases := []struct {
		name string
		run  func(t *testing.T, f *fakeServer, c *Client)
	}{
		{"live status although resources say unknown", func(t *testing.T, f *fakeServer, c *Client) {
			clone(t, f, c)
			if err := c.StartVM(ctx, 100); err != nil {
				t.Fatal(err)
			}
			info, err := c.VM(ctx, 100)
			if err != nil || info.Status != "running" || info.Name != "pvei-x-vm0" || info.Pool != "pve-inspect" {
				t.Fatalf("vm %+v %v", info, err)
			}
			vms, err := c.ListVMs(ctx)
			if err != nil || len(vms) != 2 || vms[0].VMID != 100 || vms[0].Status != "running" || !vms[1].Template || vms[0].Pool != "pve-inspect" {
				t.Fatalf("list %+v %v", vms, err)
			}
		}},
		{"rollback starts the VM again", func(t *testing.T, f *fakeServer, c *Client) {
			clone(t, f, c)
			if err := c.StartVM(ctx, 100); err != nil {
				t.Fatal(err)
			}
			if err := c.Rollback(ctx, 100, "clean"); err != nil {
				t.Fatal(err)
			}
			if info, err := c.VM(ctx, 100); err != nil || info.Status != "running" {
				t.Fatalf("after rollback %+v %v", info, err)
			}
		}},
		{"delete stops a running VM first", func(t *testing.T, f *fakeServer, c *Client) {
			clone(t, f, c)
			if err := c.StartVM(ctx, 100); err != nil {
				t.Fatal(err)
			}
			if err := c.DeleteVM(ctx, 100); err != nil {
				t.Fatal(err)
			}
			if _, err := c.VM(ctx, 100); !errors.Is(err, sandbox.ErrNotFound) {
				t.Fatalf("vm after delete: %v", err)
			}
		}},
		{"pending vnet keeps zone and alias under pending", func(t *testing.T, f *fakeServer, c *Client) {
			sdn(t, f, c)
			vs, err := c.ListVNets(ctx)
			if err != nil || len(vs) != 1 || vs[0] != (sandbox.VNetInfo{ID: "sbv0", Zone: "sbz", Alias: "pvei-n-node1 pvei-s-sbz"}) {
				t.Fatalf("vnets %+v %v", vs, err)
			}
		}},
		{"apply with warnings fails", func(t *testing.T, f *fakeServer, c *Client) {
			sdn(t, f, c)
			f.failOp["reloadnetworkall"] = "WARNINGS: 1"
			err := c.ApplySDN(ctx)
			if err == nil || !strings.Contains(err.Error(), "WARNINGS: 1") || !strings.Contains(err.Error(), "reloading network config failed") {
				t.Fatalf("apply with warnings: %v", err)
			}
			delete(f.failOp, "reloadnetworkall")
			if err := c.ApplySDN(ctx); err != nil {
				t.Fatal(err)
			}
		}},
		{"subnet delete clears IPAM entries first", func(t *testing.T, f *fakeServer, c *Client) {
			sdn(t, f, c)
			if err := c.ApplySDN(ctx); err != nil {
				t.Fatal(err)
			}
			gw := map[string]any{"vnet": "sbv0", "zone": "sbz", "subnet": "10.9.0.0/24", "ip": "10.9.0.1", "gateway": 1}
			f.ipam = []map[string]any{gw, {"vnet": "sbv0", "zone": "sbz", "subnet": "10.9.0.0/24", "ip": "10.9.0.10", "mac": "BC:24:11:00:00:02", "vmid": 100},
				{"vnet": "other", "zone": "oz", "subnet": "10.8.0.0/24", "ip": "10.8.0.10", "mac": "BC:24:11:00:00:03"}}
			if err := c.DeleteSubnet(ctx, "sbv0", "10.9.0.0/24"); err != nil {
				t.Fatal(err)
			}
			if len(f.ipam) != 2 || f.ipam[0]["ip"] != "10.9.0.1" || f.ipam[1]["vnet"] != "other" || len(f.subs["sbv0"]) != 0 {
				t.Fatalf("ipam %v subnets %v", f.ipam, f.subs["sbv0"])
			}
		}},
		{"VM addresses from the IPAM, only of the vnets asked for", func(t *testing.T, f *fakeServer, c *Client) {
			f.ipam = []map[string]any{
				{"vnet": "sbv0", "zone": "sbz", "subnet": "10.9.0.0/24", "ip": "10.9.0.1", "gateway": 1},
				{"vnet": "sbv0", "zone": "sbz", "subnet": "10.9.0.0/24", "ip": "10.9.0.10", "mac": "BC:24:11:00:00:02", "vmid": 100, "hostname": "pvei-sb-vm0"},
				{"vnet": "sbv1", "zone": "sbz", "subnet": "10.9.1.0/24", "ip": "10.9.1.10", "mac": "BC:24:11:00:00:04", "vmid": "101"},
				{"vnet": "sbv0", "zone": "sbz", "subnet": "10.9.0.0/24", "ip": "10.9.0.11", "mac": "BC:24:11:00:00:05"},
				{"vnet": "sbv0", "zone": "sbz", "subnet": "10.9.0.0/24", "ip": "10.9.0.12"},
				{"vnet": "other", "zone": "oz", "subnet": "10.8.0.0/24", "ip": "10.8.0.10", "mac": "BC:24:11:00:00:03", "vmid": 102}}
			got, err := c.IPAMAddresses(ctx, []string{"sbv0", "sbv1"})
			if err != nil {
				t.Fatal(err)
			}
			want := []sandbox.IPAMAddress{{VNet: "sbv0", VMID: 100, IP: netip.MustParseAddr("10.9.0.10"), MAC: "bc:24:11:00:00:02"},
				{VNet: "sbv1", VMID: 101, IP: netip.MustParseAddr("10.9.1.10"), MAC: "bc:24:11:00:00:04"},
				{VNet: "sbv0", IP: netip.MustParseAddr("10.9.0.11"), MAC: "bc:24:11:00:00:05"}}
			if !slices.Equal(got, want) {
				t.Fatalf("addresses %+v, want %+v (no gateway, no entry of neither a vmid nor a MAC, nothing of vnet other; MACs in lower case)", got, want)
			}
		}},
		{"a fixed MAC's entries in every zone, any case", func(t *testing.T, f *fakeServer, c *Client) {
			f.ipam = []map[string]any{
				{"vnet": "sbv0", "zone": "sbz", "subnet": "10.9.0.0/24", "ip": "10.9.0.1", "gateway": 1},
				{"vnet": "sbv0", "zone": "sbz", "subnet": "10.9.0.0/24", "ip": "10.9.0.10", "mac": "BC:24:11:00:00:02", "vmid": 100},
				{"vnet": "other", "zone": "oz", "subnet": "10.8.0.0/24", "ip": "10.8.0.5", "mac": "52:54:00:ab:cd:ef"},
				{"vnet": "other", "zone": "oz", "subnet": "10.8.0.0/24", "ip": "10.8.0.10", "mac": "BC:24:11:00:00:03", "vmid": 102}}
			got, err := c.MACEntries(ctx, []string{"52:54:00:AB:CD:EF", "BC:24:11:00:00:02"})
			if err != nil {
				t.Fatal(err)
			}
			want := []sandbox.IPAMAddress{{VNet: "sbv0", VMID: 100, IP: netip.MustParseAddr("10.9.0.10"), MAC: "bc:24:11:00:00:02"},
				{VNet: "other", IP: netip.MustParseAddr("10.8.0.5"), MAC: "52:54:00:ab:cd:ef"}}
			if !slices.Equal(got, want) {
				t.Fatalf("entries %+v, want %+v (the MACs asked for, on any vnet, in any case; no gateway)", got, want)
			}
		}},
		{"a fixed address: reserved for the MAC, the NIC configured with it, the range address released", func(t *testing.T, f *fakeServer, c *Client) {
			sdn(t, f, c)
			ip := netip.MustParseAddr("10.9.0.5")
			if err := c.ReserveIP(ctx, "sbz", "sbv0", ip, "02:00:00:00:00:0A"); err != nil {
				t.Fatal(err)
			}
			if err := c.ReserveIP(ctx, "sbz", "sbv0", ip, "02:00:00:00:00:0B"); err == nil || !strings.Contains(err.Error(), "already exist") {
				t.Fatalf("the address reserved twice: %v", err)
			}
			if err := c.CloneVM(ctx, sandbox.CloneSpec{Template: 9000, NewID: 100, Name: "pvei-x-vm0"}); err != nil {
				t.Fatal(err)
			}
			if err := c.ConfigureVM(ctx, 100, sandbox.VMConfig{Cores: 1, MemoryMiB: 512, Bridges: []string{"sbv1", "sbv0"}, MACs: []string{"", "02:00:00:00:00:0A"}}); err != nil {
				t.Fatal(err)
			}
			if cfg := f.vms[100]; cfg["net0"] != "virtio,bridge=sbv1,firewall=0" || cfg["net1"] != "virtio=02:00:00:00:00:0A,bridge=sbv0,firewall=0" {
				t.Errorf("NICs %v %v, want net1 with the MAC", cfg["net0"], cfg["net1"])
			}
			f.ipam = append(f.ipam, map[string]any{"vnet": "sbv0", "zone": "sbz", "subnet": "10.9.0.0/24", "ip": "10.9.0.10", "mac": "02:00:00:00:00:0A", "vmid": 100})
			if err := c.ReleaseIP(ctx, "sbz", "sbv0", netip.MustParseAddr("10.9.0.10"), "02:00:00:00:00:0A"); err != nil {
				t.Fatal(err)
			}
			if err := c.ReleaseIP(ctx, "sbz", "sbv0", netip.MustParseAddr("10.9.0.10"), "02:00:00:00:00:0A"); !errors.Is(err, sandbox.ErrNotFound) {
				t.Fatalf("released twice: %v, want ErrNotFound", err)
			}
			got, err := c.IPAMAddresses(ctx, []string{"sbv0"})
			if want := []sandbox.IPAMAddress{{VNet: "sbv0", IP: ip, MAC: "02:00:00:00:00:0a"}}; err != nil || !slices.Equal(got, want) {
				t.Fatalf("addresses %+v %v, want %+v", got, err, want)
			}
			f.mu.Lock()
			defer f.mu.Unlock()
			if !slices.Contains(f.calls, "POST /cluster/sdn/vnets/{vnet}/ips") {
				t.Errorf("calls %v", f.calls)
			}
		}},
		{"nic_controller e1000 and agent false: every NIC e1000, the agent off", func(t *testing.T, f *fakeServer, c *Client) {
			sdn(t, f, c)
			if err := c.CloneVM(ctx, sandbox.CloneSpec{Template: 9000, NewID: 100, Name: "pvei-x-vm0"}); err != nil {
				t.Fatal(err)
			}
			if err := c.ConfigureVM(ctx, 100, sandbox.VMConfig{Cores: 1, MemoryMiB: 512, Bridges: []string{"sbv1", "sbv0"}, MACs: []string{"", "02:00:00:00:00:0A"},
				NICModel: "e1000", NoAgent: true}); err != nil {
				t.Fatal(err)
			}
			f.mu.Lock()
			defer f.mu.Unlock()
			if cfg := f.vms[100]; cfg["net0"] != "e1000,bridge=sbv1,firewall=0" || cfg["net1"] != "e1000=02:00:00:00:00:0A,bridge=sbv0,firewall=0" || cfg["agent"] != "0" {
				t.Errorf("net0 %v net1 %v agent %v, want e1000 NICs and the agent off", cfg["net0"], cfg["net1"], cfg["agent"])
			}
		}},
		{"no bridges (a VM of no_network): every NIC of the template deleted, none written", func(t *testing.T, f *fakeServer, c *Client) {
			if err := c.CloneVM(ctx, sandbox.CloneSpec{Template: 9000, NewID: 100, Name: "pvei-x-vm0"}); err != nil {
				t.Fatal(err)
			}
			if err := c.ConfigureVM(ctx, 100, sandbox.VMConfig{Cores: 1, MemoryMiB: 512}); err != nil {
				t.Fatal(err)
			}
			f.mu.Lock()
			defer f.mu.Unlock()
			for k, v := range f.vms[100] {
				if reNet.MatchString(k) {
					t.Errorf("%s %v left: want no NIC", k, v)
				}
			}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			f, c := newFakeServer(t)
			tc.run(t, f, c)
		})
	}
}
