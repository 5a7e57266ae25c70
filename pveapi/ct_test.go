package pveapi

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/pve-inspect/pve-inspect/sandbox"
)

// handleCT is the fake server's containers: just enough of pve-container
// for the request shapes (ct_emu_test.go runs them against the emulator).
func (f *fakeServer) handleCT(op string, vmid int, p map[string]any) (any, int, string) {
	missing := fmt.Sprintf("Configuration file 'nodes/pve1/lxc/%d.conf' does not exist", vmid)
	c, ok := f.cts[vmid]
	switch op {
	case "GET /nodes/{node}/lxc":
		var out []map[string]any
		for id, c := range f.cts {
			out = append(out, map[string]any{"vmid": id, "name": c["hostname"], "status": c["status"], "tags": c["tags"], "template": c["template"]})
		}
		return out, 0, ""
	case "POST /nodes/{node}/lxc/{vmid}/clone":
		nid := atoi(p["newid"])
		if f.cts[nid] != nil || f.vms[nid] != nil {
			return nil, 500, fmt.Sprintf("CT %d already exists on node 'pve1'", nid)
		}
		if !ok {
			return nil, 500, missing
		}
		if fmt.Sprint(p["full"]) != "0" {
			f.t.Errorf("CT clone not linked: full=%v", p["full"])
		}
		n := map[string]any{}
		for k, v := range c {
			n[k] = v
		}
		n["hostname"], n["template"], n["status"], n["pool"] = p["hostname"], 0, "stopped", p["pool"]
		f.cts[nid] = n
		return f.task("vzclone", strconv.Itoa(vmid)), 0, ""
	}
	if !ok {
		return nil, 500, missing
	}
	switch op {
	case "GET /nodes/{node}/lxc/{vmid}/status/current":
		return map[string]any{"vmid": vmid, "name": c["hostname"], "status": c["status"], "tags": c["tags"], "template": c["template"]}, 0, ""
	case "GET /nodes/{node}/lxc/{vmid}/config":
		return c, 0, ""
	case "PUT /nodes/{node}/lxc/{vmid}/config": // synchronous: no task
		updateConfig(c, p)
		return nil, 0, ""
	case "POST /nodes/{node}/lxc/{vmid}/status/start":
		c["status"] = "running"
		return f.task("vzstart", strconv.Itoa(vmid)), 0, ""
	case "POST /nodes/{node}/lxc/{vmid}/status/stop":
		if c["status"] != "running" {
			return nil, 500, fmt.Sprintf("CT %d not running", vmid)
		}
		c["status"] = "stopped"
		return f.task("vzstop", strconv.Itoa(vmid)), 0, ""
	case "DELETE /nodes/{node}/lxc/{vmid}":
		if p["purge"] != "1" || p["force"] != "1" {
			f.t.Errorf("CT delete without purge and force: %v", p)
		}
		delete(f.cts, vmid)
		return f.task("vzdestroy", strconv.Itoa(vmid)), 0, ""
	case "POST /nodes/{node}/lxc/{vmid}/snapshot":
		return f.task("vzsnapshot", strconv.Itoa(vmid)), 0, ""
	case "POST /nodes/{node}/lxc/{vmid}/snapshot/{snapname}/rollback":
		c["status"] = "stopped"
		return f.task("vzrollback", strconv.Itoa(vmid)), 0, ""
	}
	f.t.Errorf("fake server: unhandled %s", op)
	return nil, 501, "not implemented"
}

