package containment

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netns"

	"github.com/pve-inspect/pve-inspect/containment/l2observe"
	"github.com/pve-inspect/pve-inspect/containment/probe"
	"github.com/pve-inspect/pve-inspect/containment/probebuild"
	"github.com/pve-inspect/pve-inspect/firewall"
	"github.com/pve-inspect/pve-inspect/firewall/portmap"
	"github.com/pve-inspect/pve-inspect/internal/testkit"
	"github.com/pve-inspect/pve-inspect/qga"
	"github.com/pve-inspect/pve-inspect/testvm"
)

// bedSpec aims a guest of zone A at everything the bed offers.
func bedSpec(vnetA testvm.VNet, otherGuest, otherGateway netip.Addr) Spec {
	gw6 := testvm.ULAPrefix(vnetA).Addr().As16()
	gw6[15] = 1
	return Spec{
		Gateway:      vnetA.Gateway,
		Subnet:       vnetA.Subnet,
		Gateway6:     netip.AddrFrom16(gw6),
		HostAddrs:    []netip.Addr{netip.MustParseAddr(testvm.NodeMgmtAddr), netip.MustParseAddr(testvm.NodeMgmtAddr6), otherGateway},
		ControlPorts: append(DefaultControlPorts(), Port{8443, "sandbox API"}, Port{9464, "metrics"}),
		Metadata: []netip.Addr{netip.MustParseAddr(testvm.MetadataAddr), netip.MustParseAddr(testvm.AlibabaMDAddr),
			netip.MustParseAddr(testvm.AzureWireAddr), netip.MustParseAddr(testvm.MetadataAddr6)},
		MetadataDNS:  []netip.Addr{netip.MustParseAddr(testvm.AWSDNSAddr)},
		OtherZone:    []netip.AddrPort{netip.AddrPortFrom(otherGuest, 22)}, // nothing listens: refused = reachable
		LAN:          []netip.AddrPort{netip.MustParseAddrPort(testvm.LANAddr + ":80")},
		Public:       []netip.Addr{netip.MustParseAddr(testvm.InternetAddr)},
		Public6:      []netip.Addr{netip.MustParseAddr(testvm.InternetAddr6)},
		ExternalName: testvm.InternetName,
		LocalName:    testvm.LocalName("zonea"),
		Timeout:      2 * time.Second,
	}
}

// freshName is a name under the bed's wildcard internet domain that no
// resolver cache holds yet, so a recursion check cannot be answered from
// a cache filled by an earlier run.
func freshName(t *testing.T) string {
	var b [4]byte
	if _, err := rand.Read(b[:]); err != nil {
		t.Fatal(err)
	}
	return "x" + hex.EncodeToString(b[:]) + "." + testvm.InternetName
}

