package egress

import (
	"context"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/pve-inspect/pve-inspect/testvm"
)

// TestSharedGatewayOnBed: a guest connection the guard redirected to the
// resolver's TCP listener or the proxy is attributed to the interface it
// came in on, also when another guest bridge holds the same address (two
// zones of one gateway: Proxmox allows one range in two zones, and a
// tenant with SDN rights can make one beside a sandbox's). The redirect
// makes the connection's local address the first address of the bridge it
// came in on, which names no interface when two hold it: attributed by
// that address, zoneb's guest got zonea's policy, quota and record.
func TestSharedGatewayOnBed(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	s := newStack(t, ctx, Policy{Mode: "open"})
	inet := testvm.InternetAddr
	other := "other." + testvm.InternetName // same address as the internet name
	s.set(t, ctx, "zonea", Policy{Mode: "allowlist", Allow: []string{testvm.InternetName}})
	s.set(t, ctx, "zoneb", Policy{Mode: "allowlist", Allow: []string{other}})
	// zonea's gateway becomes vnetb's first address (the one a redirect
	// of vnetb's guests goes to); vnetb keeps its own after it
	ip := func(args ...string) {
		t.Helper()
		if out, err := exec.CommandContext(ctx, "ip", append([]string{"-n", s.b.NodeNS()}, args...)...).CombinedOutput(); err != nil {
			t.Fatalf("ip %s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	ip("addr", "del", s.gw["zoneb"]+"/24", "dev", s.bridge["zoneb"])
	ip("addr", "add", s.gw["zonea"]+"/32", "dev", s.bridge["zoneb"])
	ip("addr", "add", s.gw["zoneb"]+"/24", "dev", s.bridge["zoneb"])

	// DNS over TCP from zoneb: zonea's name is not zoneb's (over UDP the
	// read loop names the interface by IP_PKTINFO)
	for _, tcp := range []bool{false, true} {
		if got, err := s.resolve("zoneb", testvm.InternetName, s.gw["zoneb"]+":53", tcp); err == nil || !strings.Contains(err.Error(), "NXDOMAIN") {
			t.Errorf("zoneb asked for zonea's name (tcp=%v): %v, %v; want NXDOMAIN", tcp, got, err)
		}
	}
	// the proxy: zoneb's own name opens the address; zonea's name on it is
	// refused
	if got, err := s.resolve("zoneb", other, s.gw["zoneb"]+":53", false); err != nil || len(got) != 1 || got[0] != inet {
		t.Fatalf("zoneb's own name: %v, %v", got, err)
	}
	if body, err := s.get("zoneb", "http://"+other+"/", inet+":80"); err != nil || body != "internet host" {
		t.Errorf("zoneb's own name through the proxy: %q, %v", body, err)
	}
	if body, err := s.getBlocked("zoneb", "http://"+testvm.InternetName+"/", inet+":80"); err == nil {
		t.Errorf("zoneb reached zonea's name through the proxy: %q", body)
	}
	// zonea's guest is still zonea's
	for _, tcp := range []bool{false, true} {
		if got, err := s.resolve("zonea", testvm.InternetName, s.gw["zonea"]+":53", tcp); err != nil || len(got) != 1 || got[0] != inet {
			t.Errorf("zonea's own name (tcp=%v): %v, %v", tcp, got, err)
		}
	}
	if n := len(s.den.Recent("sb-zoneb")); n == 0 {
		t.Errorf("no denial recorded for sb-zoneb; sb-zonea has %+v", s.den.Recent("sb-zonea"))
	}
}

// TestHandshakeACKElsewhereOnBed (review53b): the index ConnInterface
// reads is not the SYN's interface but that of the segment that completed
// the handshake (net/ipv4/tcp_minisocks.c tcp_check_req hands the ACK to
// syn_recv_sock; with SYN cookies net/ipv4/syncookies.c cookie_v4_check
// does the same), and a request socket of an unbound listener takes its
// ACK from any interface (ir_iif 0). The guard's redirect is decided on
// the SYN (zonea's bridge; the local address is zonea's gateway), but an
// ACK with the same 4-tuple that reaches the node through another zone's
// bridge is NATed by the same conntrack entry, delivered, and names the
// connection after that bridge: zonea's guest got zoneb's policy (and
// would take zoneb's quota and fill zoneb's record).
//
// The way in here is a VXLAN zone's uplink port (vxlan_<vnet>, no guest
// port: the layer-2 table pins nothing on it) fed from the management
// network (the bed's uplink namespace as the underlay); rp_filter 0, the
// kernel's default and what pve-docs (pvesdn.adoc, "Multiple EVPN Exit
// Nodes") asks of EVPN exit nodes. A node with pve-firewall has 2 (loose,
// its /usr/lib/sysctl.d/pve-firewall.conf), which passes zonea's guest's
// address too (it routes through zonea's bridge; ip-sysctl.rst: loose
// fails only a source reachable through no interface); not run here with
// 2. The guest itself sends its ACKs that way, standing in
// for an accomplice on the underlay that learned the SYN-ACK's sequence
// number. Before 645b54f the connection was named by its local address
// (the redirect's, fixed by the SYN), and this passed; at 645b54f it
// failed (zoneb's answers); ConnInterface now refuses it (vnetb does not
// hold zonea's gateway, the local address).
func TestHandshakeACKElsewhereOnBed(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	s := newStack(t, ctx, Policy{Mode: "open"})
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.CommandContext(ctx, args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	node, up, guest := s.b.NodeNS(), s.b.UplinkNS(), s.guests["zonea"].NS
	// zoneb's vnet gets a VXLAN uplink over the management network
	run("ip", "-n", node, "link", "add", "vxlan_vnetb", "type", "vxlan", "id", "53",
		"local", testvm.NodeMgmtAddr, "remote", testvm.UplinkAddr, "dstport", "4789")
	run("ip", "-n", node, "link", "set", "vxlan_vnetb", "master", s.bridge["zoneb"], "up")
	run("ip", "netns", "exec", node, "sysctl", "-qw", "net.ipv4.conf.all.rp_filter=0", "net.ipv4.conf."+s.bridge["zoneb"]+".rp_filter=0")
	// the underlay's end, bridged to a second leg of zonea's guest
	run("ip", "-n", up, "link", "add", "vx53", "type", "vxlan", "id", "53",
		"local", testvm.UplinkAddr, "remote", testvm.NodeMgmtAddr, "dstport", "4789")
	run("ip", "-n", up, "link", "add", "seg53", "type", "bridge")
	run("ip", "-n", up, "link", "set", "vx53", "master", "seg53", "up")
	run("ip", "-n", up, "link", "add", "sp53", "type", "veth", "peer", "name", "leg53", "netns", guest)
	run("ip", "-n", up, "link", "set", "sp53", "master", "seg53", "up")
	run("ip", "-n", up, "link", "set", "seg53", "up")
	t.Cleanup(func() {
		_ = exec.Command("ip", "-n", up, "link", "del", "seg53").Run()
		_ = exec.Command("ip", "-n", up, "link", "del", "vx53").Run()
		_ = exec.Command("ip", "-n", up, "link", "del", "sp53").Run()
	})
	run("ip", "-n", guest, "addr", "add", "10.10.2.77/24", "dev", "leg53")
	run("ip", "-n", guest, "link", "set", "leg53", "up")
	// the guest's SYNs go the ordinary way (its tap on zonea's bridge),
	// every later segment to port 53 through the underlay into vnetb
	nft := exec.CommandContext(ctx, "ip", "netns", "exec", guest, "nft", "-f", "-")
	nft.Stdin = strings.NewReader(`table ip ackvia {
	chain out {
		type route hook output priority mangle;
		tcp dport 53 tcp flags & (syn | ack) == ack meta mark set 0x53
	}
}
`)
	if out, err := nft.CombinedOutput(); err != nil {
		t.Fatalf("nft in the guest: %v: %s", err, out)
	}
	run("ip", "-n", guest, "route", "add", "default", "via", s.gw["zoneb"], "dev", "leg53", "table", "53")
	// the marked segments take that way only while the rule is there
	via := func(on bool) {
		t.Helper()
		op := "del"
		if on {
			op = "add"
		}
		run("ip", "-n", guest, "rule", op, "fwmark", "0x53", "table", "53")
	}

	other := "other." + testvm.InternetName
	for _, tc := range []struct {
		name         string
		zonea, zoneb Policy
	}{
		{"zoneb allowlist", Policy{Mode: "allowlist", Allow: []string{other}}, Policy{Mode: "allowlist", Allow: []string{testvm.InternetName}}},
		// a none zone's guest: every name, asked of its own zone's dnsmasq
		// (answerOpen asks the local address, zonea's gateway)
		{"zoneb open", Policy{Mode: "none"}, Policy{Mode: "open"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s.set(t, ctx, "zonea", tc.zonea)
			s.set(t, ctx, "zoneb", tc.zoneb)
			// the ordinary way, over UDP and TCP: zonea's policy
			for _, tcp := range []bool{false, true} {
				if got, err := s.resolve("zonea", testvm.InternetName, s.gw["zonea"]+":53", tcp); err == nil || !strings.Contains(err.Error(), "NXDOMAIN") {
					t.Fatalf("zonea asked for %s (tcp=%v): %v, %v; want NXDOMAIN", testvm.InternetName, tcp, got, err)
				}
			}
			// its ACKs through vnetb: never zoneb's answer (NXDOMAIN
			// or a refused connection)
			via(true)
			defer via(false)
			if got, err := s.resolve("zonea", testvm.InternetName, s.gw["zonea"]+":53", true); err == nil {
				t.Errorf("zonea's guest, its handshake ACK sent through zoneb's VXLAN uplink, got %s over TCP: %v; want no answer", testvm.InternetName, got)
			}
		})
	}
}
