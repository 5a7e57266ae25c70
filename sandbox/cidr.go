package sandbox

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"math/rand/v2"
	"net/netip"
	"slices"
	"time"

	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// claimSubnet creates the subnet of rec's network i and makes sure no
// other sandbox's subnet overlaps it. The daemons of a cluster's nodes
// share one SDN configuration but no lock (pve-network checks only that a
// subnet id, "<zone>-<cidr>", is new: the same range in two zones is
// allowed), so two of them may pick the same free range at once. After
// the create the range must be the only one of its kind in the cluster's
// list; else this create backs off: its subnet goes and an "auto" network
// picks another range (a few times), an explicit one fails with
// ErrConflict. Of two overlapping subnets the one created last sees the
// other, so never both stay.
//
// A range given up goes with its vnet, and the next range gets a vnet of
// a new name (renameVNet): another client's apply may have committed the
// contested subnet and a node's reload made its bridge with it; were the
// vnet kept, a lost reload of this create's own apply (ifupdown2's lock
// does not wait) would leave that bridge, of the right name and the wrong
// range, to pass the check of the sandbox's bridges (applySDNFor), and
// its VM would get no lease until some later apply.
func (m *Engine) claimSubnet(ctx context.Context, rec *record, i int) error {
	for attempt := 0; ; attempt++ {
		m.mu.Lock()
		n := rec.Networks[i]
		auto := i < len(rec.autoCIDR) && rec.autoCIDR[i]
		m.mu.Unlock()
		p := netip.MustParsePrefix(n.CIDR)
		gw, _, _ := subnetPlan(p)
		s := SubnetSpec{VNet: n.VNet, CIDR: n.CIDR, Gateway: gw.String(), SNAT: n.SNAT, DHCPRanges: slices.Clone(n.DHCPRanges)}
		if err := m.zones.CreateSubnet(ctx, s); err != nil {
			return pxErr("create subnet "+n.CIDR, err)
		}
		// Fresh: every vnet whose subnets may have changed since the
		// pick is read again (subnetCache says which and why).
		seen, err := m.clusterSubnets(ctx, true)
		if err != nil {
			return err
		}
		clash := 0
		for _, q := range seen {
			if q.Overlaps(p) {
				clash++
			}
		}
		if clash <= 1 { // only ours
			return nil
		}
		m.log.Info("another sandbox of the cluster took the range too; backing off", "sandbox", rec.ID, "cidr", p)
		if err := m.cleaner.DeleteSubnet(ctx, n.VNet, n.CIDR); err != nil {
			return pxErr("delete contested subnet "+n.CIDR, err)
		}
		if !auto {
			return &RangeInUseError{Index: i, Msg: fmt.Sprintf("network %q: cidr %s is taken by another sandbox of the cluster", n.Name, p)}
		}
		if attempt >= 10 {
			return refuse(ErrConflict, "network %q: cidr %s is taken by another sandbox of the cluster", n.Name, p)
		}
		if err := m.renameVNet(ctx, rec, i); err != nil {
			return err
		}
		// A random pause, so that two contenders do not pick in step.
		select {
		case <-ctx.Done():
			return fmt.Errorf("create: %w", ctx.Err())
		case <-time.After(time.Duration(rand.IntN(200)) * time.Millisecond):
		}
		var host []netip.Prefix
		if m.o.HostNetworks != nil {
			if host, err = m.o.HostNetworks(ctx); err != nil {
				return fmt.Errorf("create: %w", err)
			}
		}
		m.mu.Lock()
		// From a random place in the pool: two contenders that both
		// take the lowest free range would meet again.
		ps, err := m.allocCIDRsFromLocked([]apitype.NetworkRequest{{Name: n.Name, CIDR: "auto"}}, seen, host, rand.Uint64())
		if err == nil {
			gw, _, _ := subnetPlan(ps[0])
			rec.Networks[i].CIDR, rec.Networks[i].Gateway = ps[0].String(), gw.String()
			rec.Networks[i].DHCPRanges = nil
			rec.Networks[i] = withPlanRanges(rec.Networks[i])
		}
		m.mu.Unlock()
		if err != nil {
			return err
		}
		if err := m.saveState(); err != nil {
			return err
		}
	}
}

