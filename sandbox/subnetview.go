package sandbox

import (
	"context"
	"errors"
	"net/netip"
	"slices"
	"strings"
	"sync"
)

// subnetLister is the parts of the SDN API the cluster's subnets are read
// with: Proxmox has no call that lists every subnet (pve-network
// API2/Network/SDN/Subnets.pm index lists one vnet's), so it is the vnet
// listing and one subnet listing per vnet.
type subnetLister interface {
	ListVNets(ctx context.Context) ([]VNetInfo, error)
	VNetSubnets(ctx context.Context, vnet string) ([]string, error)
}

// subnetCache holds the subnets of the cluster's vnets as this engine last
// read them, so that a create reads the subnets of the vnets that are new
// since, not those of every vnet (which made a wave of N creates cost N²
// requests).
//
// An entry is keyed by the vnet's id and holds its zone and alias as the
// listing had them: a vnet missing from a listing, or listed with another
// zone or alias, loses its entry, so nothing outlives its vnet. Only a
// vnet that had a subnet is kept: one without is read again each time
// (a sandbox's vnet gets its subnet right after it is created).
//
// A cached list may be stale: Proxmox adds a subnet to an existing vnet on
// POST /cluster/sdn/vnets/{vnet}/subnets (Subnets.pm create) and moves one
// to it on PUT .../subnets/{subnet} naming it (Subnets.pm update), and
// neither shows in the vnet listing (a vnet's section in vnets.cfg does
// not change; the listing with pending=1 carries no digest). So a pick of
// a free range may use a stale list, and the check that decides whether
// a created subnet is contested (claimSubnet) reads fresh every vnet but
// a sandbox's that had a subnet: a daemon adds a subnet to a vnet only
// right after creating it (buildZone, renameVNet), never a second one, and
// never reuses a vnet whose range it gave up, so such a list can only have
// shrunk (its subnet deleted: the cache then holds a range that is free,
// which only keeps a pick off it until the vnet goes). A stale pick is
// then the race the back-off already handles: two creates that took one
// range at once.
//
// The mutex guards vnets; a leaf, never held across a call to Proxmox.
type subnetCache struct {
	mu    sync.Mutex
	vnets map[string]cachedVNet
}

// cachedVNet is a vnet's entry in subnetCache.
type cachedVNet struct {
	zone, alias string
	cidrs       []string
}

func newSubnetCache() *subnetCache { return &subnetCache{vnets: map[string]cachedVNet{}} }

// clusterSubnets returns the ranges of every subnet of the cluster (a
// deleted one that is not yet applied included: pending=1). With fresh
// (the contested check), it reads every vnet but a sandbox's that had a
// subnet (subnetCache says why); else it reads only the vnets it has no
// subnets of.
func (m *Engine) clusterSubnets(ctx context.Context, fresh bool) ([]netip.Prefix, error) {
	vs, err := m.subnets.ListVNets(ctx)
	if err != nil {
		return nil, pxErr("list vnets", err)
	}
	c := m.subnetCache
	var out []netip.Prefix
	var read []VNetInfo
	c.mu.Lock()
	listed := make(map[string]bool, len(vs))
	for _, v := range vs {
		listed[v.ID] = true
		e, ok := c.vnets[v.ID]
		if ok && (e.zone != v.Zone || e.alias != v.Alias) {
			delete(c.vnets, v.ID)
			ok = false
		}
		if !ok || (fresh && !sandboxVNet(v)) {
			read = append(read, v)
			continue
		}
		out = appendPrefixes(out, e.cidrs)
	}
	for id := range c.vnets {
		if !listed[id] {
			delete(c.vnets, id)
		}
	}
	c.mu.Unlock()
	for _, v := range read {
		cs, err := m.subnets.VNetSubnets(ctx, v.ID)
		if errors.Is(err, ErrNotFound) {
			continue // gone since the listing
		}
		if err != nil {
			return nil, pxErr("list subnets of "+v.ID, err)
		}
		out = appendPrefixes(out, cs)
		c.mu.Lock()
		if len(cs) > 0 {
			c.vnets[v.ID] = cachedVNet{zone: v.Zone, alias: v.Alias, cidrs: slices.Clone(cs)}
		} else {
			delete(c.vnets, v.ID)
		}
		c.mu.Unlock()
	}
	return out, nil
}

// sandboxVNet reports whether v is a sandbox's vnet, of any node's daemon:
// its zone is a sandbox id and its alias has a node's tag and that
// sandbox's tag (create.go, renameVNet).
func sandboxVNet(v VNetInfo) bool {
	if !ValidID(v.Zone) {
		return false
	}
	tags := aliasTags(v.Alias)
	return slices.Contains(tags, sandboxTag(v.Zone)) &&
		slices.ContainsFunc(tags, func(t string) bool { return strings.HasPrefix(t, "pvei-n-") })
}

// appendPrefixes appends the masked ranges of cidrs to out, skipping what
// does not parse.
func appendPrefixes(out []netip.Prefix, cidrs []string) []netip.Prefix {
	for _, s := range cidrs {
		if p, err := netip.ParsePrefix(s); err == nil {
			out = append(out, p.Masked())
		}
	}
	return out
}
