package kvm

import (
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	"libvirt.org/go/libvirtxml"

	"github.com/pve-inspect/pve-inspect/internal/testkit"
)

func testSpec(accel string) DomainSpec {
	return DomainSpec{
		Name: "pve1", CPUs: 4, MemoryMiB: 8192, Accel: accel, Pool: DefaultPool,
		Disk: diskVol("pve1"), Seed: seedVol("pve1"), Network: DefaultNetwork, MAC: "52:54:00:12:34:56",
		SerialLog: "/var/log/libvirt/qemu/pve1-serial.log",
		Meta: NodeMeta{InstanceID: "pve1-0123456789ab", Network: DefaultNetwork, Address: "192.168.150.2",
			MAC: "52:54:00:12:34:56", Created: time.Date(2026, 12, 1, 12, 0, 0, 0, time.UTC)},
	}
}

// TestXMLGolden compares the generated libvirt XML with golden files.
func TestXMLGolden(t *testing.T) {
	pool, err := PoolXML(DefaultPool, DefaultPoolDir)
	if err != nil {
		t.Fatal(err)
	}
	net, err := NetworkSpec{Name: DefaultNetwork, Bridge: DefaultBridge, Subnet: netip.MustParsePrefix(DefaultSubnet)}.Network()
	if err != nil {
		t.Fatal(err)
	}
	type marshaler interface{ Marshal() (string, error) }
	cases := []struct {
		file string
		doc  func() (marshaler, error)
	}{
		{"domain-kvm.xml", func() (marshaler, error) { return testSpec("kvm").Domain() }},
		{"domain-tcg.xml", func() (marshaler, error) { return testSpec("tcg").Domain() }},
		{"network.xml", func() (marshaler, error) { return net, nil }},
		{"pool.xml", func() (marshaler, error) { return pool, nil }},
		{"overlay-volume.xml", func() (marshaler, error) {
			return overlayXML("pve1.qcow2", "/var/lib/libvirt/images/pve-nested/debian-13.qcow2", 64), nil
		}},
	}
	for _, tc := range cases {
		t.Run(tc.file, func(t *testing.T) {
			d, err := tc.doc()
			if err != nil {
				t.Fatal(err)
			}
			x, err := d.Marshal()
			if err != nil {
				t.Fatal(err)
			}
			testkit.Golden(t, tc.file, []byte(x+"\n"))
		})
	}
}

// TestMetadataRoundTrip reads back the tag in both forms: as written into
// the domain and as GetMetadata returns it (without the namespace).
func TestMetadataRoundTrip(t *testing.T) {
	want := testSpec("kvm").Meta
	x, err := want.xml()
	if err != nil {
		t.Fatal(err)
	}
	stripped := strings.NewReplacer("pvenested:", "", ` xmlns:pvenested="`+MetadataURI+`"`, "").Replace(x)
	for _, s := range []string{x, stripped} {
		got, err := ParseNodeMeta(s)
		if err != nil {
			t.Fatalf("%s: %v", s, err)
		}
		got.XMLName = want.XMLName
		if got != want {
			t.Errorf("read %+v, want %+v", got, want)
		}
	}
}

