package sandbox_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// TestSharedVNetTakesNoEgress: on a node with egress policies, a sandbox
// with a NIC on a shared vnet takes no egress policy, neither in its
// create nor later (an InvalidError of field egress each), while one
// without such a NIC takes it: the shared NIC leaves under the vnet's
// zone's policy, whatever the sandbox's own networks have.
func TestSharedVNetTakesNoEgress(t *testing.T) {
	ctx := context.Background()
	b := newPoolBed(t, nil, func(o *sandbox.Options) { o.SharedVNets = []string{"lab"} })
	for _, err := range []error{b.px.CreateZone(ctx, sandbox.ZoneSpec{ID: "opzone"}), b.px.CreateVNet(ctx, sandbox.VNetSpec{ID: "lab", Zone: "opzone"}),
		b.px.CreateSubnet(ctx, sandbox.SubnetSpec{VNet: "lab", CIDR: "10.88.0.0/24", Gateway: "10.88.0.1"})} {
		if err != nil {
			t.Fatal(err)
		}
	}
	shared := func(egress *apitype.EgressPolicy) apitype.CreateRequest {
		req := oneVMSized("debian", 1, 512)
		req.VMs[0].NICs = []apitype.NIC{{Network: "net0"}, {VNet: "lab"}}
		req.VMs[0].Networks = []string{"net0", apitype.SharedNetwork("lab")}
		req.Egress = egress
		return req
	}
	none := apitype.EgressPolicy{Mode: "none"}
	var inv *sandbox.InvalidError
	if _, err := b.e.Create(ctx, shared(&none)); !errors.As(err, &inv) || inv.Field != "egress" {
		t.Fatalf("create with a policy: %v, want an invalid egress", err)
	}
	sb, err := b.e.Create(ctx, shared(nil))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.e.SetEgress(ctx, sb, none); !errors.As(err, &inv) || inv.Field != "egress" {
		t.Errorf("set egress: %v, want an invalid egress", err)
	}
	plain, err := b.e.Create(ctx, oneVMSized("debian", 1, 512))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := b.e.SetEgress(ctx, plain, none); err != nil {
		t.Errorf("set egress of a sandbox without a shared NIC: %v", err)
	}
}

// TestSharedVNetOnlyOfSimpleZone (review49d): a listed vnet of a zone
// that is not "simple" (a VLAN, QinQ, VXLAN or EVPN zone bridges its vnet
// to an uplink: a guest's frames leave the node at layer 2, past the
// guard's routed rules: the metadata, LAN and management drops) is
// refused at start and at a create naming it; one of a simple zone is
// taken.
func TestSharedVNetOnlyOfSimpleZone(t *testing.T) {
	ctx := context.Background()
	b := newPoolBed(t, nil, func(o *sandbox.Options) { o.SharedVNets = []string{"lab", "uplink"} })
	for _, err := range []error{b.px.CreateZone(ctx, sandbox.ZoneSpec{ID: "opzone"}), b.px.CreateVNet(ctx, sandbox.VNetSpec{ID: "lab", Zone: "opzone"}),
		b.px.CreateSubnet(ctx, sandbox.SubnetSpec{VNet: "lab", CIDR: "10.88.0.0/24", Gateway: "10.88.0.1"}),
		b.px.CreateZone(ctx, sandbox.ZoneSpec{ID: "opvlan"}), b.px.CreateVNet(ctx, sandbox.VNetSpec{ID: "uplink", Zone: "opvlan"}),
		b.px.CreateSubnet(ctx, sandbox.SubnetSpec{VNet: "uplink", CIDR: "10.89.0.0/24", Gateway: "10.89.0.1"})} {
		if err != nil {
			t.Fatal(err)
		}
	}
	b.px.SetZoneType("opvlan", "vlan")
	if err := b.e.CheckSharedVNets(ctx); err == nil || !strings.Contains(err.Error(), "uplink") || !strings.Contains(err.Error(), "vlan") {
		t.Errorf("start check: %v, want vnet uplink refused for its vlan zone", err)
	}
	req := func(vnet string) apitype.CreateRequest {
		r := oneVMSized("debian", 1, 512)
		r.VMs[0].NICs = []apitype.NIC{{Network: "net0"}, {VNet: vnet}}
		r.VMs[0].Networks = []string{"net0", apitype.SharedNetwork(vnet)}
		return r
	}
	var inv *sandbox.InvalidError
	if _, err := b.e.Create(ctx, req("uplink")); !errors.As(err, &inv) || inv.Field != "vms[0].nics[1].vnet" || !strings.Contains(err.Error(), "vlan") {
		t.Errorf("create on the vlan zone's vnet: %v, want an invalid vms[0].nics[1].vnet naming the zone type", err)
	}
	if _, err := b.e.Create(ctx, req("lab")); err != nil {
		t.Errorf("create on the simple zone's vnet: %v", err)
	}
}