// TestCTClientAgainstSchema: every container call is a request the
// official schema takes (the fake server refuses an unknown or missing
// parameter and a value outside an enum), with the body pve-container
// needs: a linked clone with the hostname, one synchronous config update
// (NICs, swap 0, the template's other NICs deleted), a stop of a stopped
// CT that is no error, a rollback followed by a start, a delete with
// purge and force.
func TestCTClientAgainstSchema(t *testing.T) {
	f, c := newFakeServer(t)
	ctx := context.Background()
	f.cts[9100] = map[string]any{"hostname": "ct-debian", "template": 1, "status": "stopped", "tags": "x",
		"net0": "name=eth0,bridge=vmbr0,hwaddr=BC:24:11:00:00:01,ip=dhcp,type=veth", "net1": "name=eth1,bridge=vmbr1,ip=dhcp,type=veth"}
	calls := func(from int) []string {
		f.mu.Lock()
		defer f.mu.Unlock()
		return slices.Clone(f.calls[from:])
	}
	if id, err := c.CTTemplateID(ctx, "ct-debian"); err != nil || id != 9100 {
		t.Fatalf("CT template: %d %v", id, err)
	}
	if _, err := c.CTTemplateID(ctx, "nope"); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("no such CT template: %v", err)
	}
	if err := c.CloneCT(ctx, sandbox.CloneSpec{Template: 9100, NewID: 101, Name: "box", Pool: "pve-inspect"}); err != nil {
		t.Fatal(err)
	}
	if ct := f.cts[101]; ct["hostname"] != "box" || ct["pool"] != "pve-inspect" {
		t.Errorf("clone: %v", ct)
	}
	if err := c.CloneCT(ctx, sandbox.CloneSpec{Template: 9100, NewID: 101}); !errors.Is(err, sandbox.ErrExists) {
		t.Errorf("clone to a taken id: %v", err)
	}
	n := len(calls(0))
	err := c.ConfigureCT(ctx, 101, sandbox.CTConfig{Tags: []string{"a", "b"}, Hostname: "web", Cores: 2, MemoryMiB: 1024,
		Bridges: []string{"vsb0"}, MACs: []string{"BC:24:11:AA:BB:CC"}})
	if err != nil {
		t.Fatal(err)
	}
	if got := calls(n); !slices.Equal(got, []string{"GET /nodes/{node}/lxc/{vmid}/config", "PUT /nodes/{node}/lxc/{vmid}/config"}) {
		t.Errorf("configure made %v, want a read and one PUT", got)
	}
	want := map[string]any{"tags": "a;b", "hostname": "web", "cores": float64(2), "memory": float64(1024), "swap": float64(0),
		"net0": "name=eth0,bridge=vsb0,hwaddr=BC:24:11:AA:BB:CC,ip=dhcp,firewall=0"}
	for k, v := range want {
		if f.cts[101][k] != v {
			t.Errorf("after configure %s = %v, want %v", k, f.cts[101][k], v)
		}
	}
	if _, ok := f.cts[101]["net1"]; ok {
		t.Errorf("the template's net1 stayed: %v", f.cts[101])
	}
	vals, err := c.CTConfigValues(ctx, 101)
	if err != nil || vals["memory"] != "1024" || vals["swap"] != "0" {
		t.Errorf("config values %v %v", vals, err)
	}
	for _, step := range []struct {
		name string
		do   func() error
		ops  []string
	}{
		{"start", func() error { return c.StartCT(ctx, 101) }, []string{"POST /nodes/{node}/lxc/{vmid}/status/start"}},
		{"stop", func() error { return c.StopCT(ctx, 101) }, []string{"POST /nodes/{node}/lxc/{vmid}/status/stop"}},
		{"stop of a stopped CT", func() error { return c.StopCT(ctx, 101) }, []string{"POST /nodes/{node}/lxc/{vmid}/status/stop"}},
		{"snapshot", func() error { return c.SnapshotCT(ctx, 101, "s1") }, []string{"POST /nodes/{node}/lxc/{vmid}/snapshot"}},
		{"rollback", func() error { return c.RollbackCT(ctx, 101, "s1") },
			[]string{"POST /nodes/{node}/lxc/{vmid}/snapshot/{snapname}/rollback", "POST /nodes/{node}/lxc/{vmid}/status/start"}},
		{"list", func() error { _, err := c.ListCTs(ctx); return err }, []string{"GET /nodes/{node}/lxc", "GET /cluster/resources"}},
		{"status", func() error { _, err := c.CT(ctx, 101); return err }, []string{"GET /cluster/resources", "GET /nodes/{node}/lxc/{vmid}/status/current"}},
		{"delete", func() error { return c.DeleteCT(ctx, 101) }, []string{"DELETE /nodes/{node}/lxc/{vmid}"}},
	} {
		t.Run(step.name, func(t *testing.T) {
			n := len(calls(0))
			if err := step.do(); err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, op := range calls(n) {
				if !strings.Contains(op, "/tasks/") {
					got = append(got, op)
				}
			}
			if !slices.Equal(got, step.ops) {
				t.Errorf("%s made %v, want %v", step.name, got, step.ops)
			}
		})
	}
	if _, err := c.CT(ctx, 101); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("a deleted CT: %v", err)
	}
	if err := c.DeleteCT(ctx, 101); !errors.Is(err, sandbox.ErrNotFound) {
		t.Errorf("delete of a deleted CT: %v", err)
	}
}
