package sandboxapi_test

import (
	"net/http"
	"testing"

	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
	"github.com/pve-inspect/pve-inspect/sandboxapi/client"
)

// TestCapacity: GET /v1/capacity says the guard's room, and what it says
// fits is what the guard admits: as many sandboxes of a shape as Fits
// says are created, the next one is refused.
func TestCapacity(t *testing.T) {
	caps := sandbox.Caps{NodeSandboxes: 3, NodeVMs: 5, NodeVCPUs: 8, NodeMemoryMiB: 8192, SandboxVMs: 3, SandboxVCPUs: 6}
	e := newEnv(t, func(o *options) { o.Caps = caps })
	ctx := e.ctx()
	got, err := e.c.Capacity(ctx)
	if err != nil {
		t.Fatal(err)
	}
	want := apitype.Capacity{Node: "node1", Limits: apitype.CapacityUse{Sandboxes: 3, VMs: 5, VCPUs: 8, MemoryMiB: 8192},
		Free: apitype.CapacityUse{Sandboxes: 3, VMs: 5, VCPUs: 8, MemoryMiB: 8192}, Sandbox: apitype.SandboxCaps{VMs: 3, VCPUs: 6}, FreeSandboxes: 3}
	if got != want {
		t.Errorf("empty node: %+v, want %+v", got, want)
	}
	vm := apitype.VMRequest{Template: "debian", Cores: 2, MemoryMiB: 2048}
	e.create(apitype.CreateRequest{VMs: []apitype.VMRequest{vm, vm}})
	got, err = e.c.Capacity(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if u, f := got.Used, got.Free; u != (apitype.CapacityUse{Sandboxes: 1, VMs: 2, VCPUs: 4, MemoryMiB: 4096}) ||
		f != (apitype.CapacityUse{Sandboxes: 2, VMs: 3, VCPUs: 4, MemoryMiB: 4096}) || got.FreeSandboxes != 2 {
		t.Errorf("after one sandbox of two VMs: %+v", got)
	}
	shape := apitype.CapacityUse{VMs: 2, VCPUs: 4, MemoryMiB: 4096}
	n := got.Fits(shape)
	if n != 1 {
		t.Fatalf("Fits(%+v) = %d, want 1 (the free cores and VMs)", shape, n)
	}
	for range n {
		e.create(apitype.CreateRequest{VMs: []apitype.VMRequest{vm, vm}})
	}
	if _, err := e.c.Create(ctx, apitype.CreateRequest{VMs: []apitype.VMRequest{vm, vm}}); !client.IsProblem(err, apitype.ProblemGuardRefused) {
		t.Errorf("a sandbox past what capacity said fits: %v, want guard-refused", err)
	}
	got, err = e.c.Capacity(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got.Fits(shape) != 0 || got.Free.VCPUs != 0 || got.Free.Sandboxes != 1 || got.FreeSandboxes != 0 {
		t.Errorf("full for the shape: %+v", got)
	}
	// over a per-sandbox cap: fits nowhere, however free the node
	if n := got.Fits(apitype.CapacityUse{VMs: 4, VCPUs: 4, MemoryMiB: 64}); n != 0 {
		t.Errorf("a shape over the sandbox VM cap fits %d", n)
	}

	// a read token may ask; no token may not
	for _, tc := range []struct {
		token  string
		status int
	}{{"r", 200}, {"", 401}} {
		req, _ := http.NewRequestWithContext(ctx, "GET", e.tcp.URL+"/v1/capacity", nil)
		if tc.token != "" {
			req.Header.Set("Authorization", "Bearer "+tc.token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.status {
			t.Errorf("token %q: status %d, want %d", tc.token, resp.StatusCode, tc.status)
		}
	}
}

// TestCapacityUnlimited: with no caps every free count is -1 (unlimited).
func TestCapacityUnlimited(t *testing.T) {
	e := newEnv(t, nil)
	e.create(apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian"}}})
	got, err := e.c.Capacity(e.ctx())
	if err != nil {
		t.Fatal(err)
	}
	if got.Free != (apitype.CapacityUse{Sandboxes: -1, VMs: -1, VCPUs: -1, MemoryMiB: -1}) || got.FreeSandboxes != -1 ||
		got.Used != (apitype.CapacityUse{Sandboxes: 1, VMs: 1, VCPUs: 1, MemoryMiB: 1024}) {
		t.Errorf("no caps: %+v", got)
	}
	if got.Fits(apitype.CapacityUse{VMs: 64, VCPUs: 1024, MemoryMiB: 1 << 20}) != -1 {
		t.Error("no caps: a large shape is bounded")
	}
}
