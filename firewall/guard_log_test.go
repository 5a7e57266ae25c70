package firewall

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
)

// lockedBuffer is a log sink the guard's goroutines may write to while
// the test reads it.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) count(s string) int {
	b.mu.Lock()
	defer b.mu.Unlock()
	return strings.Count(b.buf.String(), s)
}

// TestClassificationLoggedOnChange: guest ports coming and going on a zone
// bridge change the classification (applied) but not what the log line
// reports, so "interface classification changed" is logged once, for the
// management change, not per port (issue 35: 237 identical lines).
func TestClassificationLoggedOnChange(t *testing.T) {
	n := basicNode(t)
	eth1 := n.Bridge(t, "eth1", "198.51.100.2/24")
	var logs lockedBuffer
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
	before := logs.count(line)
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
	if got := logs.count(line) - before; got != 0 {
		t.Fatalf("%d %q lines for guest ports:\n%s", got, line, logs.buf.String())
	}
	n.DefaultVia(t, eth1, "198.51.100.1")
	eventually(t, "one line for the management change", func() bool { return logs.count(line)-before == 1 })
	if err := g.Verify(context.Background()); err != nil {
		t.Fatal(err)
	}
	if got := logs.count(line) - before; got != 1 {
		t.Fatalf("%d %q lines after the management change, want 1", got, line)
	}
}

func waitNotify(t *testing.T, sub <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-sub:
	case <-time.After(10 * time.Second):
		t.Fatalf("no classification notification: %s", what)
	}
}
