package qga

import (
	"context"
	"net/netip"
	"os"

	qgabench "github.com/pve-inspect/pve-inspect/bench/qga"
	"github.com/pve-inspect/pve-inspect/testvm"
)

// oneGuestBed brings up a bed with one zone and one guest.
func oneGuestBed(ctx context.Context) (*testvm.Bed, *testvm.Guest, error) {
	b, err := testvm.Up(ctx, testvm.Options{})
	if err != nil {
		return nil, nil, err
	}
	v := testvm.VNet{Name: "vneta", Subnet: netip.MustParsePrefix("10.10.1.0/24"), Gateway: netip.MustParseAddr("10.10.1.1"),
		DHCPStart: netip.MustParseAddr("10.10.1.100"), DHCPEnd: netip.MustParseAddr("10.10.1.200"), SNAT: true}
	if err := b.AddZone(ctx, testvm.Zone{ID: "zonea", VNets: []testvm.VNet{v}}); err != nil {
		_ = b.Close()
		return nil, nil, err
	}
	g, err := b.StartGuest(ctx, testvm.GuestSpec{VMID: 101, VNet: "vneta"})
	if err != nil {
		_ = b.Close()
		return nil, nil, err
	}
	return b, g, nil
}

// benchQGA measures our guest agent client against the raw ceiling and the
// reference path's shape, on a real qemu-ga of the bed.
func benchQGA(ctx context.Context, cfg config) error {
	b, g, err := oneGuestBed(ctx)
	if err != nil {
		return err
	}
	defer b.Close()
	var sizes []int64 // the defaults: 1, 64 and 512 MiB
	if cfg.quick {
		sizes = []int64{1 << 20, 64 << 20}
	}
	return qgabench.Run(ctx, os.Stdout, g.Socket, sizes)
}
