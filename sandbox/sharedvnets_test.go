package sandbox_test

import (
	"context"
	"errors"
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
