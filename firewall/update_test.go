package firewall

import (
	"context"
	"net"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
)

// guardDiffer names the sets of the guard whose members differ from a
// full rendering of its state.
func guardDiffer(t *testing.T, g *Guard) []string {
	t.Helper()
	g.mu.Lock()
	defer g.mu.Unlock()
	d, err := g.patchedDifferLocked()
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// TestUpdatePathMatchesRendering drives every per-change path (a new
// bridge and its port, a port moved off, released, renamed and back onto
// a zone bridge, a bridge gone, zones added and removed, the port map changed, the
// lockdown and fail-closed flipped) and checks after each that the
// kernel holds the desired table (Verify), that the patched sets equal a
// full rendering, that the classification kept from events equals a
// fresh listing, and that no rule was rewritten.
func TestUpdatePathMatchesRendering(t *testing.T) {
	n := basicNode(t)
	cfg := testConfig(t)
	g := startGuard(t, n, cfg)
	runGuard(t, g)
	ctx := context.Background()
	handles := ruleHandles(t, n)
	check := func(what string, cond func() bool) {
		t.Helper()
		eventually(t, what, func() bool { return cond() && g.Verify(ctx) == nil && len(guardDiffer(t, g)) == 0 })
		if d := guardDiffer(t, g); len(d) != 0 {
			t.Fatalf("%s: sets differ from a full rendering: %v", what, d)
		}
		eventually(t, what+": the event-kept classification equals a listing", func() bool {
			listed, err := Classify(ctx, cfg, WithNetNS(n.Handle()))
			return err == nil && listed.Equal(g.Classification())
		})
	}
	hasSet := func(set, want string) func() bool {
		return func() bool { return strings.Contains(setElements(t, n, set), want) }
	}
	hasBridge := func(want string) func() bool {
		return func() bool {
			out, _ := n.nft(t, "list", "set", "bridge", TableName, SetGuestPorts)
			return strings.Contains(out, want)
		}
	}
	lacks := func(f func() bool) func() bool { return func() bool { return !f() } }

	n.Bridge(t, "vnetA2", "10.10.3.1/24")
	check("new bridge vnetA2 in zone1 and with itself", hasSet(SetZonePeers, `"vnetA2" . "vnetA2"`))
	if !strings.Contains(setElements(t, n, SetZonePeers), `"vnetA" . "vnetA2"`) {
		t.Error("zone pair vnetA . vnetA2 missing")
	}
	br, err := n.Netlink().LinkByName("vnetA2")
	if err != nil {
		t.Fatal(err)
	}
	veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "tap101i0", MasterIndex: br.Attrs().Index}, PeerName: "tp101"}
	if err := n.Netlink().LinkAdd(veth); err != nil {
		t.Fatal(err)
	}
	check("guest port of a zone bridge guarded", hasBridge(`"tap101i0"`))
	spare := n.Bridge(t, "spare0", "")
	tap, err := n.Netlink().LinkByName("tap101i0")
	if err != nil {
		t.Fatal(err)
	}
	if err := n.Netlink().LinkSetMaster(tap, spare); err != nil {
		t.Fatal(err)
	}
	check("port moved off the zone bridge", lacks(hasBridge(`"tap101i0"`)))
	other := func() bool {
		out, _ := n.nft(t, "list", "set", "bridge", TableName, SetOtherPorts)
		return strings.Contains(out, `"tap101i0"`)
	}
	check("port on a bridge of no zone is an other port", other)
	if err := n.Netlink().LinkSetNoMaster(tap); err != nil {
		t.Fatal(err)
	}
	check("port released from every bridge", lacks(hasBridge(`"tap101i0"`)))
	if err := n.Netlink().LinkSetMaster(tap, br); err != nil {
		t.Fatal(err)
	}
	check("port moved back", hasBridge(`"tap101i0"`))
	check("port on a zone bridge is no other port", lacks(other))
	if err := n.Netlink().LinkSetName(tap, "tap101i1"); err != nil {
		t.Fatal(err)
	}
	check("port renamed", hasBridge(`"tap101i1"`))
	if err := n.Netlink().LinkSetName(tap, "tap101i0"); err != nil {
		t.Fatal(err)
	}
	check("port renamed back", hasBridge(`"tap101i0"`))

	if err := g.SetZones(ctx, map[string][]string{"z2": {"vnetB", "spare0"}}); err != nil {
		t.Fatal(err)
	}
	check("zone added", hasSet(SetZonePeers, `"vnetB" . "spare0"`))
	if err := n.Netlink().LinkSetMaster(tap, spare); err != nil {
		t.Fatal(err)
	}
	check("port moved to a bridge of another zone", hasBridge(`"tap101i0"`))
	if err := g.SetZones(ctx, nil); err != nil {
		t.Fatal(err)
	}
	check("zone removed: its port is no guest port of a zone", lacks(hasBridge(`"tap101i0"`)))
	if strings.Contains(setElements(t, n, SetZonePeers), `"vnetB" . "spare0"`) {
		t.Error("pair of a removed zone still present")
	}
	if !strings.Contains(setElements(t, n, SetZonePeers), `"spare0" . "spare0"`) {
		t.Error("the self pair of an existing interface went with its zone")
	}

	mac := net.HardwareAddr{0x02, 0, 0, 0, 0x01, 0x01}
	ports := []Port{{Name: "tap101i0", MAC: mac, IPv4: []netip.Addr{netip.MustParseAddr("10.10.3.100")}}}
	if err := g.SetPorts(ctx, ports); err != nil {
		t.Fatal(err)
	}
	check("port mapped", func() bool { return true })
	ports[0].IPv4 = []netip.Addr{netip.MustParseAddr("10.10.3.101"), netip.MustParseAddr("10.10.3.99")}
	if err := g.SetPorts(ctx, ports); err != nil {
		t.Fatal(err)
	}
	check("port's addresses changed", func() bool { return true })
	if err := g.SetPorts(ctx, nil); err != nil {
		t.Fatal(err)
	}
	check("port unmapped", func() bool { return len(g.Ports()) == 0 })

	for _, on := range []bool{true, false} {
		if err := g.SetLockdown(ctx, on); err != nil {
			t.Fatal(err)
		}
		check("lockdown flipped", func() bool { return strings.Contains(setElements(t, n, SetLockdown), `"eth0"`) == on })
		if err := g.SetFailClosed(ctx, on); err != nil {
			t.Fatal(err)
		}
		check("fail-closed flipped", func() bool { return (setElements(t, n, SetFailClosed) != "") == on })
	}

	if err := n.Netlink().LinkDel(spare); err != nil {
		t.Fatal(err)
	}
	check("bridge of no zone gone", lacks(hasSet(SetZonePeers, `"spare0" . "spare0"`)))
	if err := n.Netlink().LinkDel(br); err != nil {
		t.Fatal(err)
	}
	check("zone bridge gone", func() bool { return !slices.Contains(g.Classification().Interfaces, "vnetA2") })
	for _, want := range []string{`"vnetA" . "vnetA2"`, `"vnetA2" . "vnetA2"`} {
		if !strings.Contains(setElements(t, n, SetZonePeers), want) {
			t.Errorf("the configured zone's pair %s went with the bridge", want)
		}
	}
	if got := ruleHandles(t, n); !slices.Equal(got, handles) {
		t.Errorf("the update path rewrote rules")
	}
}

