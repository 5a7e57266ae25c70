package sandbox

import (
	"strings"
	"testing"

	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// TestStateNoNetworkAfterOlderRewrite (review 51b): a daemon older than
// no_network reads a VM of one with its networks [] and writes the file
// again without the flag (it drops the field it does not know). Read back
// by this daemon, the VM is still one without any NIC: every VM a daemon
// ever created on a network has at least one in its record (the API's
// create fills in the first network), so an empty list written as [] is a
// VM of no_network. A VM of networks absent (null) is not taken as one.
func TestStateNoNetworkAfterOlderRewrite(t *testing.T) {
	sb := apitype.Sandbox{ID: "sbnonet", Networks: []apitype.Network{{Name: "net0"}}, VMs: []apitype.VM{
		{Name: "vault", VMID: 101, Networks: []string{}, NoNetwork: true},
		{Name: "box", VMID: 102, Networks: []string{"net0"}},
	}}
	b, err := encodeState("pve", []apitype.Sandbox{sb}, nil)
	if err != nil {
		t.Fatal(err)
	}
	// the older daemon's rewrite: the same file without the flag
	older := strings.ReplaceAll(string(b), `"no_network": true`, `"no_network": false`)
	if strings.Contains(older, `"no_network": true`) {
		t.Fatal("the flag is still in the rewritten file")
	}
	_, got, _, err := decodeState([]byte(older))
	if err != nil {
		t.Fatal(err)
	}
	if vms := got[0].VMs; !vms[0].NoNetwork || vms[1].NoNetwork || vms[0].Networks == nil {
		t.Errorf("after an older daemon's rewrite: vault no_network %v (networks %#v), box %v; want vault's flag back, box's off", vms[0].NoNetwork, vms[0].Networks, vms[1].NoNetwork)
	}
	null := strings.ReplaceAll(older, `"networks": []`, `"networks": null`)
	if _, got, _, err = decodeState([]byte(null)); err != nil {
		t.Fatal(err)
	}
	if got[0].VMs[0].NoNetwork {
		t.Error("a VM of networks null was taken as one of no_network")
	}
}
