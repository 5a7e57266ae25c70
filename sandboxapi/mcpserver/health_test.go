package mcpserver_test

import (
	"context"
	"testing"

	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitest"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
	"github.com/pve-inspect/pve-inspect/sandboxapi/mcpserver"
)

// TestToolsHealth: the get tool carries the sandbox's health, and the
// exec and read tools on a broken VM are tool errors of problem type
// sandbox-broken with the reason.
func TestToolsHealth(t *testing.T) {
	var px *apitest.Proxmox
	b := newBed(t, bedOpts{api: func(o *sandbox.Options) { px = o.Proxmox.(*apitest.Proxmox) }})
	sb := b.create()
	eng := b.srv.Engine()
	eng.CheckHealth(context.Background())
	if g := ok[apitype.Sandbox](t, "get", b.call(mcpserver.ToolGet, map[string]any{"id": sb.ID})); g.Health == nil || g.Health.State != apitype.HealthOK {
		t.Fatalf("get of a healthy sandbox: %+v", g.Health)
	}
	px.SetVMState(sb.VMs[0].VMID, "running", "guest-panicked")
	eng.CheckHealth(context.Background())
	g := ok[apitype.Sandbox](t, "get", b.call(mcpserver.ToolGet, map[string]any{"id": sb.ID}))
	if g.Health == nil || g.Health.State != apitype.HealthBroken || g.Health.Reason != apitype.ReasonGuestPanicked {
		t.Fatalf("get of a panicked sandbox: %+v", g.Health)
	}
	for _, tc := range []struct {
		tool string
		args map[string]any
	}{
		{mcpserver.ToolExec, map[string]any{"id": sb.ID, "argv": []string{"true"}}},
		{mcpserver.ToolReadFile, map[string]any{"id": sb.ID, "path": "/etc/hostname"}},
	} {
		if p := problem(t, tc.tool, b.call(tc.tool, tc.args)); p.Type != apitype.ProblemSandboxBroken || p.Reason != apitype.ReasonGuestPanicked {
			t.Errorf("%s on a broken VM: %+v", tc.tool, p)
		}
	}
}