// renameVNet replaces the vnet of rec's network i (its subnet gone) by one
// of a new name in the same zone: "v", the sandbox id's six characters and
// a letter, never one the sandbox had (claimSubnet says why).
func (m *Engine) renameVNet(ctx context.Context, rec *record, i int) error {
	m.mu.Lock()
	old := rec.Networks[i].VNet
	if rec.vnetRenames >= 26 {
		m.mu.Unlock()
		return refuse(ErrConflict, "network %q: no more vnet names to move to a new range", rec.Networks[i].Name)
	}
	name := "v" + rec.ID[2:] + string(rune('a'+rec.vnetRenames))
	rec.vnetRenames++
	m.mu.Unlock()
	if err := m.cleaner.DeleteVNet(ctx, old); err != nil && !errors.Is(err, ErrNotFound) {
		return pxErr("delete vnet "+old+" of a contested range", err)
	}
	m.mu.Lock()
	rec.Networks[i].VNet = name
	m.mu.Unlock()
	if err := m.saveState(); err != nil {
		return err
	}
	if err := m.zones.CreateVNet(ctx, VNetSpec{ID: name, Zone: rec.ID, Alias: nodeTag(m.o.Node) + " " + sandboxTag(rec.ID)}); err != nil {
		return pxErr("create vnet "+name, err)
	}
	return nil
}

// allocCIDRsLocked picks ranges for "auto" networks and checks explicit ones
// against every known range and the host's own networks; call with m.mu
// held (so two creates never pick the same range). The search for a free
// range starts at this node's place in the pool (nodeStart), so that the
// daemons of a cluster do not all try the same lowest free range first.
func (m *Engine) allocCIDRsLocked(nets []apitype.NetworkRequest, foreign, host []netip.Prefix) ([]netip.Prefix, error) {
	return m.allocCIDRsFromLocked(nets, foreign, host, nodeStart(m.o.Node))
}

// nodeStart is the range number (modulo the pool's size) the search for
// node's "auto" ranges starts at: a hash of the node's name (FNV-1a), the
// same on each of its daemon's starts and different, but for a collision,
// from another node's. A node's sandboxes then take the ranges after its
// start, and two nodes' creates meet only where one node's run of ranges
// reaches the other's start (the back-off of claimSubnet handles that
// meeting as any other).
func nodeStart(node string) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(node))
	return h.Sum64()
}

// allocCIDRsFromLocked is allocCIDRsLocked scanning the pool for "auto"
// ranges from range number from (modulo the pool's size), wrapping around.
// An explicit range that overlaps one in use (another sandbox's, or a
// foreign subnet) is a RangeInUseError, checked before the host's
// networks: a sandbox's vnet puts its gateway's network on the host.
func (m *Engine) allocCIDRsFromLocked(nets []apitype.NetworkRequest, foreign, host []netip.Prefix, from uint64) ([]netip.Prefix, error) {
	inUse := m.rangesInUseLocked(foreign)
	used := append(slices.Clone(inUse), host...)
	overlaps := func(p netip.Prefix, in []netip.Prefix) bool {
		return slices.ContainsFunc(in, p.Overlaps)
	}
	out := make([]netip.Prefix, len(nets))
	for i, n := range nets {
		if n.CIDR == "auto" {
			continue
		}
		p := netip.MustParsePrefix(n.CIDR)
		for j := range i {
			if out[j].IsValid() && out[j].Overlaps(p) {
				return nil, refuse(ErrConflict, "network %q: cidr %s overlaps network %q of the same sandbox", n.Name, p, nets[j].Name)
			}
		}
		if overlaps(p, inUse) {
			return nil, &RangeInUseError{Index: i, Msg: fmt.Sprintf("network %q: cidr %s overlaps a range in use by another sandbox", n.Name, p)}
		}
		if err := hostClash(n.Name, p, host); err != nil {
			return nil, err
		}
		out[i] = p
		used = append(used, p)
	}
	pool := m.o.AutoCIDRPool
	for i, n := range nets {
		if n.CIDR != "auto" {
			continue
		}
		found := false
		step := uint64(1) << (32 - m.o.AutoCIDRBits)
		base := pool.Masked().Addr().As4()
		start := uint64(base[0])<<24 | uint64(base[1])<<16 | uint64(base[2])<<8 | uint64(base[3])
		count := uint64(1) << (m.o.AutoCIDRBits - pool.Bits())
		for k := uint64(0); k < count; k++ {
			a := start + ((from+k)%count)*step
			p := netip.PrefixFrom(netip.AddrFrom4([4]byte{byte(a >> 24), byte(a >> 16), byte(a >> 8), byte(a)}), m.o.AutoCIDRBits)
			if !overlaps(p, used) {
				out[i] = p
				used = append(used, p)
				found = true
				break
			}
		}
		if !found {
			return nil, refuse(ErrNoFreeRange, "network %q: no free /%d left in %s", n.Name, m.o.AutoCIDRBits, pool)
		}
	}
	return out, nil
}

