package templatebuild

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// The build network: the build VM boots a freshly downloaded image, which
// is hostile from its first boot on, so it is never put on the management
// bridge (the node's API and SSH, the sandbox API, the LAN, the metadata
// services). It is a simple SDN zone of its own, with one vnet and one
// subnet with DHCP and SNAT, the shape of the reference plugin's static
// SDN: a vnet bridge that is neither management nor trusted is a guest
// bridge to the host guard, so the guard's guest rules (DHCP and DNS to
// the node, nothing else of it; the egress default and the lockdown
// beyond) hold for the build VM as for any sandbox. It is made once and
// kept: every later build (of any name, on this node) reuses it.
const (
	// BuildZone is the build network's SDN zone.
	BuildZone = "pveib"
	// BuildVNet is its vnet, and so the bridge the build VM's NIC is on.
	BuildVNet = "pveibld"
	// DefaultBuildCIDR is its subnet unless Options.BuildCIDR says another.
	DefaultBuildCIDR = "10.254.254.0/24"
)

// buildNetwork makes sure the build network exists (made and applied when
// missing) and returns its bridge. A vnet of its name in another zone, or
// a subnet of another CIDR on it, is not the build's: the build stops.
func (b *Builder) buildNetwork(ctx context.Context) (string, error) {
	pfx, err := parseBuildCIDR(b.o.BuildCIDR)
	if err != nil {
		return "", err
	}
	vnets, err := b.px.ListVNets(ctx)
	if err != nil {
		return "", fmt.Errorf("list SDN vnets: %w", err)
	}
	i := slices.IndexFunc(vnets, func(v sandbox.VNetInfo) bool { return v.ID == BuildVNet })
	if i >= 0 && vnets[i].Zone != BuildZone {
		return "", fmt.Errorf("SDN vnet %s is in zone %s, not the build network's zone %s: remove it or build with --bridge", BuildVNet, vnets[i].Zone, BuildZone)
	}
	var have []string
	if i >= 0 {
		if have, err = b.px.VNetSubnets(ctx, BuildVNet); err != nil {
			return "", fmt.Errorf("list the subnets of %s: %w", BuildVNet, err)
		}
		if len(have) > 0 && !slices.Equal(have, []string{pfx.String()}) {
			return "", fmt.Errorf("the build network %s has subnets %v, want %s: remove the vnet (it is remade) or pass --build-cidr", BuildVNet, have, pfx)
		}
	}
	if len(have) == 0 {
		if err := b.makeBuildNetwork(ctx, pfx, i >= 0); err != nil {
			return "", err
		}
	} else {
		b.say("network", "build network %s (%s, SNAT and DHCP) is on the node: reused", BuildVNet, pfx)
	}
	// Applied every time: an earlier run may have died between its edits
	// and the apply, and an applied configuration is applied again as is.
	if err := b.px.ApplySDN(ctx); err != nil {
		return "", fmt.Errorf("apply the build network: %w", err)
	}
	return BuildVNet, nil
}

// parseBuildCIDR checks --build-cidr ("" is DefaultBuildCIDR).
func parseBuildCIDR(s string) (netip.Prefix, error) {
	if s == "" {
		s = DefaultBuildCIDR
	}
	pfx, err := netip.ParsePrefix(s)
	if err != nil || pfx != pfx.Masked() || !pfx.Addr().Is4() || pfx.Bits() > 29 {
		return netip.Prefix{}, fmt.Errorf("--build-cidr %q: want an IPv4 network of at most /29 (e.g. %s)", s, DefaultBuildCIDR)
	}
	return pfx, nil
}

// makeBuildNetwork creates the zone (unless there), the vnet (unless
// vnetThere) and the subnet.
func (b *Builder) makeBuildNetwork(ctx context.Context, pfx netip.Prefix, vnetThere bool) error {
	all, err := b.px.ListSubnetCIDRs(ctx)
	if err != nil {
		return fmt.Errorf("list SDN subnets: %w", err)
	}
	for _, c := range all {
		if o, err := netip.ParsePrefix(c); err == nil && o.Overlaps(pfx) {
			return fmt.Errorf("the build network's %s overlaps the SDN subnet %s: pass --build-cidr", pfx, o)
		}
	}
	b.say("network", "making the build network: zone %s, vnet %s, subnet %s with SNAT and DHCP", BuildZone, BuildVNet, pfx)
	if err := b.px.CreateZone(ctx, sandbox.ZoneSpec{ID: BuildZone}); err != nil && !errors.Is(err, sandbox.ErrExists) {
		return fmt.Errorf("create the build zone: %w", err)
	}
	if !vnetThere {
		if err := b.px.CreateVNet(ctx, sandbox.VNetSpec{ID: BuildVNet, Zone: BuildZone, Alias: "pve-inspectd template build"}); err != nil && !errors.Is(err, sandbox.ErrExists) {
			return fmt.Errorf("create the build vnet: %w", err)
		}
	}
	gw := pfx.Addr().Next()
	first, last := gw.Next(), lastHost(pfx)
	if err := b.px.CreateSubnet(ctx, sandbox.SubnetSpec{VNet: BuildVNet, CIDR: pfx.String(), Gateway: gw.String(), SNAT: true,
		DHCPRanges: []apitype.DHCPRange{{Start: first.String(), End: last.String()}}}); err != nil {
		return fmt.Errorf("create the build subnet: %w", err)
	}
	return nil
}

// lastHost is the last address of pfx before its broadcast address.
func lastHost(pfx netip.Prefix) netip.Addr {
	a := pfx.Addr().As4()
	host := uint32(1)<<(32-pfx.Bits()) - 2
	n := uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3]) + host
	return netip.AddrFrom4([4]byte{byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n)})
}

// checkBridge refuses a --bridge the host guard treats as management or
// trusted (its guest rules do not hold there) unless the operator opted
// in to an unguarded build (Options.Unguarded).
func (o Options) checkBridge() error {
	if o.Bridge == "" {
		_, err := parseBuildCIDR(o.BuildCIDR)
		return err
	}
	if o.Unguarded || !slices.Contains(o.Protected, o.Bridge) {
		return nil
	}
	return fmt.Errorf("--bridge %s is a management or trusted bridge: the freshly booted image would reach the node's API and SSH, the sandbox API, the LAN and the metadata services; "+
		"build on the build network (no --bridge), on a guest bridge, or pass --unguarded-bridge to accept that", o.Bridge)
}
