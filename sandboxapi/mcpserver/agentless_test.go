package mcpserver_test

import (
	"strings"
	"testing"

	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
	"github.com/pve-inspect/pve-inspect/sandboxapi/mcpserver"
)

// TestGuestToolsDefaultToAVMWithAgent: in a sandbox whose first VM has no
// guest agent (a CTF's target listed first, made through the API), the
// guest tools that name no VM (exec, read and write a file) run in the
// first VM that has one, as the containment check does; naming the
// target still answers the API's 409 naming it.
func TestGuestToolsDefaultToAVMWithAgent(t *testing.T) {
	b := newBed(t, bedOpts{})
	sb, err := b.api.Create(b.ctx(), apitype.CreateRequest{VMs: []apitype.VMRequest{
		{Name: "target", Template: "debian", Cores: 1, MemoryMiB: 512, Agent: new(bool)},
		{Name: "attacker", Template: "debian", Cores: 1, MemoryMiB: 512},
	}})
	if err != nil {
		t.Fatal(err)
	}
	id := sb.ID
	if o := ok[mcpserver.ExecOutput](t, "exec", b.call(mcpserver.ToolExec, map[string]any{"id": id, "argv": []string{"echo", "hi"}})); o.ExitCode != 0 || o.Stdout != "hi\n" {
		t.Errorf("exec naming no VM: %+v", o)
	}
	ok[mcpserver.FileWritten](t, "write", b.call(mcpserver.ToolWriteFile, map[string]any{"id": id, "path": "/root/x", "content": "x"}))
	if got, _ := b.guests.File(sb.VMs[1].VMID, "/root/x"); string(got) != "x" {
		t.Errorf("write naming no VM: the attacker's /root/x is %q", got)
	}
	if r := ok[mcpserver.FileContent](t, "read", b.call(mcpserver.ToolReadFile, map[string]any{"id": id, "path": "/root/x"})); r.Content != "x" {
		t.Errorf("read naming no VM: %+v", r)
	}
	p := problem(t, "exec in the target", b.call(mcpserver.ToolExec, map[string]any{"id": id, "vm": "target", "argv": []string{"true"}}))
	if p.Status != 409 || !strings.Contains(p.Detail, "vm target has no guest agent") {
		t.Errorf("exec in the target: %+v", p)
	}
}
