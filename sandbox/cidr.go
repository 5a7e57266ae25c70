package sandbox

import (
	"net/netip"
	"slices"

	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// allocCIDRsLocked picks ranges for "auto" networks and checks explicit ones
// against every known range and the host's own networks; call with m.mu
// held (so two creates never pick the same range).
func (m *Engine) allocCIDRsLocked(nets []apitype.NetworkRequest, foreign, host []netip.Prefix) ([]netip.Prefix, error) {
	used := append(slices.Clone(foreign), host...)
	for _, r := range m.sbx {
		for _, n := range r.Networks {
			if p, err := netip.ParsePrefix(n.CIDR); err == nil {
				used = append(used, p)
			}
		}
	}
	overlaps := func(p netip.Prefix) bool {
		for _, u := range used {
			if u.Overlaps(p) {
				return true
			}
		}
		return false
	}
	out := make([]netip.Prefix, len(nets))
	for i, n := range nets {
		if n.CIDR == "auto" {
			continue
		}
		p := netip.MustParsePrefix(n.CIDR)
		for _, h := range host {
			if h.Overlaps(p) {
				return nil, refuse(ErrConflict, "network %q: cidr %s overlaps the host's network %s", n.Name, p, h)
			}
		}
		if overlaps(p) {
			return nil, refuse(ErrConflict, "network %q: cidr %s overlaps a range in use", n.Name, p)
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
			a := start + k*step
			p := netip.PrefixFrom(netip.AddrFrom4([4]byte{byte(a >> 24), byte(a >> 16), byte(a >> 8), byte(a)}), m.o.AutoCIDRBits)
			if !overlaps(p) {
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
