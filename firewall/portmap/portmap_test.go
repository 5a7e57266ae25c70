package portmap

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// netCase is a netN value and the NIC it parses into.
type netCase struct {
	key, value string
	want       string // the MAC; "" = error
	fw         bool
	bridge     string
}

// checkNets runs parse on every case.
func checkNets(t *testing.T, parse func(key, value string) (NIC, error), cases []netCase) {
	for _, tc := range cases {
		t.Run(tc.key+"="+tc.value, func(t *testing.T) {
			n, err := parse(tc.key, tc.value)
			if tc.want == "" {
				if err == nil {
					t.Fatalf("accepted: %+v", n)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if n.MAC.String() != tc.want || n.Firewall != tc.fw || n.Bridge != tc.bridge {
				t.Fatalf("got %+v", n)
			}
		})
	}
}

func TestParseNet(t *testing.T) {
	checkNets(t, ParseNet, []netCase{
		{"net0", "virtio=BC:24:11:00:01:01,bridge=vnet1,firewall=1", "bc:24:11:00:01:01", true, "vnet1"},
		{"net3", "model=e1000,macaddr=BC:24:11:00:01:02,bridge=vmbr0,tag=5", "bc:24:11:00:01:02", false, "vmbr0"},
		{"net1", "e1000=BC:24:11:00:01:03", "bc:24:11:00:01:03", false, ""},
		{"net0", "virtio,bridge=vnet1", "", false, ""},                                // no MAC
		{"net0", "virtio=01:24:11:00:01:01,bridge=vnet1", "", false, ""},              // multicast
		{"net0", "virtio=BC:24:11:00:01:01,e1000=BC:24:11:00:01:02", "", false, ""},   // two models
		{"net0", "virtio=BC:24:11:00:01:01,bridge=vnet1,bridge=vnet2", "", false, ""}, // twice
		{"net0", "virtio=BC:24:11:00:01:01,bridge=vnet 1", "", false, ""},             // bad bridge
		{"net0", "virtio=BC:24:11:00:01:01,firewall=yes", "", false, ""},              // bad bool
		{"net0", "virtio=BC-24-11-00-01-01", "", false, ""},                           // MAC form
		{"netx", "virtio=BC:24:11:00:01:01", "", false, ""},                           // key
		{"net320", "virtio=BC:24:11:00:01:01", "", false, ""},                         // key range
		{"net0", "model=virtio,virtio=BC:24:11:00:01:01", "", false, ""},              // model twice
	})
}

func TestReadNode(t *testing.T) {
	root := t.TempDir()
	write := func(p, s string) {
		t.Helper()
		p = filepath.Join(root, p)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(s), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("etc/pve/qemu-server/101.conf", "boot: order=scsi0\nnet0: virtio=BC:24:11:00:01:01,bridge=vneta,firewall=1\nnet1: virtio=BC:24:11:00:01:09,bridge=vmbr0\nnet2: bogus\n\n[snap1]\nnet0: virtio=BC:24:11:00:0F:0F,bridge=vneta\n")
	write("etc/pve/qemu-server/102.conf", "net0: virtio=BC:24:11:00:01:02,bridge=vneta\n")
	write("etc/pve/lxc/201.conf", "arch: amd64\nhostname: ct201\nlxc.apparmor.profile: unconfined\nnet0: name=eth0,bridge=vneta,firewall=1,hwaddr=BC:24:11:00:02:01,ip=dhcp,type=veth\nnet1: name=eth1,bridge=vmbr0,hwaddr=BC:24:11:00:02:09,type=veth\nunprivileged: 1\n")
	write("etc/pve/lxc/202.conf", "net0: name=eth0,bridge=vneta,hwaddr=BC:24:11:00:02:02,ip=dhcp,type=phys\n")
	write("etc/pve/qemu-server/notes.txt", "net0: virtio=BC:24:11:00:01:03,bridge=vneta\n")
	write("etc/dnsmasq.d/zonea/ethers", "BC:24:11:00:01:01,10.10.1.101\nBC:24:11:00:01:02,[fd00::2]\nnot-a-mac,10.1.1.1\n")
	write("var/lib/misc/dnsmasq.zonea.leases", "1700000000 bc:24:11:00:01:02 10.10.1.150 g102 *\n0 bc:24:11:00:01:01 10.10.1.101 g101 *\n4000000000 bc:24:11:00:01:02 10.10.1.102 g102 01:bc\n0 bc:24:11:00:02:01 10.10.1.201 ct201 *\n1 2 3\nduid 00:01\n5 bc:24:11:00:01:05 10.10.1.105\n")

	p := Paths{Root: root}
	vms, problems, err := p.ReadVMs()
	if err != nil {
		t.Fatal(err)
	}
	// 201 is a container (pve-container's net format); 202's only NIC
	// is of a type pve-container does not have
	if len(vms) != 4 || len(problems) != 2 || !strings.Contains(problems[0], "qemu-server/101.conf: line 4") ||
		!strings.Contains(problems[1], "lxc/202.conf: line 1") || !vms[2].Container || len(vms[2].NICs) != 2 {
		t.Fatalf("vms %+v problems %q", vms, problems)
	}
	leases, problems, err := p.ReadZone("zonea")
	if err != nil {
		t.Fatal(err)
	}
	if len(problems) != 2 {
		t.Fatalf("problems %q", problems)
	}
	now := time.Unix(1800000000, 0)
	ports := Ports(vms, leases, now, []string{"vneta"})
	var got []string
	for _, p := range ports {
		s := p.Name + "=" + p.MAC.String()
		for _, a := range p.IPv4 {
			s += "," + a.String()
		}
		got = append(got, s)
	}
	want := []string{
		"tap101i0=bc:24:11:00:01:01,10.10.1.101",
		"fwpr101p0=bc:24:11:00:01:01,10.10.1.101",
		"tap102i0=bc:24:11:00:01:02,10.10.1.102",  // the expired .150 is gone
		"veth201i0=bc:24:11:00:02:01,10.10.1.201", // a container's veth
		"fwpr201p0=bc:24:11:00:02:01,10.10.1.201",
	}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("ports\n got %v\nwant %v", got, want)
	}
	// a VM's own addresses, from the node's files only: 102's unexpired
	// lease (not the expired .150), none of 105's (no such VM)
	for _, c := range []struct {
		vmid int
		zone string
		want string
		err  bool
	}{
		{101, "zonea", "[10.10.1.101]", false},
		{102, "zonea", "[10.10.1.102]", false},
		{102, "zoneb", "[]", false},
		{201, "zonea", "[10.10.1.201]", false}, // a container's, from etc/pve/lxc
		{105, "zonea", "[]", true},
		{101, "../etc", "[]", true},
	} {
		got, err := p.GuestAddrs(c.vmid, c.zone, now)
		if fmt.Sprint(got) != c.want || (err != nil) != c.err {
			t.Errorf("GuestAddrs(%d, %s) = %v, %v; want %s, error %v", c.vmid, c.zone, got, err, c.want, c.err)
		}
	}
	if _, _, err := p.ReadZone("../etc"); err == nil {
		t.Fatal("ReadZone accepted a path as zone id")
	}
	if l, _, err := p.ReadZone("zoneb"); err != nil || len(l) != 0 {
		t.Fatalf("absent zone: %v %v", l, err)
	}
}

// TestParseCTNet: pve-container's net format (hwaddr, bridge, firewall;
// every part key=value, veth the only type).
func TestParseCTNet(t *testing.T) {
	checkNets(t, ParseCTNet, []netCase{
		{"net0", "name=eth0,bridge=vnet1,firewall=1,hwaddr=BC:24:11:00:02:01,ip=dhcp,type=veth", "bc:24:11:00:02:01", true, "vnet1"},
		{"net2", "name=eth2,hwaddr=BC:24:11:00:02:02,ip=10.0.0.2/24,gw=10.0.0.1,mtu=1400,tag=5", "bc:24:11:00:02:02", false, ""},
		{"net0", "name=eth0,bridge=vnet1,ip=dhcp", "", false, ""},                    // no MAC
		{"net0", "virtio=BC:24:11:00:02:01,bridge=vnet1", "", false, ""},             // a VM's format: no hwaddr
		{"net0", "veth,hwaddr=BC:24:11:00:02:01", "", false, ""},                     // a part without a value
		{"net0", "hwaddr=BC:24:11:00:02:01,hwaddr=BC:24:11:00:02:03", "", false, ""}, // twice
		{"net0", "hwaddr=BC:24:11:00:02:01,type=phys", "", false, ""},                // not a veth
		{"net0", "hwaddr=BC:24:11:00:02:01,firewall=on", "", false, ""},              // bad bool
		{"net0", "hwaddr=BC:24:11:00:02:01,bridge=a/b", "", false, ""},               // bad bridge
		{"mp0", "hwaddr=BC:24:11:00:02:01", "", false, ""},                           // key
	})
}

func FuzzParseConfig(f *testing.F) {
	f.Add("net0: virtio=BC:24:11:00:01:01,bridge=vnet1,firewall=1\n[snap]\n")
	f.Add("net7: e1000=BC:24:11:00:01:01\nnet1:model=virtio,macaddr=BC:24:11:00:01:01\n")
	f.Fuzz(func(t *testing.T, s string) {
		nics, _, err := ParseConfig(strings.NewReader(s))
		if err != nil {
			return
		}
		for _, n := range nics {
			if len(n.MAC) != 6 || n.MAC[0]&1 != 0 || n.Index < 0 || n.Index > 319 {
				t.Fatalf("bad NIC accepted: %+v", n)
			}
		}
	})
}

func FuzzParseLeases(f *testing.F) {
	f.Add("1700000000 bc:24:11:00:01:02 10.10.1.150 g102 *\nduid 00:01\n")
	f.Add("BC:24:11:00:01:01,10.10.1.101\n")
	f.Fuzz(func(t *testing.T, s string) {
		for _, parse := range []func(string) ([]Lease, error){
			func(s string) ([]Lease, error) { l, _, err := ParseLeases(strings.NewReader(s)); return l, err },
			func(s string) ([]Lease, error) { l, _, err := ParseEthers(strings.NewReader(s)); return l, err },
		} {
			ls, err := parse(s)
			if err != nil {
				continue
			}
			for _, l := range ls {
				if !l.IP.Is4() || l.IP.IsUnspecified() || len(l.MAC) != 6 || l.MAC[0]&1 != 0 {
					t.Fatalf("bad lease accepted: %+v", l)
				}
			}
		}
	})
}
