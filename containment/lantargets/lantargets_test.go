package lantargets

import (
	"net/netip"
	"strings"
	"testing"

	"github.com/pve-inspect/pve-inspect/internal/testkit"
)

func TestDiscoverInNamespace(t *testing.T) {
	n := testkit.NewNetNS(t, "plt")
	for _, c := range [][]string{
		{"link", "add", "eth0", "type", "bridge"}, {"link", "set", "eth0", "up"},
		{"addr", "add", "192.168.50.2/24", "dev", "eth0"},
		{"route", "add", "default", "via", "192.168.50.1"},
		{"neigh", "add", "192.168.50.7", "lladdr", "02:00:00:00:00:07", "dev", "eth0", "nud", "permanent"},
		{"link", "add", "vneta", "type", "bridge"}, {"link", "set", "vneta", "up"},
		{"addr", "add", "10.10.1.1/24", "dev", "vneta"},
		{"neigh", "add", "10.10.1.101", "lladdr", "02:00:00:00:01:01", "dev", "vneta", "nud", "permanent"},
	} {
		n.IP(t, c...)
	}
	h := n.Netlink()
	for _, tc := range []struct {
		name    string
		exclude []netip.Prefix
		want    string
	}{
		{"zone subnets excluded", []netip.Prefix{netip.MustParsePrefix("10.10.0.0/16")},
			"192.168.50.1 default gateway; 192.168.50.7 neighbour on eth0; 10.0.0.1 private block 10.0.0.0/8; 172.16.0.1 private block 172.16.0.0/12; 192.168.1.1 private block 192.168.0.0/16; 100.64.0.1 private block 100.64.0.0/10"},
		{"a block excluded", []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8")},
			"192.168.50.1 default gateway; 192.168.50.7 neighbour on eth0; 172.16.0.1 private block 172.16.0.0/12; 192.168.1.1 private block 192.168.0.0/16; 100.64.0.1 private block 100.64.0.0/10"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ts, err := Discover(h, tc.exclude)
			if err != nil {
				t.Fatal(err)
			}
			var got []string
			for _, x := range ts {
				got = append(got, x.Addr.String()+" "+x.Reason)
			}
			if strings.Join(got, "; ") != tc.want {
				t.Fatalf("targets\n got %s\nwant %s", strings.Join(got, "; "), tc.want)
			}
			if aps := AddrPorts(ts); len(aps) != len(ts)*len(Ports) {
				t.Fatalf("%d addr:ports for %d targets", len(aps), len(ts))
			}
		})
	}
}
