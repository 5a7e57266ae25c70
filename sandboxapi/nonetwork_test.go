package sandboxapi

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// TestValidateNoNetwork: a VM of no_network as the create validator takes
// it: its networks left an empty list (never the first network's
// default), beside VMs on networks; it counts on no network's DHCP room
// (one address left for the one VM on the network is enough); networks or
// nics with it are refused, field no_network; a container may be one.
// An empty networks list without it is still the default: the first
// network.
func TestValidateNoNetwork(t *testing.T) {
	lan := func() []apitype.NetworkRequest {
		return []apitype.NetworkRequest{{Name: "lan", CIDR: "10.20.0.0/24", DHCPRanges: []apitype.DHCPRange{{Start: "10.20.0.10", End: "10.20.0.10"}}}}
	}
	for _, tc := range []struct {
		name  string
		vms   []apitype.VMRequest
		field string // "" accepted
	}{
		{"beside a VM on the network", []apitype.VMRequest{{Template: "debian", NoNetwork: true}, {Template: "debian", Networks: []string{"lan"}}}, ""},
		{"beside a VM of the default network", []apitype.VMRequest{{Template: "debian"}, {Template: "debian", NoNetwork: true}}, ""},
		{"a container", []apitype.VMRequest{{Template: "ct", Kind: apitype.KindLXC, NoNetwork: true}, {Template: "debian"}}, ""},
		{"alone", []apitype.VMRequest{{Template: "debian", NoNetwork: true}}, ""},
		{"two on the network of one address (the room counts NICs)", []apitype.VMRequest{{Template: "debian"}, {Template: "debian", Networks: []string{"lan"}}}, "networks[0].dhcp_ranges"},
		{"with networks", []apitype.VMRequest{{Template: "debian", NoNetwork: true, Networks: []string{"lan"}}}, "vms[0].no_network"},
		{"with nics", []apitype.VMRequest{{Template: "debian"}, {Template: "debian", NoNetwork: true, NICs: []apitype.NIC{{Network: "lan"}}}}, "vms[1].no_network"},
		{"with a shared vnet's nic", []apitype.VMRequest{{Template: "debian", NoNetwork: true, NICs: []apitype.NIC{{VNet: "lab"}}}}, "vms[0].no_network"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := apitype.CreateRequest{VMs: tc.vms, Networks: lan()}
			if refusedAt(t, validateCreate(&c, 3600, 86400), tc.field) {
				return
			}
			for i, v := range c.VMs {
				switch {
				case !v.NoNetwork && (len(v.Networks) != 1 || v.Networks[0] != "lan"):
					t.Errorf("vm %d: networks %v, want [lan]", i, v.Networks)
				case v.NoNetwork && (v.Networks == nil || len(v.Networks) != 0 || v.NICs != nil):
					t.Errorf("vm %d of no_network: networks %#v nics %v, want an empty list and none", i, v.Networks, v.NICs)
				}
			}
		})
	}

	// the flag, not an empty list, asks for no NIC: "networks": [] is the
	// default (omitted in JSON, or empty: the first network)
	for body, want := range map[string]bool{
		`{"vms":[{"template":"debian","networks":[]}]}`:                   false,
		`{"vms":[{"template":"debian","nics":[]}]}`:                       false,
		`{"vms":[{"template":"debian","no_network":true}]}`:               true,
		`{"vms":[{"template":"debian","no_network":false}]}`:              false,
		`{"vms":[{"template":"debian","no_network":true,"networks":[]}]}`: true,
	} {
		var c apitype.CreateRequest
		if err := json.NewDecoder(strings.NewReader(body)).Decode(&c); err != nil {
			t.Fatal(err)
		}
		if pr := validateCreate(&c, 3600, 86400); pr != nil {
			t.Fatalf("%s: %+v", body, pr)
		}
		v := c.VMs[0]
		if got := v.NoNetwork && len(v.Networks) == 0; got != want || (!want && (len(v.Networks) != 1 || v.Networks[0] != "net0")) {
			t.Errorf("%s: no_network %v networks %v, want no NIC %v", body, v.NoNetwork, v.Networks, want)
		}
	}
}
