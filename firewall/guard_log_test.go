package firewall

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"

	"github.com/pve-inspect/pve-inspect/internal/testkit"
)

// TestClassificationLoggedOnChange: guest ports coming and going on a zone
// bridge change the classification (applied) but not what the log line
// reports, so "interface classification changed" is logged once, for the
// management change, not per port (issue 35: 237 identical lines).
func TestClassificationLoggedOnChange(t *testing.T) {
	n := basicNode(t)
	eth1 := n.Bridge(t, "eth1", "198.51.100.2/24")
	var logs testkit.LogBuffer
	g, err := New(testConfig(t), WithNetNS(n.Handle()), WithLogger(slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo}))))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = g.Close() })
	if err := g.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	sub, unsub := g.Subscribe()
	defer unsub()
	runGuard(t, g)
	bridge, err := n.Netlink().LinkByName("vnetA")
	if err != nil {
		t.Fatal(err)
	}
	const line = "interface classification changed"
	before := strings.Count(logs.String(), line)
	for i := range 3 {
		tap := &netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: "tap10" + string(rune('0'+i)) + "i0"}, PeerName: "guest" + string(rune('0'+i))}
		if err := n.Netlink().LinkAdd(tap); err != nil {
			t.Fatal(err)
		}
		if err := n.Netlink().LinkSetMaster(tap, bridge); err != nil {
			t.Fatal(err)
		}
		waitNotify(t, sub, "port added")
		if err := n.Netlink().LinkDel(tap); err != nil {
			t.Fatal(err)
		}
		waitNotify(t, sub, "port removed")
	}
	if got := strings.Count(logs.String(), line) - before; got != 0 {
		t.Fatalf("%d %q lines for guest ports:\n%s", got, line, logs.String())
	}
	n.DefaultVia(t, eth1, "198.51.100.1")
	eventually(t, "one line for the management change", func() bool { return strings.Count(logs.String(), line)-before == 1 })
	if err := g.Verify(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := strings.Count(logs.String(), line) - before; got != 1 {
		t.Fatalf("%d %q lines after the management change, want 1", got, line)
	}
}

func waitNotify(t *testing.T, sub <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-sub:
	case <-time.After(time.Minute):
		t.Fatalf("no classification notification: %s", what)
	}
}
