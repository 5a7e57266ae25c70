package e2e_test

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/firewall"
	"github.com/pve-inspect/pve-inspect/internal/testkit"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// tcpBannerPy connects to argv[1]:argv[2] and prints the first line the
// peer sends ("refused", "timeout" or the error otherwise).
const tcpBannerPy = `import socket, sys
try:
    s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3)
    print(s.recv(64).decode().strip())
except ConnectionRefusedError:
    print("refused")
except socket.timeout:
    print("timeout")
except OSError as e:
    print("error", e)
`

// TestBedAgentlessVM is the reference plugin's CTF on the bed, with the
// host guard and its layer-2 table in force: a target created with agent
// false (on the bed a guest without qemu-ga, as the emulator starts a VM
// whose agent is off) listed first, and an attacker with an agent. The
// sandbox is ready; the target has no agent socket, its DHCP address is
// the one the API reports, and the layer-2 guard pins its port as any
// guest's. The attacker reaches a service on the target by the target's
// name and address (a TCP banner served in the target's network
// namespace), while a guest of another sandbox cannot reach it (timeout:
// the guard's cross-zone wall; the same probe from the attacker answers,
// so it is not blind). Exec in the target is refused (409 naming it),
// and the containment check asked of no VM runs from the attacker and
// passes.
func TestBedAgentlessVM(t *testing.T) {
	testkit.RequireRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	e, g := newCheckedBedEnv(t, ctx)

	sb, err := e.c.Create(ctx, apitype.CreateRequest{VMs: []apitype.VMRequest{
		{Name: "target", Template: "debian", Agent: new(bool)},
		{Name: "attacker", Template: "debian"},
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.c.Delete(context.Background(), sb.ID) })
	if sb.State != apitype.StateReady || sb.VMs[0].HasAgent() {
		t.Fatalf("sandbox %+v, want ready with the target without agent", sb)
	}
	target := sb.VMs[0]
	if len(target.Addresses) != 1 {
		t.Fatalf("target's addresses %+v, want one", target.Addresses)
	}
	addr := target.Addresses[0].IPv4
	gt, ok := e.bed.Guest(target.VMID)
	if !ok {
		t.Fatal("the target is not running on the bed")
	}
	if gt.IPv4().String() != addr {
		t.Errorf("the target took %s by DHCP, the API says %s", gt.IPv4(), addr)
	}
	if _, err := os.Stat(filepath.Join(e.bed.QGADir(), strconv.Itoa(target.VMID)+".qga")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the target has an agent socket (%v)", err)
	}
	waitGuarded(t, g, target.VMID)
	waitGuarded(t, g, sb.VMs[1].VMID)
	// pinned from the node, not the guest: the MAC of its config and the
	// address the zone's DHCP gave it, the one the API reports
	port := firewall.PortNames(target.VMID, 0)[0]
	if i := slices.IndexFunc(g.Ports(), func(p firewall.Port) bool { return p.Name == port }); i < 0 {
		t.Errorf("no port map entry for %s", port)
	} else if p := g.Ports()[i]; p.MAC.String() != gt.MAC.String() || len(p.IPv4) != 1 || p.IPv4[0].String() != addr {
		t.Errorf("%s pinned to %s %v, want %s %s", port, p.MAC, p.IPv4, gt.MAC, addr)
	}

	// a service of the target, in its own network namespace (the test's
	// hand, not an agent's)
	serveBanner(t, e, gt.NS, 8080, "victim")
	banner := func(id, vm, host string) string {
		t.Helper()
		res, err := e.c.Exec(ctx, id, vm, apitype.ExecRequest{Argv: []string{"/usr/bin/python3", "-c", tcpBannerPy, host, "8080"}, TimeoutSeconds: 20})
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(res.Stdout)) + strings.TrimSpace(string(res.Stderr))
	}
	for _, host := range []string{addr, "target"} {
		if got := banner(sb.ID, "attacker", host); got != "victim" {
			t.Errorf("attacker to the target's service at %s: %q, want its banner", host, got)
		}
	}
	// the target as a hostile guest with no agent: from an address of its
	// subnet it was not given it reaches nothing (its port is pinned to
	// its own), while from its own it reaches its sibling's service
	attacker := sb.VMs[1]
	ga, ok := e.bed.Guest(attacker.VMID)
	if !ok || len(attacker.Addresses) != 1 {
		t.Fatalf("the attacker: on the bed %v, addresses %+v", ok, attacker.Addresses)
	}
	serveBanner(t, e, ga.NS, 8081, "attacker")
	spoof := netip.MustParsePrefix(sb.Networks[0].CIDR).Addr().As4()
	spoof[3] = 200
	if s := netip.AddrFrom4(spoof).String(); s == addr || s == attacker.Addresses[0].IPv4 {
		t.Fatalf("spoofed address %s is taken", s)
	}
	if out, err := exec.CommandContext(ctx, "ip", "-n", gt.NS, "addr", "add", netip.AddrFrom4(spoof).String()+"/32", "dev", "eth0").CombinedOutput(); err != nil {
		t.Fatalf("add a spoofed address in the target: %v: %s", err, out)
	}
	for _, tc := range []struct {
		from netip.Addr
		want string
	}{
		{netip.MustParseAddr(addr), "attacker"},
		{netip.AddrFrom4(spoof), "timeout"},
	} {
		if got := bannerFrom(t, e, gt.NS, tc.from, attacker.Addresses[0].IPv4); got != tc.want {
			t.Errorf("from the target's %s to the attacker's service: %q, want %q", tc.from, got, tc.want)
		}
	}

	other, err := e.c.Create(ctx, apitype.CreateRequest{VMs: []apitype.VMRequest{{Name: "other", Template: "debian"}}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = e.c.Delete(context.Background(), other.ID) })
	if got := banner(other.ID, "other", addr); got != "timeout" {
		t.Errorf("another sandbox's guest to the target's service: %q, want timeout (the cross-zone wall)", got)
	}

	var p *apitype.Problem
	_, err = e.c.Exec(ctx, sb.ID, "target", apitype.ExecRequest{Argv: []string{"true"}})
	if !errors.As(err, &p) || p.Status != 409 || !strings.Contains(p.Detail, "vm target has no guest agent") {
		t.Errorf("exec in the target: %v, want 409 naming it", err)
	}
	rep, err := e.c.Check(ctx, sb.ID, "")
	if err != nil {
		t.Fatal(err)
	}
	logCheck(t, rep)
	if rep.VM != "attacker" || !rep.Pass {
		t.Errorf("containment check of no VM: from %q, pass %v; want from the attacker, passing", rep.VM, rep.Pass)
	}
}

// serveBanner serves banner on tcp port in network namespace ns (the
// test's hand, not an agent's) until the test ends.
func serveBanner(t *testing.T, e *bedEnv, ns string, port int, banner string) {
	t.Helper()
	var ln net.Listener
	if err := e.bed.Do(ns, func() error {
		var err error
		ln, err = net.Listen("tcp4", ":"+strconv.Itoa(port))
		return err
	}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte(banner + "\n"))
			_ = c.Close()
		}
	}()
}

// bannerFrom connects from address from in network namespace ns to
// host:8081 and returns the first line it reads, or "timeout".
func bannerFrom(t *testing.T, e *bedEnv, ns string, from netip.Addr, host string) string {
	t.Helper()
	var got string
	if err := e.bed.Do(ns, func() error {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: from.AsSlice()}, Timeout: 3 * time.Second}
		c, err := d.Dial("tcp4", net.JoinHostPort(host, "8081"))
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				got = "timeout"
				return nil
			}
			got = err.Error()
			return nil
		}
		defer c.Close()
		_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
		b := make([]byte, 64)
		n, _ := c.Read(b)
		got = strings.TrimSpace(string(b[:n]))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return got
}