func TestParseNodeMetaRejects(t *testing.T) {
	ok := `<node><instance-id>pve1-0123456789ab</instance-id><network>pve-nested</network><address>192.168.150.2</address><mac>52:54:00:12:34:56</mac><created>2026-12-01T12:00:00Z</created></node>`
	if _, err := ParseNodeMeta(ok); err != nil {
		t.Fatal(err)
	}
	for name, bad := range map[string]string{
		"other namespace": strings.Replace(ok, "<node>", `<node xmlns="urn:other">`, 1),
		"other element":   strings.ReplaceAll(ok, "node>", "nodes>"),
		"instance id":     strings.Replace(ok, "pve1-0123456789ab", "../x", 1),
		"network":         strings.Replace(ok, ">pve-nested<", ">pve nested<", 1),
		"address":         strings.Replace(ok, "192.168.150.2", "fe80::1", 1),
		"mac":             strings.Replace(ok, "52:54:00:12:34:56", "52:54:00:12:34", 1),
		"cloned-from":     strings.Replace(ok, "</created>", "</created><cloned-from>A B</cloned-from>", 1),
		"too long":        ok + strings.Repeat(" ", maxMeta),
		"not xml":         "<node",
	} {
		if _, err := ParseNodeMeta(bad); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestDomainSpecRejects(t *testing.T) {
	for name, mod := range map[string]func(*DomainSpec){
		"name":       func(s *DomainSpec) { s.Name = "Pve_1" },
		"cpus":       func(s *DomainSpec) { s.CPUs = 0 },
		"memory":     func(s *DomainSpec) { s.MemoryMiB = 128 },
		"accel":      func(s *DomainSpec) { s.Accel = "hvf" },
		"network":    func(s *DomainSpec) { s.Network = "a'b" },
		"mac":        func(s *DomainSpec) { s.MAC = "52:54:00:12:34:5G" },
		"serial log": func(s *DomainSpec) { s.SerialLog = "relative.log" },
	} {
		s := testSpec("kvm")
		mod(&s)
		if _, err := s.Domain(); err == nil {
			t.Errorf("%s: accepted", name)
		}
	}
}

func TestNetworkSubnets(t *testing.T) {
	for _, tc := range []struct {
		subnet string
		ok     bool
	}{
		{"192.168.150.0/24", true}, {"10.20.0.0/16", true}, {"10.20.30.16/28", true},
		{"192.168.150.1/24", false}, {"10.0.0.0/8", false}, {"10.20.30.0/29", false}, {"fd00::/64", false},
	} {
		_, err := NetworkSpec{Name: "n", Bridge: "br", Subnet: netip.MustParsePrefix(tc.subnet)}.Network()
		if (err == nil) != tc.ok || (err != nil && !errors.Is(err, ErrSubnet)) {
			t.Errorf("%s: %v", tc.subnet, err)
		}
	}
}

func TestFreeAddress(t *testing.T) {
	host := func(ip string) libvirtxml.NetworkDHCPHost { return libvirtxml.NetworkDHCPHost{IP: ip} }
	for _, tc := range []struct {
		name    string
		ip      libvirtxml.NetworkIP
		want    string
		wantErr string
	}{
		{"empty", libvirtxml.NetworkIP{Address: "192.168.150.1", Netmask: "255.255.255.0", DHCP: &libvirtxml.NetworkDHCP{}}, "192.168.150.2", ""},
		{"skips taken", libvirtxml.NetworkIP{Address: "192.168.150.1", Prefix: 24, DHCP: &libvirtxml.NetworkDHCP{Hosts: []libvirtxml.NetworkDHCPHost{host("192.168.150.2"), host("192.168.150.3")}}}, "192.168.150.4", ""},
		{"full /28", libvirtxml.NetworkIP{Address: "10.0.0.1", Prefix: 28, DHCP: &libvirtxml.NetworkDHCP{Hosts: []libvirtxml.NetworkDHCPHost{
			host("10.0.0.2"), host("10.0.0.3"), host("10.0.0.4"), host("10.0.0.5"), host("10.0.0.6"), host("10.0.0.7")}}}, "", "no free address"},
		{"no dhcp", libvirtxml.NetworkIP{Address: "10.0.0.1", Prefix: 24}, "", "DHCP"},
		{"too big", libvirtxml.NetworkIP{Address: "10.0.0.1", Prefix: 8, DHCP: &libvirtxml.NetworkDHCP{}}, "", "subnet"},
	} {
		got, err := freeAddress(&libvirtxml.Network{IPs: []libvirtxml.NetworkIP{tc.ip}})
		if tc.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Errorf("%s: got %v %v, want error %q", tc.name, got, err, tc.wantErr)
			}
			continue
		}
		if err != nil || got.String() != tc.want {
			t.Errorf("%s: got %v %v, want %s", tc.name, got, err, tc.want)
		}
	}
}

func TestConfigDefaults(t *testing.T) {
	c := Config{Pool: "mine"}
	c.setDefaults()
	want := Config{Network: DefaultNetwork, Bridge: DefaultBridge, Subnet: netip.MustParsePrefix(DefaultSubnet),
		Pool: "mine", PoolDir: DefaultPoolDir, LogDir: DefaultLogDir, SysRoot: "/"}
	if c.Network != want.Network || c.Bridge != want.Bridge || c.Subnet != want.Subnet || c.Pool != want.Pool ||
		c.PoolDir != want.PoolDir || c.LogDir != want.LogDir || c.SysRoot != want.SysRoot {
		t.Errorf("got %+v, want %+v", c, want)
	}
}
