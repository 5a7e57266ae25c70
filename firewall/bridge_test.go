package firewall

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"strings"
	"testing"

	"github.com/pve-inspect/pve-inspect/internal/testkit"
)

func mustMAC(t testing.TB, s string) net.HardwareAddr {
	t.Helper()
	m, err := net.ParseMAC(s)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// testPorts: guest 101 mapped with a lease, guest 102 mapped before its
// lease (MAC only).
func testPorts(t testing.TB) []Port {
	return []Port{
		{Name: "tap101i0", MAC: mustMAC(t, "bc:24:11:00:01:01"), IPv4: []netip.Addr{netip.MustParseAddr("10.10.1.101")}},
		{Name: "tap102i0", MAC: mustMAC(t, "bc:24:11:00:01:02")},
	}
}

// listBridgeTable is listTable for table bridge pve-inspect.
func listBridgeTable(t *testing.T, n *testNS, extra ...string) string {
	t.Helper()
	out, err := n.nft(t, append(extra, "list", "table", "bridge", TableName)...)
	if err != nil {
		t.Fatalf("nft list: %v\n%s", err, out)
	}
	out = prognameRE.ReplaceAllString(out, "")
	return tableFlagsRE.ReplaceAllString(out, "")
}

func TestRenderBridgeGolden(t *testing.T) {
	rs, err := RenderBridge([]string{"vnetA", "vnetA2", "vnetA"}, Classification{Enslaved: []Enslaved{
		{Port: "tap101i0", Bridge: "vnetA"}, {Port: "tap103i0", Bridge: "vnetA2"}, {Port: "ln_vnetA", Bridge: "vnetA"}, {Port: "tap104i0", Bridge: "vmbr0"}}}, testPorts(t), FloodConfig{})
	if err != nil {
		t.Fatal(err)
	}
	testkit.Golden(t, "bridge-render.txt", []byte(rs.String()))
}

func TestRenderBridgeRejects(t *testing.T) {
	mac := mustMAC(t, "bc:24:11:00:01:01")
	for _, tc := range []struct {
		name    string
		bridges []string
		ports   []Port
		want    string
	}{
		{"bad port name", nil, []Port{{Name: "tap 1", MAC: mac}}, "bad interface name"},
		{"long port name", nil, []Port{{Name: "tap1234567890123", MAC: mac}}, "bad interface name"},
		{"twice", nil, []Port{{Name: "tap1i0", MAC: mac}, {Name: "tap1i0", MAC: mac}}, "listed twice"},
		{"multicast mac", nil, []Port{{Name: "tap1i0", MAC: mustMAC(t, "01:00:5e:00:00:01")}}, "not a unicast"},
		{"zero mac", nil, []Port{{Name: "tap1i0", MAC: mustMAC(t, "00:00:00:00:00:00")}}, "not a unicast"},
		{"short mac", nil, []Port{{Name: "tap1i0", MAC: net.HardwareAddr{1, 2}}}, "not a unicast"},
		{"v6 address", nil, []Port{{Name: "tap1i0", MAC: mac, IPv4: []netip.Addr{netip.MustParseAddr("fd00::1")}}}, "not a unicast IPv4"},
		{"zero address", nil, []Port{{Name: "tap1i0", MAC: mac, IPv4: []netip.Addr{netip.IPv4Unspecified()}}}, "not a unicast IPv4"},
		{"broadcast", nil, []Port{{Name: "tap1i0", MAC: mac, IPv4: []netip.Addr{netip.MustParseAddr("255.255.255.255")}}}, "not a unicast IPv4"},
		{"bad bridge", []string{"vnet;A"}, nil, "zone bridge"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := RenderBridge(tc.bridges, Classification{}, tc.ports, FloodConfig{})
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want one containing %q", err, tc.want)
			}
		})
	}
}

func TestBridgeTableGoldenAndPorts(t *testing.T) {
	n := basicNode(t)
	cfg := testConfig(t)
	g := startGuard(t, n, cfg)
	ctx := context.Background()
	if err := g.SetPorts(ctx, testPorts(t)); err != nil {
		t.Fatal(err)
	}
	if err := g.Verify(ctx); err != nil {
		t.Fatalf("verify: %v", err)
	}
	testkit.Golden(t, "bridge-table.nft", []byte(listBridgeTable(t, n)))
	handles := handleRE.FindAllString(listBridgeTable(t, n, "-a"), -1)

	// bad input changes nothing
	bad := append(testPorts(t), Port{Name: "tap103i0", MAC: mustMAC(t, "ff:ff:ff:ff:ff:ff")})
	if err := g.SetPorts(ctx, bad); err == nil {
		t.Fatal("SetPorts accepted a broadcast MAC")
	}
	if got := len(g.Ports()); got != 2 {
		t.Fatalf("ports after a refused SetPorts: %d, want 2", got)
	}
	// a remap is set membership only: rules (handles) stay
	if err := g.SetPorts(ctx, testPorts(t)[:1]); err != nil {
		t.Fatal(err)
	}
	if err := g.Verify(ctx); err != nil {
		t.Fatalf("verify after remap: %v", err)
	}
	after := handleRE.FindAllString(listBridgeTable(t, n, "-a"), -1)
	if strings.Join(after, ",") != strings.Join(handles, ",") {
		t.Fatalf("rule handles changed on a port remap:\n%v\n%v", handles, after)
	}
}

func TestBridgeTableTamperRepaired(t *testing.T) {
	n := basicNode(t)
	cfg := testConfig(t)
	g := startGuard(t, n, cfg)
	ctx := context.Background()
	if err := g.SetPorts(ctx, testPorts(t)); err != nil {
		t.Fatal(err)
	}
	// the owned table refuses changes from others and survives a flush
	if out, err := n.nft(t, "delete", "table", "bridge", TableName); err == nil {
		t.Fatalf("nft delete of the owned bridge table succeeded: %s", out)
	}
	if out, err := n.nft(t, "flush", "ruleset"); err != nil {
		t.Fatalf("nft flush ruleset: %v %s", err, out)
	}
	if err := g.Verify(ctx); err != nil {
		t.Fatalf("after nft flush ruleset: %v", err)
	}
	// orphaned (daemon gone), then edited: the next guard repairs it
	if err := g.Close(); err != nil {
		t.Fatal(err)
	}
	if out, err := n.nft(t, "flush", "chain", "bridge", TableName, chainPortGuard); err != nil {
		t.Fatalf("edit orphan: %v %s", err, out)
	}
	g2, err := New(cfg, WithNetNS(n.Handle()))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g2.Close() })
	if err := g2.SetPorts(ctx, testPorts(t)); err != nil {
		t.Fatal(err)
	}
	if err := g2.Start(ctx); err != nil {
		t.Fatalf("restart: %v", err)
	}
	testkit.Golden(t, "bridge-table.nft", []byte(listBridgeTable(t, n)))
	var de *DriftError
	if err := g2.Verify(ctx); errors.As(err, &de) || err != nil {
		t.Fatalf("verify after repair: %v", err)
	}
}
