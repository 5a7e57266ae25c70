package sandboxapi_test

import (
	"bytes"
	"errors"
	"strings"
	"testing"

	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// TestAgentlessVMThroughAPI: a VM created with "agent": false is reported
// with it, and every call through the agent is refused with a 409
// (conflict) naming it before anything is tried: exec (collected and
// streamed), file reads and writes, the containment check from it. The
// check of a sandbox whose first VM has no agent, asked of no VM, runs
// from the first VM that has one. Snapshots and rollbacks work.
func TestAgentlessVMThroughAPI(t *testing.T) {
	e := newEnv(t, nil)
	ctx := e.ctx()
	sb := e.create(apitype.CreateRequest{VMs: []apitype.VMRequest{
		{Name: "target", Template: "debian", Agent: new(bool)},
		{Name: "attacker", Template: "debian"},
	}})
	got, err := e.c.Get(ctx, sb.ID)
	if err != nil {
		t.Fatal(err)
	}
	if got.VMs[0].Agent == nil || *got.VMs[0].Agent || got.VMs[1].Agent != nil {
		t.Errorf("agents as the API reports them: %v %v", got.VMs[0].Agent, got.VMs[1].Agent)
	}
	for _, tc := range []struct {
		name string
		call func() error
	}{
		{"exec", func() error {
			_, err := e.c.Exec(ctx, sb.ID, "target", apitype.ExecRequest{Argv: []string{"echo", "x"}})
			return err
		}},
		{"streamed exec", func() error {
			_, err := e.c.ExecStream(ctx, sb.ID, "target", apitype.ExecRequest{Argv: []string{"echo", "x"}}, &bytes.Buffer{}, nil)
			return err
		}},
		{"read", func() error { _, err := e.c.ReadFile(ctx, sb.ID, "target", "/etc/hosts", &bytes.Buffer{}); return err }},
		{"write", func() error {
			return e.c.WriteFile(ctx, sb.ID, "target", "/tmp/x", strings.NewReader("x"), 1, 0o644)
		}},
		{"check", func() error { _, err := e.c.Check(ctx, sb.ID, "target"); return err }},
	} {
		var p *apitype.Problem
		if err := tc.call(); !errors.As(err, &p) || p.Status != 409 || p.Type != apitype.ProblemConflict || !strings.Contains(p.Detail, "vm target has no guest agent") {
			t.Errorf("%s: %v, want a 409 conflict naming the VM", tc.name, err)
		}
	}
	rep, err := e.c.Check(ctx, sb.ID, "")
	if err != nil || rep.VM != "attacker" || !rep.Pass {
		t.Errorf("check of no VM: %+v, %v; want it run from the attacker", rep, err)
	}
	if err := e.c.Snapshot(ctx, sb.ID, "target", "s1"); err != nil {
		t.Fatal(err)
	}
	if err := e.c.Rollback(ctx, sb.ID, "target", "s1"); err != nil {
		t.Errorf("rollback of the target: %v", err)
	}

	// a sandbox of agentless VMs only: ready, and its check has no VM to
	// run from
	only := e.create(apitype.CreateRequest{VMs: []apitype.VMRequest{{Name: "appliance", Template: "debian", Agent: new(bool)}}})
	var p *apitype.Problem
	if _, err := e.c.Check(ctx, only.ID, ""); !errors.As(err, &p) || p.Status != 409 || !strings.Contains(p.Detail, "vm appliance has no guest agent") {
		t.Errorf("check of a sandbox without agents: %v", err)
	}
}