// TestSharedVNetZoneWhole (review49d): a listed vnet whose zone has
// another vnet the operator did not list is refused (the guard lets a
// zone's vnets reach each other through the node, so a guest on the shared
// one would reach the other); listing both takes them.
func TestSharedVNetZoneWhole(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		listed []string
		refuse bool
	}{{[]string{"lab"}, true}, {[]string{"lab", "secret"}, false}} {
		b := newPoolBed(t, nil, func(o *sandbox.Options) { o.SharedVNets = tc.listed })
		for _, err := range []error{b.px.CreateZone(ctx, sandbox.ZoneSpec{ID: "opzone"}),
			b.px.CreateVNet(ctx, sandbox.VNetSpec{ID: "lab", Zone: "opzone"}), b.px.CreateVNet(ctx, sandbox.VNetSpec{ID: "secret", Zone: "opzone"}),
			b.px.CreateSubnet(ctx, sandbox.SubnetSpec{VNet: "lab", CIDR: "10.88.0.0/24", Gateway: "10.88.0.1"}),
			b.px.CreateSubnet(ctx, sandbox.SubnetSpec{VNet: "secret", CIDR: "10.87.0.0/24", Gateway: "10.87.0.1"})} {
			if err != nil {
				t.Fatal(err)
			}
		}
		err := b.e.CheckSharedVNets(ctx)
		if tc.refuse != (err != nil) || (err != nil && !strings.Contains(err.Error(), "secret")) {
			t.Errorf("listed %v: start check %v, want refused %v naming secret", tc.listed, err, tc.refuse)
		}
		r := oneVMSized("debian", 1, 512)
		r.VMs[0].NICs = []apitype.NIC{{Network: "net0"}, {VNet: "lab"}}
		r.VMs[0].Networks = []string{"net0", apitype.SharedNetwork("lab")}
		_, err = b.e.Create(ctx, r)
		var inv *sandbox.InvalidError
		if tc.refuse && (!errors.As(err, &inv) || inv.Field != "vms[0].nics[1].vnet") || !tc.refuse && err != nil {
			t.Errorf("listed %v: create %v, want refused %v", tc.listed, err, tc.refuse)
		}
	}
}

// TestCheckOfSharedFirstNICIsConflict: the containment check of a member
// whose first NIC is on a shared vnet (its plan's gateway and subnet are a
// sandbox network's) is refused as a conflict naming the vnet, before the
// checker runs, while its sibling with a sandbox network first is checked.
// A check asked of no VM passes over that member (review 51b: a reference
// config's VM whose first vnet_alias is none of its sdn_config's is such
// a member, listed first, and the check of no VM ran from it: 409), and
// CheckIO, which the API asks first, refuses it too.
func TestCheckOfSharedFirstNICIsConflict(t *testing.T) {
	ctx := context.Background()
	ch := &targetChecker{}
	b := newPoolBed(t, nil, func(o *sandbox.Options) {
		o.SharedVNets = []string{"lab"}
		o.Checker = ch
		o.Egress = nil
	})
	for _, err := range []error{b.px.CreateZone(ctx, sandbox.ZoneSpec{ID: "opzone"}), b.px.CreateVNet(ctx, sandbox.VNetSpec{ID: "lab", Zone: "opzone"}),
		b.px.CreateSubnet(ctx, sandbox.SubnetSpec{VNet: "lab", CIDR: "10.88.0.0/24", Gateway: "10.88.0.1"})} {
		if err != nil {
			t.Fatal(err)
		}
	}
	req := oneVMSized("debian", 1, 512)
	second := req.VMs[0]
	second.Name = "b"
	req.VMs[0].Name = "a"
	req.VMs[0].NICs = []apitype.NIC{{VNet: "lab"}, {Network: "net0"}}
	req.VMs[0].Networks = []string{apitype.SharedNetwork("lab"), "net0"}
	req.VMs = append(req.VMs, second)
	sb, err := b.e.Create(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	_, err = b.e.Check(ctx, sb, sb.VMs[0])
	if !errors.Is(err, sandbox.ErrConflict) || !strings.Contains(err.Error(), "shared vnet lab") {
		t.Fatalf("check of a member whose first NIC is shared: %v, want a conflict naming the vnet", err)
	}
	if ch.got.VM.Name != "" {
		t.Errorf("the checker ran for %q", ch.got.VM.Name)
	}
	if _, err := b.e.Check(ctx, sb, sb.VMs[1]); err != nil || ch.got.VM.Name != "b" {
		t.Errorf("check of the sibling on net0: %v (checked %q)", err, ch.got.VM.Name)
	}
	if got := b.e.FirstCheckVM(sb.ID); got != "b" {
		t.Errorf("the check of no member runs from %q, want b (a's first NIC is on the shared vnet lab)", got)
	}
	if err := sandbox.CheckIO(sb.VMs[0]); !errors.Is(err, sandbox.ErrConflict) || !strings.Contains(err.Error(), "shared vnet lab") {
		t.Errorf("CheckIO of a: %v, want a conflict naming the shared vnet", err)
	}
	if err := sandbox.CheckIO(sb.VMs[1]); err != nil {
		t.Errorf("CheckIO of b: %v", err)
	}
}
