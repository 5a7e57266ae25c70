package e2e_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/internal/testkit"
	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
	"github.com/pve-inspect/pve-inspect/testvm"
)

// TestBedPool: the warm pool on the bed, with the host guard, egress
// policies and the containment check as the daemon runs them:
//
//   - members wait with egress none, in force in the kernel;
//   - a create of exactly a shape claims a member, another one runs cold;
//   - the claim's egress policy is in force when the call returns (probed
//     from inside the guest at once): open reaches the internet, an
//     allow-list reaches only what it allows;
//   - the containment check passes on a claimed sandbox as on a cold one;
//   - the pool refills to its target;
//   - a restart re-adopts the members and hands none out twice;
//   - with the node full of members, a cold create gets room by shrinking
//     the pool.
func TestBedPool(t *testing.T) {
	testkit.RequireRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	eg := &registryEgress{}
	hook := &guardHook{}
	chk := bedChecker(t)
	shapes := []sandbox.PoolShape{
		{Name: "open", Template: "debian", Target: 2},
		{Name: "allow", Template: "debian", Egress: "allowlist", Target: 2},
	}
	e := newBedEnv(t, ctx, func(o *options) {
		o.Checker = chk
		o.Egress = eg
		o.WarmPool = shapes
		o.Caps = sandbox.Caps{NodeVMs: 6}
		o.ZonesChanged = hook.zonesChanged
	})
	g := startCheckedGuard(t, ctx, e, chk, hook)
	eg.start(t, ctx, e, g)
	var created []string
	t.Cleanup(func() {
		for _, id := range created {
			_ = e.c.Delete(context.Background(), id)
		}
	})
	create := func(req apitype.CreateRequest) apitype.Sandbox {
		t.Helper()
		sb, err := e.c.Create(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		created = append(created, sb.ID)
		return sb
	}
	internet := func(sb string) int { // exit 0: connected; 124: timed out (dropped)
		t.Helper()
		res, err := e.c.Exec(ctx, sb, "vm0", apitype.ExecRequest{Argv: []string{"timeout", "3", "bash", "-c",
			"exec 3<>/dev/tcp/" + testvm.InternetAddr + "/80"}, TimeoutSeconds: 10})
		if err != nil {
			t.Fatal(err)
		}
		return res.ExitCode
	}
	ready := func() map[string]int {
		out := map[string]int{}
		for _, s := range e.srv.Engine().Pool().Shapes {
			out[s.Name] = s.Ready
		}
		return out
	}

	e.srv.Engine().MaintainPool(ctx)
	members := e.srv.Engine().Pool().Members
	if r := ready(); r["open"] != 2 || r["allow"] != 2 {
		t.Fatalf("pool after the first refill: %+v", e.srv.Engine().Pool())
	}
	for _, m := range members {
		if got := eg.Status(m.ID, m.ID).Policy.Mode; got != "none" {
			t.Errorf("member %s waits with egress %q, want none", m.ID, got)
		}
	}

	plain := apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian"}}}
	a := create(plain)
	if !a.FromPool {
		t.Fatalf("a plain create was not claimed: %+v", a)
	}
	if code := internet(a.ID); code != 0 {
		t.Errorf("claimed open sandbox right after the create: internet exit %d, want 0 (its member waited with none)", code)
	}
	allowed := create(apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian"}},
		Egress: &apitype.EgressPolicy{Mode: "allowlist", Allow: []string{testvm.InternetAddr + "/32"}}})
	other := create(apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian"}},
		Egress: &apitype.EgressPolicy{Mode: "allowlist", Allow: []string{"198.51.100.0/24"}}})
	if !allowed.FromPool || !other.FromPool {
		t.Fatalf("allow-list creates not claimed: %v %v", allowed.FromPool, other.FromPool)
	}
	if code := internet(allowed.ID); code != 0 {
		t.Errorf("claimed allow-list sandbox allowing the host: exit %d, want 0", code)
	}
	if code := internet(other.ID); code != 124 {
		t.Errorf("claimed allow-list sandbox allowing another range: exit %d, want 124", code)
	}
	cold := create(apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian", Cores: 2}}})
	if cold.FromPool {
		t.Error("a 2-core create was claimed from 1-core shapes")
	}

	for _, sb := range []apitype.Sandbox{a, cold} {
		waitGuarded(t, g, sb.VMs[0].VMID)
		rep, err := e.c.Check(ctx, sb.ID, "")
		if err != nil {
			t.Fatal(err)
		}
		if !rep.Pass || len(rep.Rows) < 10 {
			for _, r := range rep.Rows {
				if !r.Pass {
					t.Errorf("check of %s (from pool %v): %s: %s observed %s: %s", sb.ID, sb.FromPool, r.Target, r.Probe, r.Observed, r.Detail)
				}
			}
			t.Errorf("containment check of %s (from pool %v) did not pass (%d rows)", sb.ID, sb.FromPool, len(rep.Rows))
		}
	}

	// Refill to target (the node cap of 6 VMs leaves room for one member:
	// 4 sandboxes hold 4).
	e.srv.Engine().MaintainPool(ctx)
	if n := len(e.srv.Engine().Pool().Members); n != 2 {
		t.Errorf("%d members after a refill under a 6-VM cap with 4 sandboxes, want 2", n)
	}
	for _, id := range []string{other.ID, cold.ID} {
		if err := e.c.Delete(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	e.srv.Engine().MaintainPool(ctx)
	if r := ready(); r["open"] != 2 || r["allow"] != 2 {
		t.Errorf("pool after a refill with room: %+v, want the targets", e.srv.Engine().Pool().Shapes)
	}

	// A restart re-adopts every member; none is handed out twice.
	before := e.srv.Engine().Pool().Members
	e.start(t, ctx)
	after := e.srv.Engine().Pool().Members
	if len(after) != len(before) {
		t.Fatalf("members after a restart: %+v, want %+v", after, before)
	}
	for i := range after {
		if after[i].ID != before[i].ID || after[i].State != apitype.StateReady {
			t.Errorf("member after restart %+v, want %+v ready", after[i], before[i])
		}
	}
	if sb, err := e.c.Get(ctx, a.ID); err != nil || !sb.FromPool {
		t.Errorf("claimed sandbox after a restart: %+v %v", sb, err)
	}
	seen := []string{a.ID, allowed.ID, other.ID}
	b := create(plain)
	if !b.FromPool || slices.Contains(seen, b.ID) {
		t.Errorf("claim after the restart: %s from pool %v, already handed out: %v", b.ID, b.FromPool, slices.Contains(seen, b.ID))
	}

	// The node is full (a, allowed, b and 3 members = 6 VMs): a cold
	// create gets room from the pool.
	if n := len(e.srv.Engine().Pool().Members); n != 3 {
		t.Fatalf("%d members before the full-node create, want 3", n)
	}
	big := create(apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian", Cores: 2}}})
	if big.FromPool || big.State != apitype.StateReady {
		t.Errorf("cold create on a full node: %+v", big)
	}
	if n := len(e.srv.Engine().Pool().Members); n != 2 {
		t.Errorf("%d members after the cold create on a full node, want 2 (one gave way)", n)
	}
}
