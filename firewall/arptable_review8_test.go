package firewall

import (
	"context"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/pve-inspect/pve-inspect/internal/testkit"
)

// TestManagementLinkNamedLikeGuestPortKeepsARP (review 8): the arp table
// drops ARP on every device named tap*, veth* or fwpr*, whatever it is.
// The rest of the guard keys on guest names only for bridge ports
// (cls.Enslaved) and treats the link of the default route as management
// whatever its name. A node whose management (or trusted) link is named
// like a guest port, not enslaved (an OpenVPN/tinc "tap0", a routed
// "veth-…" host end, a nested or lab node's uplink), then gets no ARP
// reply from its gateway: the node goes offline once its entry expires.
// The control case (same node, uplink named "up0") passes.
func TestManagementLinkNamedLikeGuestPortKeepsARP(t *testing.T) {
	for _, name := range []string{"up0", "veth-up", "tap0"} {
		t.Run(name, func(t *testing.T) {
			n := newTestNS(t)
			gw := testkit.NewNetNS(t, "pgr")
			veth := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name},
				PeerName: "eth0", PeerNamespace: netlink.NsFd(int(gw.Handle()))}
			if err := n.Netlink().LinkAdd(veth); err != nil {
				t.Fatal(err)
			}
			n.IP(t, "addr", "add", "192.0.2.2/24", "dev", name)
			n.IP(t, "link", "set", name, "up")
			gw.IP(t, "addr", "add", "192.0.2.1/24", "dev", "eth0")
			gw.IP(t, "link", "set", "eth0", "up")
			n.IP(t, "route", "add", "default", "via", "192.0.2.1", "dev", name)
			n.Bridge(t, "stor0", "10.99.0.2/24")
			n.Bridge(t, "vnetA", "10.10.1.1/24")
			ln := gw.Listen(t, "tcp", "192.0.2.1:4433")
			go func() {
				for {
					c, err := ln.Accept()
					if err != nil {
						return
					}
					_ = c.Close()
				}
			}()
			startGuard(t, n, testConfig(t))
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			defer cancel()
			c, err := n.DialContext(ctx, "tcp", "192.0.2.1:4433")
			if err != nil {
				out, _ := n.nft(t, "list", "table", "arp", TableName)
				t.Fatalf("the node cannot reach its gateway through management link %s: %v\n%s", name, err, out)
			}
			_ = c.Close()
		})
	}
}

// TestStatusSeesARPTable (review 8): `pve-inspectd status` and doctor's
// guard check (firewall.Inspect: inet and bridge only) report "no
// difference" with table arp pve-inspect gone. Here the daemon stopped
// (tables orphaned, in force) and the orphaned arp table was deleted.
func TestStatusSeesARPTable(t *testing.T) {
	n := basicNode(t)
	cfg := testConfig(t)
	g := startGuard(t, n, cfg)
	if err := g.Close(); err != nil {
		t.Fatal(err)
	}
	if out, err := n.nft(t, "delete", "table", "arp", TableName); err != nil {
		t.Fatalf("delete the orphan: %v %s", err, out)
	}
	st, err := Inspect(context.Background(), cfg, WithNetNS(n.Handle()))
	if err != nil {
		t.Fatal(err)
	}
	var ds []string
	for _, d := range append(st.Drifts, st.Bridge.Drifts...) {
		if d.Kind != DriftTableOwner { // orphaned inet and bridge tables
			ds = append(ds, d.String())
		}
	}
	if len(ds) == 0 {
		t.Errorf("table arp %s absent, Inspect reports no difference but orphaned tables", TableName)
	}
}