// rangesInUseLocked returns foreign (the cluster's subnets) and the range
// of every network of this node's sandboxes and warm pool members; call
// with m.mu held.
func (m *Engine) rangesInUseLocked(foreign []netip.Prefix) []netip.Prefix {
	out := slices.Clone(foreign)
	for _, set := range []map[string]*record{m.sbx, m.members} {
		for _, r := range set {
			for _, n := range r.Networks {
				if p, err := netip.ParsePrefix(n.CIDR); err == nil {
					out = append(out, p)
				}
			}
		}
	}
	return out
}

// rfc1918 are the private IPv4 ranges sandbox networks must come from.
var rfc1918 = []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("172.16.0.0/12"), netip.MustParsePrefix("192.168.0.0/16")}

// PrivateRanges returns the RFC 1918 ranges a network's CIDR must lie in
// (PrivateV4), for the API's document to say them.
func PrivateRanges() []netip.Prefix { return slices.Clone(rfc1918) }

// PrivateV4 reports whether p lies wholly inside one RFC 1918 range.
func PrivateV4(p netip.Prefix) bool {
	for _, r := range rfc1918 {
		if p.Bits() >= r.Bits() && r.Contains(p.Addr()) {
			return true
		}
	}
	return false
}

// FixedAddressRefusal says why ip cannot be the fixed address of a VM's
// NIC on a network of prefix p ("" when it can): it is outside p, or p's
// network or broadcast address, or the gateway the daemon gives p. Proxmox
// refuses only an address outside every subnet of the vnet ("can't find
// any subnet": pve-network Subnets.pm find_ip_subnet) and one its IPAM
// holds, the gateway's included ("already exist": Ipams/PVEPlugin.pm
// add_ip); it would take the network and broadcast addresses, which no
// guest can use. Inside or outside the DHCP range is alike to it.
func FixedAddressRefusal(p netip.Prefix, ip netip.Addr) string {
	gw, _, last := subnetPlan(p)
	switch {
	case !p.Contains(ip):
		return fmt.Sprintf("outside the network's cidr %s", p)
	case ip == p.Masked().Addr():
		return "the network's own address"
	case ip == last.Next():
		return "the network's broadcast address"
	case ip == gw:
		return "the network's gateway"
	}
	return ""
}

// withPlanRanges is n with the DHCP range of its CIDR's plan (subnetPlan)
// when it has DHCP and no ranges of a request's, and none without DHCP.
func withPlanRanges(n apitype.Network) apitype.Network {
	if !n.DHCP {
		n.DHCPRanges = nil
		return n
	}
	p, err := netip.ParsePrefix(n.CIDR)
	if len(n.DHCPRanges) > 0 || err != nil {
		return n
	}
	n.DHCPRanges = []apitype.DHCPRange{PlanDHCPRange(p)}
	return n
}

// PlanDHCPRange is the DHCP range the daemon gives a network of prefix p
// with DHCP and no ranges of its request's (withPlanRanges).
func PlanDHCPRange(p netip.Prefix) apitype.DHCPRange {
	_, start, end := subnetPlan(p)
	return apitype.DHCPRange{Start: start.String(), End: end.String()}
}

// subnetPlan returns gateway and DHCP range of a prefix.
func subnetPlan(p netip.Prefix) (gw, start, end netip.Addr) {
	a := p.Addr().As4()
	n := uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3])
	size := uint32(1) << (32 - p.Bits())
	mk := func(v uint32) netip.Addr {
		return netip.AddrFrom4([4]byte{byte(v >> 24), byte(v >> 16), byte(v >> 8), byte(v)})
	}
	gw = mk(n + 1)
	start = mk(n + 10)
	if size <= 16 {
		start = mk(n + 2)
	}
	end = mk(n + size - 2)
	return gw, start, end
}
