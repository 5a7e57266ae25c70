package lantargets

import (
	"crypto/rand"
	"encoding/hex"
	"net/netip"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

func TestDiscoverInNamespace(t *testing.T) {
	if os.Geteuid() != 0 {
		if os.Getenv("CI") != "" {
			t.Fatal("test needs root (CI is set, so this is a failure)")
		}
		t.Skip("SKIPPING: test needs root for a network namespace")
	}
	b := make([]byte, 2)
	_, _ = rand.Read(b)
	name := "plt" + hex.EncodeToString(b)
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("%v %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
	for _, c := range [][]string{
		{"link", "add", "eth0", "type", "bridge"}, {"link", "set", "eth0", "up"},
		{"addr", "add", "192.168.50.2/24", "dev", "eth0"},
		{"route", "add", "default", "via", "192.168.50.1"},
		{"neigh", "add", "192.168.50.7", "lladdr", "02:00:00:00:00:07", "dev", "eth0", "nud", "permanent"},
		{"link", "add", "vneta", "type", "bridge"}, {"link", "set", "vneta", "up"},
		{"addr", "add", "10.10.1.1/24", "dev", "vneta"},
		{"neigh", "add", "10.10.1.101", "lladdr", "02:00:00:00:01:01", "dev", "vneta", "nud", "permanent"},
	} {
		if out, err := exec.Command("ip", append([]string{"-n", name}, c...)...).CombinedOutput(); err != nil {
			t.Fatalf("ip %v: %v %s", c, err, out)
		}
	}
	ns, err := netns.GetFromName(name)
	if err != nil {
		t.Fatal(err)
	}
	defer ns.Close()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
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
