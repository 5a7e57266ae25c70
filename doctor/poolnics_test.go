package doctor

import (
	"context"
	"strings"
	"testing"

	"github.com/pve-inspect/pve-inspect/pveapi/access"
	"github.com/pve-inspect/pve-inspect/sandbox"
)

// TestPoolNICCheck: a sandbox VM whose NICs are on its own zone's vnets
// passes; a NIC without a bridge (QEMU's user-mode network), a sandbox
// VM's NIC on a host bridge or on another zone's vnet fail; a pool VM
// without a sandbox tag on the template's bridge (a clone being
// configured) warns. A NIC on a vnet the node shares ([api] shared_vnets)
// passes; one on an operator's vnet it does not share fails.
func TestPoolNICCheck(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		tags   []string
		set    map[string]string
		want   Status
		detail string
	}{
		{"its own vnet", []string{"pvei-s-sbaaaaaa"}, nil, Pass, "every NIC on its sandbox's vnets"},
		{"a NIC without a bridge", []string{"pvei-s-sbaaaaaa"}, map[string]string{"net1": "virtio"}, Fail, "has no bridge"},
		{"the host bridge", []string{"pvei-s-sbaaaaaa"}, map[string]string{"net1": "virtio,bridge=vmbr0"}, Fail, "net1 is on vmbr0"},
		{"another zone's vnet", []string{"pvei-s-sbaaaaaa"}, map[string]string{"net1": "virtio,bridge=vbbbbbb0"}, Fail, "a vnet of zone sbbbbbbb"},
		{"no sandbox tag", nil, map[string]string{"net0": "virtio,bridge=vmbr0"}, Warn, "without a sandbox tag"},
		{"a shared vnet", []string{"pvei-s-sbaaaaaa"}, map[string]string{"net1": "virtio,bridge=lab"}, Pass, "every NIC on its sandbox's vnets or a shared vnet"},
		{"an operator vnet not shared", []string{"pvei-s-sbaaaaaa"}, map[string]string{"net1": "virtio,bridge=secret"}, Fail, "a vnet of zone opzone"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			nd := newNode(t)
			must := func(err error) {
				t.Helper()
				if err != nil {
					t.Fatal(err)
				}
			}
			for _, z := range []string{"sbaaaaaa", "sbbbbbbb"} {
				must(nd.root.CreateZone(ctx, sandbox.ZoneSpec{ID: z}))
				must(nd.root.CreateVNet(ctx, sandbox.VNetSpec{ID: "v" + z[2:] + "0", Zone: z}))
			}
			must(nd.root.CreateZone(ctx, sandbox.ZoneSpec{ID: "opzone"}))
			for _, v := range []string{"lab", "secret"} {
				must(nd.root.CreateVNet(ctx, sandbox.VNetSpec{ID: v, Zone: "opzone"}))
			}
			must(nd.root.ApplySDN(ctx))
			nd.n.SharedVNets = []string{"lab"}
			must(nd.root.CloneVM(ctx, sandbox.CloneSpec{Template: templateID, NewID: 101, Name: "pvei-x", Pool: access.DefaultPool}))
			if tc.tags != nil {
				must(nd.root.ConfigureVM(ctx, 101, sandbox.VMConfig{Tags: tc.tags, Cores: 1, MemoryMiB: 512, Bridges: []string{"vaaaaaa0"}}))
			}
			must(nd.root.UpdateVMConfig(ctx, 101, tc.set, nil))
			o := run(t, PoolNICCheck(nd.px, nd.n))
			if o.Status != tc.want || !strings.Contains(o.Detail, tc.detail) {
				t.Errorf("%s: %s %q, want %s with %q", tc.name, o.Status, o.Detail, tc.want, tc.detail)
			}
		})
	}
}
