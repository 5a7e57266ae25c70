package testvm

import (
	"context"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/internal/testkit"
)

// TestGuestWithoutNIC: a guest of no vnet (a VM whose config has no netN)
// starts with the loopback only, with its agent (answering exec: its
// /sys/class/net lists lo) or without one (up at once); its VM config
// in the node root has no net0, the node no tap of it; a stop removes its
// namespace.
func TestGuestWithoutNIC(t *testing.T) {
	testkit.RequireRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	b, err := Up(ctx, Options{Logger: testkit.FailureLog(t)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = b.Close() })
	g, err := b.StartGuest(ctx, GuestSpec{VMID: 121})
	if err != nil {
		t.Fatal(err)
	}
	quiet, err := b.StartGuest(ctx, GuestSpec{VMID: 122, NoAgent: true})
	if err != nil {
		t.Fatal(err)
	}
	if out := rawExec(t, g.Socket, "/bin/ls", "/sys/class/net"); out != "lo\n" {
		t.Errorf("guest 121's /sys/class/net: %q, want lo only", out)
	}
	for _, gg := range []*Guest{g, quiet} {
		if gg.IPv4().IsValid() || gg.MAC != nil {
			t.Errorf("guest %d: address %v MAC %v, want none", gg.VMID, gg.IPv4(), gg.MAC)
		}
		out, err := exec.CommandContext(ctx, "ip", "-n", gg.NS, "-o", "link").Output()
		if err != nil || strings.TrimSpace(string(out)) == "" || strings.Count(string(out), "\n") != 1 || !strings.Contains(string(out), ": lo:") || !strings.Contains(string(out), "UP") {
			t.Errorf("guest %d's links (%v):\n%s\nwant lo only, up", gg.VMID, err, out)
		}
		conf, err := os.ReadFile(b.vmConfPath(gg.VMID))
		if err != nil || strings.Contains(string(conf), "net0") {
			t.Errorf("guest %d's VM config (%v):\n%s\nwant no net0", gg.VMID, err, conf)
		}
	}
	if out, _ := exec.CommandContext(ctx, "ip", "-n", b.NodeNS(), "-o", "link").Output(); strings.Contains(string(out), "tap121i") || strings.Contains(string(out), "tap122i") {
		t.Errorf("the node has a tap of a guest without NIC:\n%s", out)
	}
	for _, id := range []int{121, 122} {
		if err := b.StopGuest(ctx, id); err != nil {
			t.Errorf("stop %d: %v", id, err)
		}
	}
	if ns, _ := exec.CommandContext(ctx, "ip", "netns", "list").Output(); strings.Contains(string(ns), g.NS) || strings.Contains(string(ns), quiet.NS) {
		t.Errorf("namespaces left:\n%s", ns)
	}
}
