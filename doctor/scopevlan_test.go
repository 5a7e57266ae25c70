package doctor

import (
	"context"
	"strings"
	"testing"

	"github.com/pve-inspect/pve-inspect/pveapi/access"
)

// TestScopeCheckPropagatedBridgeGrant: the template's bridge grant
// made propagating (by hand, or an older or edited pve-access-setup)
// reaches every VLAN of the bridge (pve-access-control AccessControl.pm
// roles: a propagating entry applies to every path below it, and
// check_vnet_access checks /sdn/zones/localnetwork/<bridge>/<tag> for a
// tagged NIC), so a leaked token puts pool VMs on any VLAN of vmbr0. The
// scope check probes the bridge path alone, where the grant is the
// table's, and passes. GET /access/permissions gives each privilege's
// propagate flag (RPCEnvironment.pm permissions): the check could fail on
// SDN.Use propagating below LocalZonePath (the emulator answers 1 for
// every privilege, so it needs the flag too).
func TestScopeCheckPropagatedBridgeGrant(t *testing.T) {
	nd := newNode(t)
	for _, who := range []string{access.User, nd.n.TokenID} {
		if err := nd.emu.SetACL(access.LocalZonePath+"/vmbr0", who, access.RoleBridge, true); err != nil {
			t.Fatal(err)
		}
	}
	var got map[string]map[string]any
	if err := nd.px.Get(context.Background(), "/access/permissions?path="+access.LocalZonePath+"/vmbr0/7", &got); err != nil {
		t.Fatal(err)
	}
	if _, ok := got[access.LocalZonePath+"/vmbr0/7"]["SDN.Use"]; !ok {
		t.Fatalf("the propagating grant does not reach VLAN 7: %v", got)
	}
	o := run(t, ScopeCheck(nd.px, nd.n, access.Calls()))
	if o.Status != Fail || !strings.Contains(o.Detail, "vmbr0") {
		t.Errorf("scope check with SDN.Use on every VLAN of vmbr0: %s %q, want a failure naming it", o.Status, o.Detail)
	}
}

// TestScopeCheckOldSDNGrant: an older pve-access-setup's main role on
// /sdn, propagating, reaches the IPAM, DNS, controller and fabric
// definitions; the scope check fails on it until the script runs again.
func TestScopeCheckOldSDNGrant(t *testing.T) {
	nd := newNode(t)
	for _, who := range []string{access.User, nd.n.TokenID} {
		if err := nd.emu.SetACL("/sdn", who, access.RoleMain, true); err != nil {
			t.Fatal(err)
		}
	}
	o := run(t, ScopeCheck(nd.px, nd.n, access.Calls()))
	if o.Status != Fail || !strings.Contains(o.Detail, "/sdn/ipams") {
		t.Errorf("scope check with the main role propagating from /sdn: %s %q, want a failure naming /sdn/ipams", o.Status, o.Detail)
	}
}