// TestBedPolicies brings the bed up with two zones, guest A and its
// sibling C in zone A and guest B in zone B, and runs the containment
// check from guest A through the probe, uploaded and run over the real
// guest agent, with the node watching zone A's bridge for the layer-2
// rows, three times on the same bed:
//
//   - no guard, OpenPolicy: everything the guard will block is reachable
//     and every control holds (the bed can see a leak; the forged frames
//     reach sibling C's port and the node);
//   - the real host guard (package firewall) in the node, GuardPolicy;
//   - the guard with the lockdown switched on, LockdownPolicy.
func TestBedPolicies(t *testing.T) {
	testkit.RequireRoot(t, "ip", "nft")
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	b, err := testvm.Up(ctx, testvm.Options{ExtraNodePorts: []int{8443, 9464}})
	if err != nil {
		t.Fatalf("bed up: %v", err)
	}
	t.Cleanup(func() {
		if err := b.Close(); err != nil {
			t.Errorf("bed close: %v", err)
		}
	})
	vnetA := testvm.VNet{Name: "vneta", Subnet: netip.MustParsePrefix("10.10.1.0/24"), Gateway: netip.MustParseAddr("10.10.1.1"),
		DHCP: []testvm.DHCPRange{{Start: netip.MustParseAddr("10.10.1.100"), End: netip.MustParseAddr("10.10.1.200")}}, SNAT: true}
	vnetB := testvm.VNet{Name: "vnetb", Subnet: netip.MustParsePrefix("10.10.2.0/24"), Gateway: netip.MustParseAddr("10.10.2.1"),
		DHCP: []testvm.DHCPRange{{Start: netip.MustParseAddr("10.10.2.100"), End: netip.MustParseAddr("10.10.2.200")}}, SNAT: true}
	for _, z := range []testvm.Zone{{ID: "zonea", VNets: []testvm.VNet{vnetA}}, {ID: "zoneb", VNets: []testvm.VNet{vnetB}}} {
		if err := b.AddZone(ctx, z); err != nil {
			t.Fatalf("add zone %s: %v", z.ID, err)
		}
	}
	ga, err := b.StartGuest(ctx, testvm.GuestSpec{VMID: 101, VNet: "vneta"})
	if err != nil {
		t.Fatalf("start guest A: %v", err)
	}
	gb, err := b.StartGuest(ctx, testvm.GuestSpec{VMID: 102, VNet: "vnetb"})
	if err != nil {
		t.Fatalf("start guest B: %v", err)
	}
	if _, err := b.StartGuest(ctx, testvm.GuestSpec{VMID: 103, VNet: "vneta"}); err != nil {
		t.Fatalf("start guest C: %v", err)
	}
	node, err := netns.GetFromName(b.NodeNS())
	if err != nil {
		t.Fatal(err)
	}
	defer node.Close()
	r := &Runner{ProbePath: probebuild.ForTest(t), GuestDir: "/tmp", // the guest's own /tmp
		Observer: l2observe.New(l2observe.WithNetNS(node))}
	agent := AgentGuest{Agent: qga.New(qga.Options{}).Agent(ga.Socket)}
	check := func(pol Policy) *Result {
		t.Helper()
		spec := bedSpec(vnetA, gb.IPv4(), vnetB.Gateway)
		spec.ExternalName = freshName(t)
		spec.Layer2 = &Layer2Spec{Bridge: vnetA.Name, GuestPorts: firewall.PortNames(101, 0), GuestAddr: ga.IPv4()}
		plan, err := NewPlan(spec, pol)
		if err != nil {
			t.Fatal(err)
		}
		res, err := r.Run(ctx, agent, plan)
		if err != nil {
			t.Fatalf("%s: containment run: %v", pol.Name, err)
		}
		var buf bytes.Buffer
		if err := res.WriteText(&buf); err != nil {
			t.Fatal(err)
		}
		t.Logf("\n%s", buf.String())
		if !res.Passed() {
			t.Errorf("policy %s: %d rows not passed", pol.Name, len(res.Failed()))
		}
		return res
	}

	res := check(OpenPolicy())
	if lease := res.Rows[0]; !strings.Contains(lease.Detail, ga.IPv4().String()) {
		t.Errorf("lease row %q does not name guest A's DHCP address %s", lease.Detail, ga.IPv4())
	}
	layer2 := 0
	for _, row := range res.Rows {
		if row.Group == GroupOtherZone && row.Outcome != probe.OutcomeRefused {
			t.Errorf("other zone: outcome %s (%s), want refused (no listener on guest B)", row.Outcome, row.Detail)
		}
		// without the guard every forged frame reaches the sibling and the node
		if row.Group == GroupLayer2 {
			layer2++
			if row.Observed != Reachable || !strings.Contains(row.Detail, "tap103i0") || !strings.Contains(row.Detail, vnetA.Name) {
				t.Errorf("no guard: %s: %s (%s), want seen on the sibling's port tap103i0 and on %s", row.Name, row.Observed, row.Detail, vnetA.Name)
			}
		}
	}
	if layer2 != 3 {
		t.Errorf("%d layer-2 rows, want 3", layer2)
	}
	cfg := firewall.Config{DnsmasqUser: "dnsmasq", ProcRoot: t.TempDir(), StateDir: t.TempDir(),
		Zones: map[string][]string{"zonea": {vnetA.Name}, "zoneb": {vnetB.Name}}}
	g, err := firewall.New(cfg, firewall.WithNetNS(node))
	if err != nil {
		t.Fatal(err)
	}
	defer g.Close()
	// the layer-2 guard's port map, from the bed's VM configs and leases
	if _, err := (&portmap.Mapper{Paths: portmap.Paths{Root: b.NodeRoot()}, Guard: g}).Once(ctx); err != nil {
		t.Fatal(err)
	}
	if err := g.Start(ctx); err != nil {
		t.Fatalf("guard start: %v", err)
	}
	res = check(GuardPolicy())
	for _, row := range res.Rows {
		if row.Group == GroupLayer2 && (row.Observed != Blocked || !strings.Contains(row.Detail, "tap103i0")) {
			t.Errorf("guard: %s: %s (%s), want blocked with the sibling's port tap103i0 watched", row.Name, row.Observed, row.Detail)
		}
	}

	if err := g.SetLockdown(ctx, true); err != nil {
		t.Fatalf("lockdown on: %v", err)
	}
	check(LockdownPolicy())

	// Every uploaded probe deleted itself.
	out, _, _, err := agent.Exec(ctx, []string{"/bin/sh", "-c", "ls -a /tmp"}, nil, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(out), "pve-inspect-probe") {
		t.Errorf("probe copies left in the guest's /tmp: %q", out)
	}
}
