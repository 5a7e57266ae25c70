package sandbox

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"slices"

	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// Validate checks a create request (its defaults filled, as the API's
// validation leaves it) against this node without creating anything. It
// returns every refusal a create of it would meet whatever else runs on
// the node, in request order: unknown templates, templates that fail the
// hardened profile, disk sizes, a cap the sandbox passes on its own (a
// per-sandbox cap, or a node or owner cap on an empty node), the egress
// policy, a fixed CIDR on the host's networks. What other sandboxes hold
// (room, ranges in use) passes: a create waits for it or is placed
// elsewhere. It also returns the template names the node knows, sorted.
// err is a failure to ask Proxmox.
func (m *Engine) Validate(ctx context.Context, req apitype.CreateRequest) (refusals []error, templates []string, err error) {
	if templates, err = m.Templates(ctx); err != nil {
		return nil, nil, err
	}
	var names []string
	var ids, disks []int
	var vms []templateVM
	// Each template name is looked up once, however many VMs name it: a
	// read-scope call must not multiply Proxmox's work by the request's
	// size.
	known := map[string]int{}
	unknownName := map[string]bool{}
	for i, v := range req.VMs {
		key := v.Kind + "/" + v.Template
		id, seen := known[key]
		var err error
		if !seen && !unknownName[key] {
			id, err = m.templateIDOf(ctx, v.Kind, v.Template)
		}
		var unknown *InvalidError
		if unknownName[key] || errors.As(err, &unknown) {
			unknownName[key] = true
			refusals = append(refusals, invalid(fmt.Sprintf("vms[%d].template", i), "unknown template %q", v.Template))
			continue
		}
		if err != nil {
			return nil, nil, err
		}
		known[key] = id
		if v.Kind == apitype.KindLXC {
			if seen {
				continue
			}
			var pe *ProxmoxError
			if err := m.checkCT(ctx, "container template "+v.Template, id); errors.As(err, &pe) {
				return nil, nil, err
			} else if err != nil {
				refusals = append(refusals, err)
			}
			continue
		}
		names, ids, disks = append(names, v.Template), append(ids, id), append(disks, v.DiskGiB)
		vms = append(vms, templateVM{i, v})
	}
	// A profile or disk refusal is the request's; a failed Proxmox call is
	// not.
	var pe *ProxmoxError
	if err := m.checkVMOptionsAllowed(req); err != nil {
		refusals = append(refusals, err)
	}
	if err := m.checkTemplates(ctx, names, ids, vms); errors.As(err, &pe) {
		return nil, nil, err
	} else if err != nil {
		refusals = append(refusals, err)
	}
	if err := m.checkDiskSizes(ctx, names, disks, ids); errors.As(err, &pe) {
		return nil, nil, err
	} else if err != nil {
		refusals = append(refusals, err)
	}
	if err := m.o.Caps.alone(&req); err != nil {
		refusals = append(refusals, err)
	}
	if err := m.ValidateEgress(req.Egress); err != nil {
		refusals = append(refusals, err)
	}
	req.VMs = cloneVMRequests(req.VMs)
	shared, err := m.resolveSharedVNets(ctx, &req)
	if err != nil {
		return nil, nil, err
	}
	refusals = append(refusals, shared...)
	host, err := m.ownHostNetworks(ctx)
	if err != nil {
		return nil, nil, err
	}
	for i, n := range req.Networks {
		p, perr := netip.ParsePrefix(n.CIDR)
		if perr != nil {
			continue // "auto", or refused by the API's validation
		}
		if err := hostClash(n.Name, p, host); err != nil {
			m.logHostClash(err, req.Owner)
			refusals = append(refusals, invalid(fmt.Sprintf("networks[%d].cidr", i), "%v", err))
		}
	}
	return refusals, templates, nil
}

// Templates returns the names a create's VM may give as its template,
// sorted: the configured ones ([templates]) and the node's template VMs
// and container templates (found by name).
func (m *Engine) Templates(ctx context.Context) ([]string, error) {
	var out []string
	for name := range m.o.Templates {
		out = append(out, name)
	}
	vms, err := m.vms.ListVMs(ctx)
	if err != nil {
		return nil, pxErr("list vms", err)
	}
	if m.o.Containers != nil {
		cts, err := m.o.Containers.ListCTs(ctx)
		if err != nil {
			return nil, pxErr("list containers", err)
		}
		vms = append(vms, cts...)
	}
	for _, v := range vms {
		if v.Template && v.Name != "" {
			out = append(out, v.Name)
		}
	}
	slices.Sort(out)
	return slices.Compact(out), nil
}

// ownHostNetworks returns the host's networks that are not a sandbox's:
// a range in use (the cluster's subnets, this node's sandboxes) puts its
// gateway's network on the host, and a fixed CIDR on it waits for the
// range rather than being refused for good.
func (m *Engine) ownHostNetworks(ctx context.Context) ([]netip.Prefix, error) {
	foreign, host, err := m.rangesInUse(ctx)
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	inUse := m.rangesInUseLocked(foreign)
	m.mu.Unlock()
	return slices.DeleteFunc(host, func(h netip.Prefix) bool {
		return slices.ContainsFunc(inUse, func(u netip.Prefix) bool { return u.Bits() <= h.Bits() && u.Contains(h.Addr()) })
	}), nil
}

// hostClash refuses a fixed CIDR of network name that overlaps one of the
// host's networks (a refusal no wait ends). The refusal does not name the
// host's network, so one refused create does not hand a tenant's token
// the node's own networks (its management LAN, the uplink's on-link
// ranges); the caller logs it for the operator (logHostClash, never under
// m.mu). That a CIDR is refused still says it overlaps one (a yes or no a
// create must give): narrowing a network down takes a request per guess,
// each logged with its owner.
func hostClash(name string, p netip.Prefix, host []netip.Prefix) error {
	for _, h := range host {
		if h.Overlaps(p) {
			return &hostClashError{
				err:     refuse(ErrConflict, "network %q: cidr %s overlaps a network of the node's host (its addresses and routes; which one is in the node's log): pick another cidr, or \"auto\"", name, p),
				network: name, cidr: p, host: h,
			}
		}
	}
	return nil
}

// hostClashError is hostClash's refusal; it says the host's network only
// to logHostClash.
type hostClashError struct {
	err        error
	network    string
	cidr, host netip.Prefix
}

func (e *hostClashError) Error() string { return e.err.Error() }
func (e *hostClashError) Unwrap() error { return e.err }

// logHostClash logs, for the operator, the host's network a refusal of
// owner's request (err, when a hostClash) withheld from the client.
func (m *Engine) logHostClash(err error, owner string) {
	var hc *hostClashError
	if errors.As(err, &hc) {
		m.log.Info("fixed cidr refused: it overlaps a network of the node's host", "owner", owner, "network", hc.network, "cidr", hc.cidr, "host_network", hc.host)
	}
}
