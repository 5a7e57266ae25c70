package bench

import (
	"context"
	"fmt"
	"io"
	"math"
	"net/netip"
	"slices"
	"time"

	"github.com/pve-inspect/pve-inspect/testvm"
)

// Config is what cmd/pve-inspect-bench passes to every section.
type Config struct {
	// Quick asks for smaller sizes and fewer rounds.
	Quick bool
	// Out receives the section's figures.
	Out io.Writer
}

// Func runs one section: it measures and prints to cfg.Out, and returns
// an error when the section could not run to its end.
type Func func(ctx context.Context, cfg Config) error

// Median returns the middle value of ds (the upper one of an even count),
// 0 for none. ds is not modified.
func Median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[len(s)/2]
}

// Quantile returns the q-quantile (0 < q <= 1) of ds by the nearest rank,
// 0 for none. ds is not modified.
func Quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Sorted(slices.Values(ds))
	i := int(math.Ceil(q*float64(len(s)))) - 1
	return s[min(max(i, 0), len(s)-1)]
}

// OneGuestBed brings up a test bed with one zone (zonea, vnet vneta on
// 10.10.1.0/24 with SNAT) and one guest (VMID 101) on it. Close the bed.
func OneGuestBed(ctx context.Context) (*testvm.Bed, *testvm.Guest, error) {
	b, err := testvm.Up(ctx, testvm.Options{})
	if err != nil {
		return nil, nil, fmt.Errorf("bench: test bed: %w", err)
	}
	v := testvm.VNet{Name: "vneta", Subnet: netip.MustParsePrefix("10.10.1.0/24"), Gateway: netip.MustParseAddr("10.10.1.1"),
		DHCP: []testvm.DHCPRange{{Start: netip.MustParseAddr("10.10.1.100"), End: netip.MustParseAddr("10.10.1.200")}}, SNAT: true}
	if err := b.AddZone(ctx, testvm.Zone{ID: "zonea", VNets: []testvm.VNet{v}}); err != nil {
		_ = b.Close()
		return nil, nil, fmt.Errorf("bench: test bed zone: %w", err)
	}
	g, err := b.StartGuest(ctx, testvm.GuestSpec{VMID: 101, VNet: "vneta"})
	if err != nil {
		_ = b.Close()
		return nil, nil, fmt.Errorf("bench: test bed guest: %w", err)
	}
	return b, g, nil
}
