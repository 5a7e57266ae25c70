package e2e_test

import (
	"context"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

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

	// a service of the target, in its own network namespace (the test's
	// hand, not an agent's)
	var ln net.Listener
	if err := e.bed.Do(gt.NS, func() error {
		var err error
		ln, err = net.Listen("tcp4", ":8080")
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			_, _ = c.Write([]byte("victim\n"))
			_ = c.Close()
		}
	}()
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
