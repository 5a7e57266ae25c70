package sandbox

import (
	"context"
	"fmt"
	"net/netip"
	"slices"
	"strings"

	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// Shared vnets ([api] shared_vnets, Options.SharedVNets) are Proxmox SDN
// vnets the node's operator made, in zones the daemon did not create,
// that a sandbox's VMs may have NICs on (apitype.NIC.VNet), as the
// reference plugin's sdn_config=None attaches VMs to existing vnets.
//
// Design decisions:
//
//   - The operator opts in, by vnet id; a request names a listed vnet by
//     its id or its Proxmox alias (what the reference's vnet_alias
//     matches: the alias of GET /cluster/sdn/vnets). Anything else is an
//     InvalidError of the NIC's vnet field, listing what the node shares.
//   - A listed vnet is checked at every use (a create, a validate) and at
//     the daemon's start (CheckSharedVNets): it must exist, must not be a
//     sandbox's (its zone a sandbox id, or its alias carrying a pvei-
//     tag, this daemon's or another node's), must not be a management or
//     trusted interface of the host guard, and must have an IPv4 subnet
//     (the guard's zone map and port map know a guest there by its zone
//     and its IPAM address), and its zone must be "simple" (a VLAN,
//     QinQ, VXLAN or EVPN zone's vnet is bridged to an uplink: a guest's
//     frames would leave the node past the guard's routed rules), and
//     every other vnet of its zone must be listed too (the guard lets a
//     zone's vnets reach each other through the node).
//   - The engine never creates, changes or deletes a shared vnet, its
//     subnets or its IPAM entries: the VM's entry there is Proxmox's,
//     added when the NIC is configured and removed when the VM is
//     destroyed (qemu-server QemuServer/Network.pm
//     create_ifaces_ipams_ips, delete_ifaces_ipams_ips), so the
//     sandbox's delete leaves nothing of it on the vnet. The vnet is not
//     among the sandbox's bridges handed to the guard (publishZones) or
//     to its egress policy: its zone is its own owner there.
//   - Egress cannot be the sandbox's on a vnet of another zone: a VM with
//     a NIC there leaves by it under the node's default policy ([egress]
//     default_mode, for zones the daemon did not create), whatever its
//     sandbox's own networks have. So a sandbox with such a NIC takes no
//     egress policy (create, SetEgress): refused, field egress.
//   - A warm pool member never has one (PoolShape.matches).

// ZoneTyper is a Proxmox that reads an SDN zone's type (pveapi.Client
// does): a shared vnet must be of a "simple" zone. Without it no vnet can
// be shared.
type ZoneTyper interface {
	ZoneType(ctx context.Context, zone string) (string, error)
}

// sharedVNet is a listed vnet as Proxmox lists it.
type sharedVNet = VNetInfo

// usesSharedVNets reports whether a NIC of req names a shared vnet.
func usesSharedVNets(req apitype.CreateRequest) bool {
	for _, v := range req.VMs {
		if slices.ContainsFunc(v.NICs, func(n apitype.NIC) bool { return n.VNet != "" }) {
			return true
		}
	}
	return false
}

// sandboxUsesSharedVNets reports whether a VM of sb has a NIC on a shared
// vnet.
func sandboxUsesSharedVNets(sb apitype.Sandbox) bool {
	for _, v := range sb.VMs {
		for _, n := range v.Networks {
			if _, ok := apitype.SharedVNetOf(n); ok {
				return true
			}
		}
	}
	return false
}

// errSharedEgress refuses an egress policy for a sandbox on a shared vnet.
func errSharedEgress() error {
	return invalid("egress", "a sandbox with a NIC on a shared vnet takes no egress policy: that NIC leaves by the vnet's own zone, "+
		"under the node's default policy for zones the daemon did not create ([egress] default_mode), whatever the sandbox's networks have")
}

// resolveSharedVNets checks every NIC of req that names a shared vnet and
// rewrites it (NIC.VNet, and the VM's networks entry) to the vnet's id.
// It returns the refusals, each an InvalidError of the NIC's vnet field
// (or of egress); err is a failure to ask Proxmox.
func (m *Engine) resolveSharedVNets(ctx context.Context, req *apitype.CreateRequest) (refusals []error, err error) {
	if !usesSharedVNets(*req) {
		return nil, nil
	}
	listed, err := m.cleaner.ListVNets(ctx)
	if err != nil {
		return nil, pxErr("list vnets", err)
	}
	checked := map[string]string{} // vnet id -> why it cannot be shared ("" ok)
	for i := range req.VMs {
		v := &req.VMs[i]
		for j := range v.NICs {
			n := &v.NICs[j]
			if n.VNet == "" {
				continue
			}
			f := fmt.Sprintf("vms[%d].nics[%d].vnet", i, j)
			sv, why := m.findShared(listed, n.VNet)
			if why == "" {
				var seen bool
				if why, seen = checked[sv.ID]; !seen {
					if why, err = m.sharedRefusal(ctx, sv, listed); err != nil {
						return nil, err
					}
					checked[sv.ID] = why
				}
			}
			if why != "" {
				refusals = append(refusals, invalid(f, "vnet %q: %s; this node shares %s", n.VNet, why, m.sharedList(listed)))
				continue
			}
			n.VNet = sv.ID
			if j < len(v.Networks) {
				v.Networks[j] = apitype.SharedNetwork(sv.ID)
			}
		}
	}
	if req.Egress != nil {
		refusals = append(refusals, errSharedEgress())
	}
	return refusals, nil
}

// findShared finds the shared vnet a NIC names: a listed vnet by id, else
// by its Proxmox alias. why says why none matches.
func (m *Engine) findShared(listed []VNetInfo, name string) (sharedVNet, string) {
	var byAlias []sharedVNet
	for _, v := range listed {
		if !slices.Contains(m.o.SharedVNets, v.ID) {
			continue
		}
		if v.ID == name {
			return v, ""
		}
		if v.Alias != "" && v.Alias == name {
			byAlias = append(byAlias, v)
		}
	}
	switch len(byAlias) {
	case 1:
		return byAlias[0], ""
	case 0:
		if slices.Contains(m.o.SharedVNets, name) {
			return sharedVNet{}, "listed in [api] shared_vnets but not a vnet of Proxmox's SDN"
		}
		return sharedVNet{}, "not a vnet this node shares (the operator lists them in [api] shared_vnets)"
	default:
		return sharedVNet{}, "the alias of several shared vnets; name one by its id"
	}
}

// sharedList names the vnets this node shares, with their aliases.
func (m *Engine) sharedList(listed []VNetInfo) string {
	if len(m.o.SharedVNets) == 0 {
		return "none"
	}
	var out []string
	for _, id := range m.o.SharedVNets {
		k := slices.IndexFunc(listed, func(v VNetInfo) bool { return v.ID == id })
		if k >= 0 && listed[k].Alias != "" {
			out = append(out, fmt.Sprintf("%s (alias %q)", id, listed[k].Alias))
			continue
		}
		out = append(out, id)
	}
	return strings.Join(out, ", ")
}

// sharedRefusal says why the listed vnet v cannot be shared ("" when it
// can), all the cluster's vnets being all; err is a failure to ask
// Proxmox.
func (m *Engine) sharedRefusal(ctx context.Context, v sharedVNet, all []VNetInfo) (string, error) {
	if ValidID(v.Zone) {
		return fmt.Sprintf("its zone %s is a sandbox's", v.Zone), nil
	}
	if slices.ContainsFunc(aliasTags(v.Alias), func(t string) bool { return strings.HasPrefix(t, "pvei-") }) {
		return "its alias carries a sandbox's ownership tags", nil
	}
	// the guard lets the vnets of one zone reach each other through the
	// node (@zone_peers): a guest on v reaches every vnet of its zone
	for _, o := range all {
		if o.Zone == v.Zone && o.ID != v.ID && !slices.Contains(m.o.SharedVNets, o.ID) {
			return fmt.Sprintf("its zone %s has the vnet %s, not shared, which the host guard lets the zone's vnets reach", v.Zone, o.ID), nil
		}
	}
	if m.o.HostInterfaces != nil && slices.Contains(m.o.HostInterfaces(), v.ID) {
		return "it is a management or trusted interface of the host guard", nil
	}
	// Only a simple zone's vnet is a bridge of this node alone, routed
	// by the node (pve-network Zones/SimplePlugin.pm generate_sdn_config:
	// "bridge_ports none"): a VLAN, QinQ, VXLAN or EVPN zone's vnet has an
	// uplink port (VlanPlugin.pm: the zone's bridge's VLAN), and a guest's
	// frames leave by it at layer 2, past the guard's routed rules (the
	// metadata, LAN and management drops); the layer-2 table leaves
	// uplinks alone.
	zt, ok := m.o.Proxmox.(ZoneTyper)
	if !ok {
		return "the daemon cannot read its zone's type", nil
	}
	typ, err := zt.ZoneType(ctx, v.Zone)
	if err != nil {
		return "", pxErr("read the type of zone "+v.Zone, err)
	}
	if typ != "simple" {
		return fmt.Sprintf("its zone %s is of type %s, not simple: its vnets are bridged to an uplink, past the host guard's routed rules", v.Zone, typ), nil
	}
	cidrs, err := m.cleaner.VNetSubnets(ctx, v.ID)
	if err != nil {
		return "", pxErr("list subnets of vnet "+v.ID, err)
	}
	if !slices.ContainsFunc(cidrs, func(c string) bool {
		p, err := netip.ParsePrefix(c)
		return err == nil && p.Addr().Is4()
	}) {
		return "it has no IPv4 subnet (the host guard maps a guest's port by the address its zone's IPAM gives it)", nil
	}
	return "", nil
}

// CheckSharedVNets checks every vnet of [api] shared_vnets as a create
// would (resolveSharedVNets); the daemon calls it at start and does not
// serve the API while it fails. The error names the first vnet refused.
func (m *Engine) CheckSharedVNets(ctx context.Context) error {
	if len(m.o.SharedVNets) == 0 {
		return nil
	}
	listed, err := m.cleaner.ListVNets(ctx)
	if err != nil {
		return pxErr("list vnets", err)
	}
	for _, id := range m.o.SharedVNets {
		k := slices.IndexFunc(listed, func(v VNetInfo) bool { return v.ID == id })
		if k < 0 {
			return fmt.Errorf("[api] shared_vnets: vnet %s is not a vnet of Proxmox's SDN", id)
		}
		why, err := m.sharedRefusal(ctx, listed[k], listed)
		if err != nil {
			return err
		}
		if why != "" {
			return fmt.Errorf("[api] shared_vnets: vnet %s cannot be shared: %s", id, why)
		}
	}
	return nil
}

// bridgeOf is the bridge (vnet id) of a VM's networks entry: a network of
// the sandbox's (nets), or a shared vnet; "" when neither.
func bridgeOf(nets []apitype.Network, name string) string {
	if id, ok := apitype.SharedVNetOf(name); ok {
		return id
	}
	for _, n := range nets {
		if n.Name == name {
			return n.VNet
		}
	}
	return ""
}

// cloneVMRequests copies vms deep enough that resolving a request's shared
// vnets (which rewrites NICs and networks) leaves the caller's untouched.
func cloneVMRequests(vms []apitype.VMRequest) []apitype.VMRequest {
	out := slices.Clone(vms)
	for i := range out {
		out[i].Networks = slices.Clone(out[i].Networks)
		out[i].NICs = slices.Clone(out[i].NICs)
	}
	return out
}
