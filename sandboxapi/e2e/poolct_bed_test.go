package e2e_test

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netns"

	"github.com/pve-inspect/pve-inspect/firewall"
	"github.com/pve-inspect/pve-inspect/firewall/egress"
	"github.com/pve-inspect/pve-inspect/qga"
	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
	"github.com/pve-inspect/pve-inspect/testvm"
)

// claimingEgress is registryEgress with the daemon's claim: a claimed
// member's policy as a new instance of its zone (Registry.Begin, as the
// daemon's Egress.Claim), nothing of the member's kept.
type claimingEgress struct{ *registryEgress }

func (c claimingEgress) Claim(ctx context.Context, sb, zone string, bridges []string, p apitype.EgressPolicy) error {
	rules, err := egress.Compile(egress.Policy{Mode: p.Mode, Allow: p.Allow, Deny: p.Deny})
	if err != nil {
		return err
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.reg.Begin(ctx, zone, sb, bridges, rules)
}

var _ sandbox.EgressClaimer = claimingEgress{}

// TestBedPoolContainers: a warm pool of unprivileged containers through
// the API on the bed, with the guard (its port map the daemon's, reading
// the containers' configs) and egress policies, and the tenant rule
// across a container id that comes back:
//
//   - the pool fills with real containers of the container template,
//     waiting with egress none, none of them a sandbox;
//   - a matching create claims one (no clone: the member's container is
//     the sandbox's), exec works at once, the claimer's name, secrets
//     file and allow-list are in force (the allowed host answers; another
//     claimer's allow-list of another range does not reach it);
//   - the pool refills;
//   - a delete leaves nothing: no container, lxc directory, cgroup, veth,
//     Proxmox CT, egress policy or engine record;
//   - the next member gets the deleted container's id, and its claimer
//     finds nothing of the first tenant: not its files, its
//     /etc/environment line, its secrets or its processes; an exec's
//     environment is the documented base only.
func TestBedPoolContainers(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 12*time.Minute)
	defer cancel()
	eg := &registryEgress{}
	hook := &guardHook{}
	e := newContainerBed(t, ctx, func(o *options) {
		o.Egress = claimingEgress{eg}
		o.ZonesChanged = hook.zonesChanged
		o.WarmPool = []sandbox.PoolShape{{Name: "ct", Kind: apitype.KindLXC, Template: ctTemplate, MemoryMiB: 512, Egress: "allowlist", Target: 1}}
	})
	node, err := netns.GetFromName(e.bed.NodeNS())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { node.Close() })
	g := runBedGuard(t, ctx, e, node)
	hook.mu.Lock()
	hook.g = g
	hook.mu.Unlock()
	eg.mu.Lock()
	eg.reg = egress.NewRegistry(g, egress.Rules{Mode: firewall.EgressOpen}, nil)
	eg.mu.Unlock()
	eng := e.srv.Engine()

	sh := func(sb apitype.Sandbox, cmd string) (int, string) {
		t.Helper()
		res, err := e.c.Exec(ctx, sb.ID, sb.VMs[0].Name, apitype.ExecRequest{Argv: []string{"sh", "-c", cmd}, TimeoutSeconds: 30})
		if err != nil {
			t.Fatalf("%s: %q: %v", sb.ID, cmd, err)
		}
		return res.ExitCode, strings.TrimSpace(string(res.Stdout))
	}
	must := func(sb apitype.Sandbox, cmd string) string {
		t.Helper()
		code, out := sh(sb, cmd)
		if code != 0 {
			t.Fatalf("%s: %q: exit %d (%s)", sb.ID, cmd, code, out)
		}
		return out
	}
	member := func() apitype.PoolMember {
		t.Helper()
		eng.MaintainPool(ctx)
		st, err := e.c.Pool(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(st.Shapes) != 1 || st.Shapes[0].Kind != apitype.KindLXC || st.Shapes[0].Ready != 1 || st.Shapes[0].Error != "" || len(st.Members) != 1 {
			t.Fatalf("GET /v1/pool after a refill: %+v", st)
		}
		m := st.Members[0]
		if ct, ok := e.bed.Container(m.VMIDs[0]); !ok || !ct.Alive() {
			t.Fatalf("member %s: the bed runs no container %d", m.ID, m.VMIDs[0])
		}
		if got := eg.Status(m.ID, m.ID).Policy.Mode; got != "none" {
			t.Errorf("member %s waits with egress %q, want none", m.ID, got)
		}
		if _, err := e.c.Get(ctx, m.ID); err == nil {
			t.Errorf("member %s is visible as a sandbox", m.ID)
		}
		return m
	}
	claim := func(m apitype.PoolMember, name string, env map[string]string, allow string) apitype.Sandbox {
		t.Helper()
		start := time.Now()
		sb, err := e.c.Create(ctx, apitype.CreateRequest{VMs: []apitype.VMRequest{{Name: name, Kind: apitype.KindLXC, Template: ctTemplate, MemoryMiB: 512}},
			Env: env, TTLSeconds: 600, Egress: &apitype.EgressPolicy{Mode: "allowlist", Allow: []string{allow}}})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("claim of %s (container %d) answered in %s", sb.ID, sb.VMs[0].VMID, time.Since(start))
		if !sb.FromPool || sb.ID != m.ID || sb.VMs[0].VMID != m.VMIDs[0] || sb.VMs[0].Kind != apitype.KindLXC || sb.State != apitype.StateReady {
			t.Fatalf("create: %+v, want member %+v claimed", sb, m)
		}
		if got := must(sb, "hostname"); got != name {
			t.Errorf("claimed container's hostname %q, want %q", got, name)
		}
		st, err := e.c.Egress(ctx, sb.ID)
		if err != nil || st.Policy.Mode != "allowlist" || !slices.Equal(st.Policy.Allow, []string{allow}) || len(st.Denials) != 0 {
			t.Errorf("claimed sandbox's egress %+v, %v: want the claimer's allow-list and no denial", st, err)
		}
		// the daemon's port map maps the container's veth from its config
		// (etc/pve/lxc/<vmid>.conf) and its zone's dnsmasq files, as a
		// VM's tap: unmapped, it would get DHCP only
		waitGuardedPort(t, g, ctPort(sb.VMs[0].VMID))
		return sb
	}
	internet := func(sb apitype.Sandbox) int { // 0: connected; 124: timed out (dropped)
		code, _ := sh(sb, "timeout 3 bash -c 'exec 3<>/dev/tcp/"+testvm.InternetAddr+"/80'")
		return code
	}
	baseEnv := slices.Sorted(slices.Values(qga.BaseEnv()))
	cleanEnv := func(sb apitype.Sandbox) {
		t.Helper()
		res, err := e.c.Exec(ctx, sb.ID, sb.VMs[0].Name, apitype.ExecRequest{Argv: []string{"env"}, TimeoutSeconds: 30})
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("env: %+v, %v", res, err)
		}
		got := slices.Sorted(slices.Values(strings.Split(strings.TrimSpace(string(res.Stdout)), "\n")))
		if !slices.Equal(got, baseEnv) {
			t.Errorf("%s: an exec's environment %q, want the base %q only", sb.ID, got, baseEnv)
		}
	}

	// Alice claims the first member and leaves traces.
	m1 := member()
	alice := claim(m1, "alice", map[string]string{"ALICE_TOKEN": "a-secret"}, testvm.InternetAddr+"/32")
	aliceID := alice.VMs[0].VMID
	if code := internet(alice); code != 0 {
		t.Errorf("alice's allow-list of the internet host: exit %d, want 0", code)
	}
	if got := must(alice, ". /etc/pve-inspect/env && echo $ALICE_TOKEN"); got != "a-secret" {
		t.Errorf("alice's secrets file: %q", got)
	}
	cleanEnv(alice)
	must(alice, "echo alice-was-here > /root/alice.txt && echo ALICE_ENV=1 >> /etc/environment && echo alice > /tmp/alice")
	// a process that outlives its exec, started through the container's
	// init (an exec's own processes end with it)
	must(alice, "systemd-run --unit=alice-sleeper --quiet bash -c 'exec -a alice-sleeper sleep 100000'")
	if got := must(alice, "cat /root/alice.txt; grep -c ALICE_ENV /etc/environment; for i in 1 2 3 4 5 6 7 8 9 10; do grep -l -s 'alice-sleep[e]r' /proc/[0-9]*/cmdline >/dev/null && break; sleep 0.5; done; grep -l -s 'alice-sleep[e]r' /proc/[0-9]*/cmdline | wc -l"); got != "alice-was-here\n1\n1" {
		t.Errorf("alice's traces in her own container: %q, want her file, her environment line and her process", got)
	}

	// The pool refills while alice's sandbox runs; bob claims it with an
	// allow-list that does not hold the internet host.
	m2 := member()
	if m2.VMIDs[0] == aliceID {
		t.Fatalf("member %+v has alice's running container's id", m2)
	}
	bob := claim(m2, "bob", nil, "198.51.100.0/24")
	if code := internet(bob); code != 124 {
		t.Errorf("bob's allow-list of another range: exit %d, want 124 (dropped)", code)
	}

	// Alice's delete leaves nothing.
	if err := e.c.Delete(ctx, alice.ID); err != nil {
		t.Fatal(err)
	}
	if _, ok := e.bed.Container(aliceID); ok {
		t.Errorf("container %d still runs after the delete", aliceID)
	}
	for _, p := range []string{filepath.Join(e.bed.LXCPath(), strconv.Itoa(aliceID)), e.bed.ContainerCgroupV2(aliceID)} {
		if _, err := os.Stat(p); !os.IsNotExist(err) {
			t.Errorf("%s after the delete: %v", p, err)
		}
	}
	if out, err := exec.Command("ip", "-n", e.bed.NodeNS(), "link", "show", ctPort(aliceID)).CombinedOutput(); err == nil {
		t.Errorf("veth %s after the delete: %s", ctPort(aliceID), out)
	}
	if _, err := e.px.CT(ctx, aliceID); err == nil {
		t.Errorf("container %d still in Proxmox", aliceID)
	}
	eg.mu.Lock()
	_, kept := eg.reg.Get(alice.Zone)
	eg.mu.Unlock()
	if kept {
		t.Errorf("alice's zone %s still has an egress policy", alice.Zone)
	}
	if _, err := e.c.Get(ctx, alice.ID); err == nil {
		t.Error("alice's sandbox is still known")
	}
	if _, ok := eng.Health(alice.ID); ok {
		t.Error("alice's health outlived her sandbox")
	}

	// The next member takes alice's freed id; carol, who claims it, finds
	// nothing of alice's.
	m3 := member()
	if m3.VMIDs[0] != aliceID {
		t.Fatalf("member %+v, want it on alice's freed id %d (Proxmox's lowest free id)", m3, aliceID)
	}
	carol := claim(m3, "carol", map[string]string{"CAROL_KEY": "c"}, testvm.InternetAddr+"/32")
	if code := internet(carol); code != 0 {
		t.Errorf("carol's allow-list of the internet host: exit %d, want 0", code)
	}
	for _, p := range []string{"/root/alice.txt", "/tmp/alice"} {
		if code, out := sh(carol, "cat "+p); code == 0 {
			t.Errorf("carol reads alice's %s: %q", p, out)
		}
	}
	if got := must(carol, "cat /etc/environment /etc/pve-inspect/env 2>/dev/null | grep -c ALICE || true"); got != "0" {
		t.Errorf("alice's environment or secrets in carol's container: %s lines", got)
	}
	if got := must(carol, ". /etc/pve-inspect/env && echo ${CAROL_KEY}${ALICE_TOKEN}"); got != "c" {
		t.Errorf("carol's secrets file gives %q, want hers only", got)
	}
	// (the pattern does not match its own grep's command line)
	if code, out := sh(carol, "grep -l -s 'alice-sleep[e]r' /proc/[0-9]*/cmdline"); code == 0 {
		t.Errorf("alice's process in carol's container: %q", out)
	}
	cleanEnv(carol)
	if got := must(carol, "cat /etc/hostname"); got != "carol" {
		t.Errorf("carol's /etc/hostname %q", got)
	}
}

// ctPort is the host end of container vmid's first NIC.
func ctPort(vmid int) string { return firewall.ContainerPortNames(vmid, 0)[0] }
