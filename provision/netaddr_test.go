package provision

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net"
	"runtime"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/pve-inspect/pve-inspect/internal/testkit"
)

func TestNetlinkPrimaryAddr(t *testing.T) {
	testkit.RequireRoot(t)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	must(t, err)
	defer orig.Close()
	ns, err := netns.New() // switches this thread into it
	must(t, err)
	defer func() { must(t, netns.Set(orig)); ns.Close() }()

	// Nothing routed yet.
	if _, err := (NetlinkAddrs{}).PrimaryAddr(context.Background()); err != ErrNoDefaultRoute {
		t.Fatalf("empty namespace: %v", err)
	}
	b := make([]byte, 2)
	rand.Read(b)
	name := "pbt" + hex.EncodeToString(b)
	// A veth pair: dummy links are not built into every test kernel.
	must(t, netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: name}, PeerName: name + "p"}))
	link, err := netlink.LinkByName(name)
	must(t, err)
	must(t, netlink.LinkSetUp(link))
	peer, err := netlink.LinkByName(name + "p")
	must(t, err)
	must(t, netlink.LinkSetUp(peer))
	addr, _ := netlink.ParseAddr("192.0.2.10/24")
	must(t, netlink.AddrAdd(link, addr))
	must(t, netlink.RouteAdd(&netlink.Route{LinkIndex: link.Attrs().Index, Gw: net.ParseIP("192.0.2.1")}))
	pa, err := (NetlinkAddrs{}).PrimaryAddr(context.Background())
	must(t, err)
	if pa.Interface != name || pa.Prefix.String() != "192.0.2.10/24" {
		t.Errorf("primary = %+v", pa)
	}
}
