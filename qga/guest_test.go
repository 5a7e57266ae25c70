package qga

import (
	"context"
	"net/netip"
	"strconv"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/internal/testkit"
	"github.com/pve-inspect/pve-inspect/testvm"
)

// testGuest is a guest of the test bed: the real qemu-ga in its own net,
// PID and mount namespaces with an overlay root.
type testGuest struct {
	Socket string // the agent socket on the host side
	Dir    string // a scratch directory inside the guest (on its disk)
	Guest  *testvm.Guest
}

// startGuest brings up a bed with one guest.
func startGuest(t testing.TB) *testGuest { return startGuests(t, 1)[0] }

// startGuests brings up a bed with one zone and n guests on it; the bed is
// torn down when the test ends.
func startGuests(t testing.TB, n int) []*testGuest {
	t.Helper()
	testkit.RequireRoot(t)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	b, err := testvm.Up(ctx, testvm.Options{Logger: testkit.FailureLog(t)})
	if err != nil {
		t.Fatalf("test bed: %v", err)
	}
	t.Cleanup(func() {
		if err := b.Close(); err != nil {
			t.Errorf("close test bed: %v", err)
		}
	})
	err = b.AddZone(ctx, testvm.Zone{ID: "qgaz", VNets: []testvm.VNet{{
		Name: "qgav", Subnet: netip.MustParsePrefix("10.77.1.0/24"), Gateway: netip.MustParseAddr("10.77.1.1"),
		DHCP: []testvm.DHCPRange{{Start: netip.MustParseAddr("10.77.1.100"), End: netip.MustParseAddr("10.77.1.200")}},
	}}})
	if err != nil {
		t.Fatalf("test bed zone: %v", err)
	}
	gs := make([]*testGuest, n)
	for i := range gs {
		g, err := b.StartGuest(ctx, testvm.GuestSpec{VMID: 101 + i, VNet: "qgav"})
		if err != nil {
			t.Fatalf("test bed guest: %v", err)
		}
		gs[i] = &testGuest{Socket: g.Socket, Dir: "/var/tmp/qgatest" + strconv.Itoa(g.VMID), Guest: g}
		res, err := New(Options{}).Agent(g.Socket).Exec(ctx, ExecRequest{Argv: []string{"mkdir", "-p", gs[i].Dir}})
		if err != nil || res.ExitCode != 0 {
			t.Fatalf("guest scratch dir: %v %+v", err, res)
		}
	}
	return gs
}
