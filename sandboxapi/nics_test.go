package sandboxapi

import (
	"fmt"
	"math/rand/v2"
	"net/netip"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// TestValidateNICs: a VM's nics as the create validator takes them: one
// field each refused with its reason, MACs upper-cased, the VM's networks
// filled from its nics, fixed addresses anywhere in the network's cidr
// but its network, broadcast and gateway addresses, in or out of the DHCP
// range (.10 and up), on a network of dhcp off too.
func TestValidateNICs(t *testing.T) {
	off := false
	nets := func() []apitype.NetworkRequest {
		return []apitype.NetworkRequest{{Name: "lan", CIDR: "10.20.0.0/24"}, {Name: "wan"}, {Name: "dark", CIDR: "10.21.0.0/24", DHCP: &off}}
	}
	vm := func(nics ...apitype.NIC) apitype.VMRequest { return apitype.VMRequest{Template: "debian", NICs: nics} }
	for _, tc := range []struct {
		name  string
		vms   []apitype.VMRequest
		field string // "" accepted
		nets  [][]string
		macs  [][]string
	}{
		{"networks only", []apitype.VMRequest{{Template: "debian", Networks: []string{"wan"}}}, "", [][]string{{"wan"}}, [][]string{nil}},
		{"nics without anything fixed", []apitype.VMRequest{vm(apitype.NIC{Network: "wan"}, apitype.NIC{Network: "lan"})}, "", [][]string{{"wan", "lan"}}, [][]string{{"", ""}}},
		{"fixed MACs, any case, and addresses in and out of the DHCP range", []apitype.VMRequest{
			vm(apitype.NIC{Network: "lan", MAC: "52:54:00:12:34:56", IPv4: "10.20.0.2"}, apitype.NIC{Network: "wan", MAC: "bc:24:11:aa:bb:cc"}),
			vm(apitype.NIC{Network: "lan", IPv4: "10.20.0.10"}), vm(apitype.NIC{Network: "lan", IPv4: "10.20.0.254"}),
		}, "", [][]string{{"lan", "wan"}, {"lan"}, {"lan"}}, [][]string{{"52:54:00:12:34:56", "BC:24:11:AA:BB:CC"}, {""}, {""}}},
		{"networks and nics", []apitype.VMRequest{{Template: "debian", Networks: []string{"lan"}, NICs: []apitype.NIC{{Network: "lan"}}}}, "vms[0].nics", nil, nil},
		{"too many nics", []apitype.VMRequest{vm(slices.Repeat([]apitype.NIC{{Network: "lan"}}, maxNetworks+1)...)}, "vms[0].nics", nil, nil},
		{"unknown network", []apitype.VMRequest{vm(apitype.NIC{Network: "lan"}, apitype.NIC{Network: "dmz"})}, "vms[0].nics[1].network", nil, nil},
		{"MAC with the group bit", []apitype.VMRequest{vm(apitype.NIC{Network: "lan", MAC: "01:00:5e:00:00:01"})}, "vms[0].nics[0].mac", nil, nil},
		{"MAC all zeros", []apitype.VMRequest{vm(apitype.NIC{Network: "lan", MAC: "00:00:00:00:00:00"})}, "vms[0].nics[0].mac", nil, nil},
		{"MAC with dashes", []apitype.VMRequest{vm(apitype.NIC{Network: "lan", MAC: "02-00-00-00-00-01"})}, "vms[0].nics[0].mac", nil, nil},
		{"MAC twice, in two cases", []apitype.VMRequest{vm(apitype.NIC{Network: "lan", MAC: "02:00:00:00:00:0a"}), vm(apitype.NIC{Network: "wan", MAC: "02:00:00:00:00:0A"})}, "vms[1].nics[0].mac", nil, nil},
		{"address not IPv4", []apitype.VMRequest{vm(apitype.NIC{Network: "lan", IPv4: "::ffff:10.20.0.5"})}, "vms[0].nics[0].ipv4", nil, nil},
		{"address with a leading zero", []apitype.VMRequest{vm(apitype.NIC{Network: "lan", IPv4: "10.20.0.05"})}, "vms[0].nics[0].ipv4", nil, nil},
		{"address on an auto network", []apitype.VMRequest{vm(apitype.NIC{Network: "wan", IPv4: "10.20.0.5"})}, "vms[0].nics[0].ipv4", nil, nil},
		// dhcp off is a subnet without a dhcp-range, whose MAC mappings a
		// node's zone dnsmasq serves (pve-network Vnets.pm add_dhcp_mapping)
		{"address on a network without DHCP", []apitype.VMRequest{vm(apitype.NIC{Network: "dark", IPv4: "10.21.0.5"}), vm(apitype.NIC{Network: "dark"})}, "", [][]string{{"dark"}, {"dark"}}, [][]string{{""}, {""}}},
		{"the gateway of a network without DHCP", []apitype.VMRequest{vm(apitype.NIC{Network: "dark", IPv4: "10.21.0.1"})}, "vms[0].nics[0].ipv4", nil, nil},
		{"the broadcast address of a network without DHCP", []apitype.VMRequest{vm(apitype.NIC{Network: "dark", IPv4: "10.21.0.255"})}, "vms[0].nics[0].ipv4", nil, nil},
		{"outside the cidr of a network without DHCP", []apitype.VMRequest{vm(apitype.NIC{Network: "dark", IPv4: "10.20.0.5"})}, "vms[0].nics[0].ipv4", nil, nil},
		{"an address twice on a network without DHCP", []apitype.VMRequest{vm(apitype.NIC{Network: "dark", IPv4: "10.21.0.5"}), vm(apitype.NIC{Network: "dark", IPv4: "10.21.0.5"})}, "vms[1].nics[0].ipv4", nil, nil},
		{"address outside the cidr", []apitype.VMRequest{vm(apitype.NIC{Network: "lan", IPv4: "10.21.0.5"})}, "vms[0].nics[0].ipv4", nil, nil},
		{"the network address", []apitype.VMRequest{vm(apitype.NIC{Network: "lan", IPv4: "10.20.0.0"})}, "vms[0].nics[0].ipv4", nil, nil},
		{"the broadcast address", []apitype.VMRequest{vm(apitype.NIC{Network: "lan", IPv4: "10.20.0.255"})}, "vms[0].nics[0].ipv4", nil, nil},
		{"the gateway", []apitype.VMRequest{vm(apitype.NIC{Network: "lan", IPv4: "10.20.0.1"})}, "vms[0].nics[0].ipv4", nil, nil},
		{"a container on networks", []apitype.VMRequest{{Template: "ct", Kind: apitype.KindLXC, Networks: []string{"lan"}}}, "", [][]string{{"lan"}}, [][]string{nil}},
		{"a container on nics without anything fixed", []apitype.VMRequest{{Template: "ct", Kind: apitype.KindLXC, NICs: []apitype.NIC{{Network: "lan"}}}}, "", [][]string{{"lan"}}, [][]string{{""}}},
		{"a container with a fixed address", []apitype.VMRequest{{Template: "ct", Kind: apitype.KindLXC, NICs: []apitype.NIC{{Network: "lan", IPv4: "10.20.0.5"}}}}, "vms[0].nics", nil, nil},
		{"a container with a fixed MAC", []apitype.VMRequest{{Template: "ct", Kind: apitype.KindLXC, NICs: []apitype.NIC{{Network: "lan", MAC: "02:00:00:00:00:01"}}}}, "vms[0].nics", nil, nil},
		{"a container with disk_gib", []apitype.VMRequest{{Template: "ct", Kind: apitype.KindLXC, DiskGiB: 8}}, "vms[0].disk_gib", nil, nil},
		{"an unknown kind", []apitype.VMRequest{{Template: "ct", Kind: "kvm"}}, "vms[0].kind", nil, nil},
		{"address twice", []apitype.VMRequest{vm(apitype.NIC{Network: "lan", IPv4: "10.20.0.7"}), vm(apitype.NIC{Network: "lan", IPv4: "10.20.0.7"})}, "vms[1].nics[0].ipv4", nil, nil},
		// shared vnets ([api] shared_vnets): named by id or alias, the
		// engine says whether the node shares it (sandbox sharedvnets.go)
		{"a NIC on a shared vnet, by id and by alias", []apitype.VMRequest{vm(apitype.NIC{Network: "lan"}, apitype.NIC{VNet: "lab"}, apitype.NIC{VNet: "lab network (b)"})}, "",
			[][]string{{"lan", "vnet:lab", "vnet:lab network (b)"}}, [][]string{{"", "", ""}}},
		{"a container on a shared vnet", []apitype.VMRequest{{Template: "ct", Kind: apitype.KindLXC, NICs: []apitype.NIC{{VNet: "lab"}}}}, "", [][]string{{"vnet:lab"}}, [][]string{{""}}},
		{"network and vnet", []apitype.VMRequest{vm(apitype.NIC{Network: "lan", VNet: "lab"})}, "vms[0].nics[0].network", nil, nil},
		{"neither network nor vnet", []apitype.VMRequest{vm(apitype.NIC{})}, "vms[0].nics[0].network", nil, nil},
		{"a fixed MAC on a shared vnet", []apitype.VMRequest{vm(apitype.NIC{VNet: "lab", MAC: "02:00:00:00:00:01"})}, "vms[0].nics[0].mac", nil, nil},
		{"a fixed address on a shared vnet", []apitype.VMRequest{vm(apitype.NIC{VNet: "lab", IPv4: "10.20.0.5"})}, "vms[0].nics[0].ipv4", nil, nil},
		{"a vnet with a control character", []apitype.VMRequest{vm(apitype.NIC{VNet: "lab\n"})}, "vms[0].nics[0].vnet", nil, nil},
		{"a vnet with a leading space", []apitype.VMRequest{vm(apitype.NIC{VNet: " lab"})}, "vms[0].nics[0].vnet", nil, nil},
		{"a vnet too long", []apitype.VMRequest{vm(apitype.NIC{VNet: strings.Repeat("a", maxVNetChars+1)})}, "vms[0].nics[0].vnet", nil, nil},
		{"networks naming a shared vnet", []apitype.VMRequest{{Template: "debian", Networks: []string{"vnet:lab"}}}, "vms[0].networks", nil, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := apitype.CreateRequest{VMs: tc.vms, Networks: nets()}
			for i := range c.VMs {
				c.VMs[i].Name = fmt.Sprintf("v%d", i)
			}
			if refusedAt(t, validateCreate(&c, 3600, 86400), tc.field) {
				return
			}
			for i, v := range c.VMs {
				if !slices.Equal(v.Networks, tc.nets[i]) {
					t.Errorf("vm %d: networks %v, want %v", i, v.Networks, tc.nets[i])
				}
				var macs []string
				for _, n := range v.NICs {
					macs = append(macs, n.MAC)
				}
				if !slices.Equal(macs, tc.macs[i]) {
					t.Errorf("vm %d: MACs %q, want %q", i, macs, tc.macs[i])
				}
			}
		})
	}
}

