package firewall

import (
	"net/netip"
	"slices"

	"github.com/google/nftables"
)

// addrRange is an inclusive address range of one family.
type addrRange struct{ from, to netip.Addr }

// lastAddr returns the highest address of p.
func lastAddr(p netip.Prefix) netip.Addr {
	p = p.Masked()
	b := p.Addr().AsSlice()
	bits := p.Bits()
	for i := range b {
		for j := 0; j < 8; j++ {
			if i*8+j >= bits {
				b[i] |= 0x80 >> j
			}
		}
	}
	a, _ := netip.AddrFromSlice(b)
	return a
}

// mergePrefixes turns prefixes of one family into sorted, non-overlapping,
// non-adjacent ranges (the kernel refuses overlapping interval elements).
func mergePrefixes(ps []netip.Prefix) []addrRange {
	rs := make([]addrRange, 0, len(ps))
	for _, p := range ps {
		rs = append(rs, addrRange{p.Masked().Addr(), lastAddr(p)})
	}
	slices.SortFunc(rs, func(a, b addrRange) int { return a.from.Compare(b.from) })
	var out []addrRange
	for _, r := range rs {
		if n := len(out); n > 0 {
			last := &out[n-1]
			next := last.to.Next()
			if r.from.Compare(last.to) <= 0 || (next.IsValid() && r.from == next) {
				if r.to.Compare(last.to) > 0 {
					last.to = r.to
				}
				continue
			}
		}
		out = append(out, r)
	}
	return out
}

// intervalElements renders merged ranges the way the kernel stores interval
// sets: a start element and an end element holding the first address after
// the range (omitted when the range reaches the top of the address space).
func intervalElements(rs []addrRange) []nftables.SetElement {
	var els []nftables.SetElement
	for _, r := range rs {
		els = append(els, nftables.SetElement{Key: r.from.AsSlice()})
		if n := r.to.Next(); n.IsValid() {
			els = append(els, nftables.SetElement{Key: n.AsSlice(), IntervalEnd: true})
		}
	}
	return els
}

// rangeText renders a merged range as a prefix when it is one, else a-b.
func rangeText(r addrRange) string {
	for bits := 0; bits <= r.from.BitLen(); bits++ {
		p := netip.PrefixFrom(r.from, bits)
		if p.Masked().Addr() == r.from && lastAddr(p) == r.to {
			if bits == r.from.BitLen() {
				return r.from.String()
			}
			return p.String()
		}
	}
	return r.from.String() + "-" + r.to.String()
}
