package pveapi

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/pve-inspect/pve-inspect/sandbox"
)

// EditsCommitted implements the engine's sharing of another client's SDN
// apply: it says whether every SDN edit this client made since its last
// apply (its zones, vnets and subnets, created or deleted) is already in
// the cluster's running configuration, committed by another client's
// apply (another node's daemon). Such an apply's worker reloads every
// node, this one too, so an apply of this client's own would only repeat
// it. With no edits recorded it says false (an apply asked for then is a
// retry, which must run). When it says true, the edits it checked are
// taken; edits made since stay.
//
// An object is pending while GET .../?pending=1 lists it with a "state"
// (new, changed, deleted: pve-network SDN.pm pending_config); a subnet's
// own list is read per vnet, and a vnet that no longer exists has no
// pending subnet.
func (c *Client) EditsCommitted(ctx context.Context) (bool, error) {
	edits := c.own.snapshot()
	if len(edits) == 0 {
		return false, nil
	}
	pending := map[string]bool{}
	for _, kind := range []string{"zone", "vnet"} {
		var objs []pendingObject
		if err := c.c.Get(ctx, "/cluster/sdn/"+kind+"s?pending=1", &objs); err != nil {
			return false, classify("list pending "+kind+"s", err)
		}
		for _, o := range objs {
			id := o.Zone
			if kind == "vnet" {
				id = o.VNet
			}
			if o.State != "" {
				pending[kind+" "+id] = true
			}
		}
	}
	vnets := map[string]bool{}
	for e := range edits {
		if pending[e] {
			return false, nil
		}
		if v, ok := strings.CutPrefix(e, "subnet "); ok {
			vnets[strings.Fields(v)[0]] = true
		}
	}
	for v := range vnets {
		var ss []struct {
			ID    string `json:"subnet"`
			CIDR  string `json:"cidr"`
			State string `json:"state"`
		}
		err := c.c.Get(ctx, "/cluster/sdn/vnets/"+url.PathEscape(v)+"/subnets?pending=1", &ss)
		if err != nil {
			if errors.Is(classify("", err), sandbox.ErrNotFound) {
				continue // the vnet is gone, its subnets with it
			}
			return false, classify(fmt.Sprintf("list pending subnets of %s", v), err)
		}
		for _, s := range ss {
			cidr := s.CIDR
			if cidr == "" {
				cidr = subnetCIDR(s.ID)
			}
			if _, mine := edits["subnet "+v+" "+cidr]; s.State != "" && mine {
				return false, nil
			}
		}
	}
	c.own.drop(edits)
	return true, nil
}
