package e2e_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netns"

	"github.com/pve-inspect/pve-inspect/firewall"
	"github.com/pve-inspect/pve-inspect/firewall/egress"
	"github.com/pve-inspect/pve-inspect/internal/testkit"
	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
	"github.com/pve-inspect/pve-inspect/testvm"
)

// registryEgress is sandbox.Egress over an egress.Registry (what the
// daemon wires, without its resolver and proxy: the rows here are CIDRs).
type registryEgress struct {
	mu  sync.Mutex
	reg *egress.Registry // nil until the guard is up
}

func (r *registryEgress) Validate(p apitype.EgressPolicy) error {
	_, err := egress.Compile(egress.Policy{Mode: p.Mode, Allow: p.Allow, Deny: p.Deny})
	return err
}

func (r *registryEgress) Set(ctx context.Context, sandbox, zone string, bridges []string, p apitype.EgressPolicy) error {
	rules, err := egress.Compile(egress.Policy{Mode: p.Mode, Allow: p.Allow, Deny: p.Deny})
	if err != nil {
		return err
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.reg.Set(ctx, zone, sandbox, bridges, rules)
}

func (r *registryEgress) Remove(ctx context.Context, _, zone string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.reg.Remove(ctx, zone)
}

// SetNames hands the VM names to the registry, whose resolver (start)
// answers them, as the daemon's Egress does.
func (r *registryEgress) SetNames(_ context.Context, sb, zone string, names map[string][]sandbox.NameAddr) error {
	out := map[string][]egress.NameAddr{}
	for n, as := range names {
		out[n] = []egress.NameAddr{}
		for _, a := range as {
			out[n] = append(out[n], egress.NameAddr{Bridge: a.Bridge, Addr: a.Addr})
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.reg.SetNames(zone, sb, out)
}

var _ sandbox.EgressNamer = (*registryEgress)(nil)

func (r *registryEgress) Status(sandbox, zone string) apitype.EgressStatus {
	r.mu.Lock()
	defer r.mu.Unlock()
	rules, _ := r.reg.Get(zone)
	p := rules.Policy()
	return apitype.EgressStatus{Sandbox: sandbox, Policy: apitype.EgressPolicy{Mode: p.Mode, Allow: p.Allow, Deny: p.Deny}}
}

// TestBedEgressThroughAPI: a sandbox created with egress none has no
// internet from its first instant; PUT /v1/sandboxes/{id}/egress on the
// running sandbox is in force when the call returns (probed from inside
// the guest with its own TCP stack, no sleep), both ways; an open
// sandbox next to it keeps the internet.
func TestBedEgressThroughAPI(t *testing.T) {
	testkit.RequireRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	eg := &registryEgress{}
	var gmu sync.Mutex
	var guard *firewall.Guard
	e := newBedEnv(t, ctx, func(o *options) {
		o.Egress = eg
		o.ZonesChanged = func(ctx context.Context, z map[string][]string) error {
			gmu.Lock()
			defer gmu.Unlock()
			if guard == nil { // the start's reconcile, before the guard is up
				return nil
			}
			return guard.SetZones(ctx, z)
		}
	})
	node, err := netns.GetFromName(e.bed.NodeNS())
	if err != nil {
		t.Fatal(err)
	}
	defer node.Close()
	g, err := firewall.New(firewall.Config{DnsmasqUser: "dnsmasq", ProcRoot: t.TempDir(), StateDir: t.TempDir()}, firewall.WithNetNS(node))
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	if err := g.Start(ctx); err != nil {
		t.Fatal(err)
	}
	runPortMap(t, ctx, e.bed.NodeRoot(), g)
	gmu.Lock()
	guard = g
	gmu.Unlock()
	eg.start(t, ctx, e, g)

	locked, err := e.c.Create(ctx, apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian"}},
		Egress: &apitype.EgressPolicy{Mode: "none"}})
	if err != nil {
		t.Fatal(err)
	}
	open, err := e.c.Create(ctx, apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian"}}})
	if err != nil {
		t.Fatal(err)
	}
	// exit 0: connected; 124: timed out (dropped)
	internet := func(sb string) int {
		t.Helper()
		res, err := e.c.Exec(ctx, sb, "vm0", apitype.ExecRequest{Argv: []string{"timeout", "3", "bash", "-c",
			"exec 3<>/dev/tcp/" + testvm.InternetAddr + "/80"}, TimeoutSeconds: 10})
		if err != nil {
			t.Fatal(err)
		}
		return res.ExitCode
	}
	if code := internet(open.ID); code != 0 {
		t.Fatalf("open sandbox: internet exit %d, want 0 (the positive control)", code)
	}
	if code := internet(locked.ID); code != 124 {
		t.Errorf("sandbox created with egress none: internet exit %d, want 124", code)
	}
	st, err := e.c.SetEgress(ctx, locked.ID, apitype.EgressPolicy{Mode: "allowlist", Allow: []string{testvm.InternetAddr + "/32"}})
	if err != nil || st.Policy.Mode != "allowlist" {
		t.Fatalf("PUT egress: %+v %v", st, err)
	}
	if code := internet(locked.ID); code != 0 {
		t.Errorf("right after PUT allowlist with the host's CIDR: exit %d, want 0", code)
	}
	if _, err := e.c.SetEgress(ctx, locked.ID, apitype.EgressPolicy{Mode: "none"}); err != nil {
		t.Fatal(err)
	}
	if code := internet(locked.ID); code != 124 {
		t.Errorf("right after PUT none: exit %d, want 124", code)
	}
	if code := internet(open.ID); code != 0 {
		t.Errorf("the open sandbox lost the internet: exit %d", code)
	}
	if got, err := e.c.Egress(ctx, locked.ID); err != nil || got.Policy.Mode != "none" {
		t.Errorf("GET egress: %+v %v", got, err)
	}
	for _, id := range []string{locked.ID, open.ID} {
		if err := e.c.Delete(ctx, id); err != nil {
			t.Error(err)
		}
	}
}