// TestReconcileRepairsTheUpdatePath: a member the update path got wrong
// (in the kernel and in the desired table alike, so Verify cannot see
// it) is found by the periodic comparison with a full rendering and
// taken out.
func TestReconcileRepairsTheUpdatePath(t *testing.T) {
	n := basicNode(t)
	g := startGuard(t, n, testConfig(t))
	ctx := context.Background()
	g.mu.Lock()
	cs := &changes{}
	cs.of(false, SetZonePeers).add = []member{pairMember("vnetA", "vnetB")}
	_, err := g.commitLocked(cs)
	g.mu.Unlock()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(setElements(t, n, SetZonePeers), `"vnetA" . "vnetB"`) {
		t.Fatal("the wrong pair did not reach the kernel")
	}
	if err := g.Verify(ctx); err != nil {
		t.Fatalf("verify sees the wrong pair as desired, want nil: %v", err)
	}
	if d := guardDiffer(t, g); !slices.Contains(d, "table inet pve-inspect set zone_peers") {
		t.Fatalf("differing sets %v, want zone_peers", d)
	}
	if err := g.reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(setElements(t, n, SetZonePeers), `"vnetA" . "vnetB"`) {
		t.Error("reconcile left the wrong pair in the kernel")
	}
	if d := guardDiffer(t, g); len(d) != 0 {
		t.Errorf("after reconcile, sets differ: %v", d)
	}
	if err := g.Verify(ctx); err != nil {
		t.Error(err)
	}
}
