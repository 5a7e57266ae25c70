package sandboxapi

import (
	"strings"
	"testing"

	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// TestDHCPRangesEdgesReview49a: review 49a's edges of a network's
// dhcp_ranges: the whole host part of a /28 and of a /16 is a range; a
// non-canonical or non-IPv4 end, and JSON nulls, unknown keys or a
// missing end are refused.
func TestDHCPRangesEdgesReview49a(t *testing.T) {
	r := func(a, b string) apitype.DHCPRange { return apitype.DHCPRange{Start: a, End: b} }
	for _, tc := range []struct {
		name, cidr string
		rs         []apitype.DHCPRange
		field      string
	}{
		{"a /28's every host but the gateway", "10.1.2.16/28", []apitype.DHCPRange{r("10.1.2.18", "10.1.2.30")}, ""},
		{"a /28's broadcast", "10.1.2.16/28", []apitype.DHCPRange{r("10.1.2.18", "10.1.2.31")}, "networks[0].dhcp_ranges[0].end"},
		{"a /16's every host but the gateway", "10.9.0.0/16", []apitype.DHCPRange{r("10.9.0.2", "10.9.255.254")}, ""},
		{"one address, start==end", "10.9.0.0/24", []apitype.DHCPRange{r("10.9.0.7", "10.9.0.7")}, ""},
		{"adjacent, not overlapping", "10.9.0.0/24", []apitype.DHCPRange{r("10.9.0.7", "10.9.0.8"), r("10.9.0.9", "10.9.0.9")}, ""},
		{"same range twice", "10.9.0.0/24", []apitype.DHCPRange{r("10.9.0.7", "10.9.0.8"), r("10.9.0.7", "10.9.0.8")}, "networks[0].dhcp_ranges[1]"},
		{"one inside another", "10.9.0.0/24", []apitype.DHCPRange{r("10.9.0.2", "10.9.0.200"), r("10.9.0.7", "10.9.0.8")}, "networks[0].dhcp_ranges[1]"},
		{"octal-looking", "10.9.0.0/24", []apitype.DHCPRange{r("010.9.0.7", "10.9.0.8")}, "networks[0].dhcp_ranges[0].start"},
		{"with a zone", "10.9.0.0/24", []apitype.DHCPRange{r("10.9.0.7%eth0", "10.9.0.8")}, "networks[0].dhcp_ranges[0].start"},
		{"mapped v6", "10.9.0.0/24", []apitype.DHCPRange{r("::ffff:10.9.0.7", "10.9.0.8")}, "networks[0].dhcp_ranges[0].start"},
		{"spaces", "10.9.0.0/24", []apitype.DHCPRange{r(" 10.9.0.7", "10.9.0.8")}, "networks[0].dhcp_ranges[0].start"},
		{"empty end", "10.9.0.0/24", []apitype.DHCPRange{r("10.9.0.7", "")}, "networks[0].dhcp_ranges[0].end"},
		{"a comma (Proxmox's property string)", "10.9.0.0/24", []apitype.DHCPRange{r("10.9.0.7,end-address=10.9.0.9", "10.9.0.8")}, "networks[0].dhcp_ranges[0].start"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := apitype.CreateRequest{VMs: []apitype.VMRequest{{Template: "debian", Networks: []string{"lan"}}},
				Networks: []apitype.NetworkRequest{{Name: "lan", CIDR: tc.cidr, DHCPRanges: tc.rs}}}
			pr := validateCreate(&c, 3600, 86400)
			if tc.field == "" && pr != nil || tc.field != "" && (pr == nil || pr.Field != tc.field) {
				t.Errorf("%+v, want field %q", pr, tc.field)
			}
		})
	}
	for _, body := range []string{
		`{"vms":[{"template":"debian"}],"networks":[{"name":"net0","cidr":"10.9.0.0/24","dhcp_ranges":null}]}`,
		`{"vms":[{"template":"debian"}],"networks":[{"name":"net0","cidr":"10.9.0.0/24","dhcp_ranges":[null]}]}`,
		`{"vms":[{"template":"debian"}],"networks":[{"name":"net0","cidr":"10.9.0.0/24","dhcp_ranges":[{"start":"10.9.0.5","end":null}]}]}`,
		`{"vms":[{"template":"debian"}],"networks":[{"name":"net0","cidr":"10.9.0.0/24","dhcp_ranges":[{"start":"10.9.0.5","end":"10.9.0.6","x":1}]}]}`,
		`{"vms":[{"template":"debian"}],"networks":[{"name":"net0","cidr":"10.9.0.0/24","dhcp_ranges":{"start":"10.9.0.5","end":"10.9.0.6"}}]}`,
	} {
		var c apitype.CreateRequest
		if pr := decodeStrict(strings.NewReader(body), 1<<20, &c); pr == nil {
			t.Errorf("%s: decoded, want refused", body)
		}
	}
}