// randomMACs are MAC candidates: mostly well-formed with random digits and
// case (both group bit values), some corrupted, and extra.
func randomMACs(seed uint64, extra ...string) []string {
	r := rand.New(rand.NewPCG(seed, 37))
	const hex = "0123456789abcdefABCDEF"
	out := append([]string{}, extra...)
	for range 3000 {
		var b strings.Builder
		for i := range 6 {
			if i > 0 {
				b.WriteByte(':')
			}
			b.WriteByte(hex[r.IntN(len(hex))])
			b.WriteByte(hex[r.IntN(len(hex))])
		}
		s := []byte(b.String())
		if r.IntN(4) == 0 { // corrupt one character
			s[r.IntN(len(s))] = "g-:. 0"[r.IntN(6)]
		}
		out = append(out, string(s))
	}
	return out
}

// TestOpenAPINICPatterns: the document's patterns of a NIC's network, MAC
// and fixed address match exactly what the validator accepts (the address
// on a network of 10.20.0.0/16, the rest of its rule said in words: inside
// the cidr, not its network, broadcast or gateway address); the nics bound
// is exact.
func TestOpenAPINICPatterns(t *testing.T) {
	nicAccepts := func(n apitype.NIC, cidr string) bool {
		return createAccepts(func(c *apitype.CreateRequest) {
			c.Networks = []apitype.NetworkRequest{{Name: n.Network, CIDR: cidr}}
			c.VMs[0].NICs = []apitype.NIC{n}
		})
	}
	lan := netip.MustParsePrefix("10.20.0.0/16")
	usable := func(s string) bool {
		ip, err := netip.ParseAddr(s)
		return err == nil && lan.Contains(ip) && ip.String() != "10.20.0.0" && ip.String() != "10.20.255.255" && ip.String() != "10.20.0.1"
	}
	var addrs []string
	r := rand.New(rand.NewPCG(5, 37))
	for range 3000 {
		addrs = append(addrs, fmt.Sprintf("10.%d.%d.%d", []int{20, 21, 0}[r.IntN(3)], r.IntN(300), r.IntN(300)))
	}
	addrs = append(addrs, "", "10.20.0.0", "10.20.0.1", "10.20.0.2", "10.20.255.255", "10.20.255.254", "010.20.0.5", "10.20.0.05",
		" 10.20.0.5", "10.20.0.5/32", "::ffff:10.20.0.5", "10.20.0", "10.20.0.5.", "fd00::5")
	for _, tc := range []struct {
		prop    string
		cands   []string
		allowed func(string) bool // beyond the pattern; nil: nothing
		accepts func(string) bool
	}{
		// empty only with a vnet, the description says
		{"NIC.network", randomStrings(21, "abz09-_.A/", 36, "", "a", "a-", strings.Repeat("a", 32), strings.Repeat("a", 33)), func(s string) bool { return s != "" },
			func(s string) bool { return nicAccepts(apitype.NIC{Network: s}, "auto") }},
		{"NIC.mac", randomMACs(22, "", "00:00:00:00:00:00", "01:00:00:00:00:00", "02:00:00:00:00:00", "52:54:00:12:34:56",
			"bc:24:11:AA:bb:cc", "02-00-00-00-00-01", "0200.0000.0001", "02:00:00:00:00:0g", "02:00:00:00:00", "02:00:00:00:00:00:00"), nil,
			func(s string) bool { return nicAccepts(apitype.NIC{Network: "lan", MAC: s}, "auto") }},
		{"NIC.ipv4", addrs, func(s string) bool { return s == "" || usable(s) },
			func(s string) bool { return nicAccepts(apitype.NIC{Network: "lan", IPv4: s}, lan.String()) }},
	} {
		kw := rule(t, tc.prop)
		re := regexp.MustCompile(kw["pattern"].(string))
		accepted := 0
		for _, s := range tc.cands {
			allowed := re.MatchString(s) && !notEnum(kw, s) && (tc.allowed == nil || tc.allowed(s))
			got := tc.accepts(s)
			if got != allowed {
				t.Errorf("%s %q: the document (and its words) allow it %v, the validator accepts it %v", tc.prop, s, allowed, got)
			}
			if got && s != "" {
				accepted++
			}
		}
		if accepted < 50 {
			t.Errorf("%s: only %d candidates accepted: the candidates miss the valid ones", tc.prop, accepted)
		}
	}
	hi := rule(t, "VMRequest.nics")["maxItems"].(int)
	nics := func(n int) func(*apitype.CreateRequest) {
		return func(c *apitype.CreateRequest) { c.VMs[0].NICs = slices.Repeat([]apitype.NIC{{Network: "net0"}}, n) }
	}
	if !createAccepts(nics(hi)) || createAccepts(nics(hi+1)) {
		t.Errorf("VMRequest.nics maxItems %d is not the validator's bound", hi)
	}
}

// refusedAt fails t unless pr is an invalid-request of field, or, field
// empty, nil; it reports whether the create was refused.
func refusedAt(t *testing.T, pr *apitype.Problem, field string) bool {
	t.Helper()
	if field != "" {
		if pr == nil || pr.Field != field || pr.Type != apitype.ProblemInvalidRequest {
			t.Fatalf("%+v, want invalid-request of field %s", pr, field)
		}
		return true
	}
	if pr != nil {
		t.Fatalf("refused: %+v", pr)
	}
	return false
}
