package daemon

import (
	"net/netip"
	"os/exec"
	"runtime"
	"slices"
	"testing"

	"github.com/vishvananda/netns"

	"github.com/pve-inspect/pve-inspect/cmd/pve-inspectd/internal/config"
	"github.com/pve-inspect/pve-inspect/internal/testkit"
)

// TestNodeSpecFindsLANTargets: with no [check] lan configured, the plan
// still has LAN rows: the node's gateway, its uplink neighbour and one
// address per private block, never the sandboxes' own pool.
func TestNodeSpecFindsLANTargets(t *testing.T) {
	ns := testkit.NewNetNS(t, "pdn").Handle()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer orig.Close()
	if err := netns.Set(ns); err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := netns.Set(orig); err != nil {
			t.Fatalf("back to the original netns: %v", err)
		}
	}()
	for _, c := range [][]string{
		{"link", "add", "eth0", "type", "bridge"}, {"link", "set", "eth0", "up"},
		{"addr", "add", "192.168.50.2/24", "dev", "eth0"},
		{"route", "add", "default", "via", "192.168.50.1"},
		{"neigh", "add", "192.168.50.7", "lladdr", "02:00:00:00:00:07", "dev", "eth0", "nud", "permanent"},
	} {
		// a child starts in the namespace of the (locked) thread that forks it
		if out, err := exec.Command("ip", c...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v %s", c, err, out)
		}
	}
	cfg := config.Default()
	cfg.Check.ExternalName, cfg.Check.LocalName, cfg.Check.Public = "x.example.test", "local", []string{"203.0.113.10"}
	cfg.API.AutoCIDRPool = "10.0.0.0/16"
	cfg.Check.Budget = 200
	spec, err := nodeSpec(cfg, netns.None())
	if err != nil {
		t.Fatal(err)
	}
	if spec.Budget != 200 {
		t.Errorf("row budget %d, want [check] budget 200", spec.Budget)
	}
	for _, want := range []string{"192.168.50.1:22", "192.168.50.7:80", "172.16.0.1:22", "100.64.0.1:80", "192.168.1.1:22"} {
		if !slices.Contains(spec.LAN, netip.MustParseAddrPort(want)) {
			t.Errorf("LAN rows lack %s: %v", want, spec.LAN)
		}
	}
	if slices.Contains(spec.LAN, netip.MustParseAddrPort("10.0.0.1:22")) {
		t.Errorf("a target inside the sandboxes' auto pool: %v", spec.LAN)
	}
}
