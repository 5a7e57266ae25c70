package firewall

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"net"
	"os"
	"os/exec"
	"runtime"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

// requireRoot skips (or fails under CI) tests that need root.
func requireRoot(t testing.TB) {
	t.Helper()
	if os.Geteuid() != 0 {
		if os.Getenv("CI") != "" {
			t.Fatal("test needs root (CI is set, so this is a failure)")
		}
		t.Skip("SKIPPING: test needs root to create network namespaces and nftables tables")
	}
}

func randName(prefix string) string {
	b := make([]byte, 2)
	_, _ = rand.Read(b)
	return prefix + hex.EncodeToString(b)
}

// testNS is a named network namespace created for one test and removed by
// its cleanup.
type testNS struct {
	name string
	ns   netns.NsHandle
	h    *netlink.Handle
}

func newTestNS(t testing.TB) *testNS {
	t.Helper()
	requireRoot(t)
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer orig.Close()
	name := randName("pgd")
	ns, err := netns.NewNamed(name)
	if err2 := netns.Set(orig); err2 != nil {
		t.Fatalf("back to original netns: %v", err2)
	}
	if err != nil {
		t.Fatalf("create netns: %v", err)
	}
	t.Cleanup(func() {
		ns.Close()
		_ = netns.DeleteNamed(name)
	})
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	tn := &testNS{name: name, ns: ns, h: h}
	lo, err := h.LinkByName("lo")
	if err != nil {
		t.Fatal(err)
	}
	if err := h.LinkSetUp(lo); err != nil {
		t.Fatal(err)
	}
	return tn
}

// dummy adds an up link (a bridge: the kernel here has no dummy driver) with addr (CIDR, may be "").
func (n *testNS) dummy(t testing.TB, name, addr string) netlink.Link {
	t.Helper()
	l := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: name}}
	if err := n.h.LinkAdd(l); err != nil {
		t.Fatalf("add link %s: %v", name, err)
	}
	if err := n.h.LinkSetUp(l); err != nil {
		t.Fatal(err)
	}
	if addr != "" {
		a, err := netlink.ParseAddr(addr)
		if err != nil {
			t.Fatal(err)
		}
		if err := n.h.AddrAdd(l, a); err != nil {
			t.Fatalf("add addr %s: %v", addr, err)
		}
	}
	got, err := n.h.LinkByName(name)
	if err != nil {
		t.Fatal(err)
	}
	return got
}

// defaultVia sets the IPv4 default route through gw on link (replacing).
func (n *testNS) defaultVia(t testing.TB, l netlink.Link, gw string) {
	t.Helper()
	r := &netlink.Route{LinkIndex: l.Attrs().Index, Gw: net.ParseIP(gw),
		Dst: &net.IPNet{IP: net.IPv4zero, Mask: net.CIDRMask(0, 32)}}
	if err := n.h.RouteReplace(r); err != nil {
		t.Fatalf("default route via %s: %v", gw, err)
	}
}

// cmd runs argv inside the namespace.
func (n *testNS) cmd(ctx context.Context, argv ...string) *exec.Cmd {
	return exec.CommandContext(ctx, "ip", append([]string{"netns", "exec", n.name}, argv...)...)
}

// nft runs nft inside the namespace and returns its combined output.
func (n *testNS) nft(t testing.TB, args ...string) (string, error) {
	t.Helper()
	out, err := n.cmd(context.Background(), append([]string{"nft"}, args...)...).CombinedOutput()
	return string(out), err
}

// basicNode is the fixed interface set of the tests: uplink eth0 with the
// default route, a trusted storage NIC, two vnet bridges (dummies).
func basicNode(t testing.TB) *testNS {
	n := newTestNS(t)
	eth0 := n.dummy(t, "eth0", "192.0.2.2/24")
	n.dummy(t, "stor0", "10.99.0.2/24")
	n.dummy(t, "vnetA", "10.10.1.1/24")
	n.dummy(t, "vnetB", "10.10.2.1/24")
	n.defaultVia(t, eth0, "192.0.2.1")
	return n
}

func testConfig(t testing.TB) Config {
	return Config{
		Trusted:       []string{"stor0"},
		DnsmasqUser:   "65534",
		Zones:         map[string][]string{"zone1": {"vnetA", "vnetA2"}},
		Private4Allow: nil,
		ProcRoot:      t.TempDir(),
		StateDir:      t.TempDir(),
	}
}
