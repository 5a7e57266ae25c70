package egress

import (
	"context"
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pve-inspect/pve-inspect/firewall"
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
// hold zonea's gateway, the local address). The guard's egress-rpf-*
// rules now drop such an ACK before the listener sees it (zonea's guest's
// address does not route back through vnetb:
// TestQueryElsewhereOnBed); ConnInterface's check stays behind them.
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
	underlayLeg(t, ctx, s)
	setRPFilter(t, ctx, s, 0)
	guest := s.guests["zonea"].NS
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

// underlayLeg gives zoneb's vnet a VXLAN uplink port (vxlan_vnetb, no
// guest port: the layer-2 table pins nothing on it) fed from the
// management network (the bed's uplink namespace as the underlay), and
// bridges the underlay's end to a second leg of zonea's guest (leg53,
// 10.10.2.77/24 in zoneb's subnet): what zonea's guest sends out of
// leg53 comes in on vnetb with whatever source address it carries,
// standing in for an accomplice on the underlay. The guest's own source
// check is off, so
// an answer to its zonea address from zoneb's gateway (a route through
// leg53 in the guest) reaches it through its tap.
func underlayLeg(t *testing.T, ctx context.Context, s *stack) {
	t.Helper()
	run := func(args ...string) {
		t.Helper()
		if out, err := exec.CommandContext(ctx, args[0], args[1:]...).CombinedOutput(); err != nil {
			t.Fatalf("%s: %v: %s", strings.Join(args, " "), err, out)
		}
	}
	node, up, guest := s.b.NodeNS(), s.b.UplinkNS(), s.guests["zonea"].NS
	run("ip", "-n", node, "link", "add", "vxlan_vnetb", "type", "vxlan", "id", "53",
		"local", testvm.NodeMgmtAddr, "remote", testvm.UplinkAddr, "dstport", "4789")
	run("ip", "-n", node, "link", "set", "vxlan_vnetb", "master", s.bridge["zoneb"], "up")
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
	run("ip", "-n", guest, "addr", "add", underlayLegAddr+"/24", "dev", "leg53")
	run("ip", "-n", guest, "link", "set", "leg53", "up")
	run("ip", "netns", "exec", guest, "sh", "-c", "for f in /proc/sys/net/ipv4/conf/*/rp_filter; do echo 0 > $f; done")
}

// setRPFilter sets the node's source check (all and zoneb's vnet; the
// kernel uses the larger): 2 is a Proxmox VE node's with pve-firewall, 0
// the kernel's default and an EVPN exit node's.
func setRPFilter(t *testing.T, ctx context.Context, s *stack, v int) {
	t.Helper()
	rp := strconv.Itoa(v)
	if out, err := exec.CommandContext(ctx, "ip", "netns", "exec", s.b.NodeNS(), "sysctl", "-qw",
		"net.ipv4.conf.all.rp_filter="+rp, "net.ipv4.conf."+s.bridge["zoneb"]+".rp_filter="+rp).CombinedOutput(); err != nil {
		t.Fatalf("rp_filter %s: %v: %s", rp, err, out)
	}
}

// underlayLegAddr is the address of zonea's guest's second leg
// (underlayLeg), in zoneb's subnet.
const underlayLegAddr = "10.10.2.77"

// TestQueryElsewhereOnBed: the resolver names a UDP query's zone by the
// interface it came in on (IP_PKTINFO), and a query carrying zonea's
// guest's address that comes in on zoneb's bridge through its VXLAN
// uplink (underlayLeg; the layer-2 table pins guest ports, not uplink
// ports) was answered under zoneb's policy, the answer routed to zonea's
// guest: a none zone's guest got every name. A Proxmox VE node's source
// check is loose (pve-firewall's /usr/lib/sysctl.d/pve-firewall.conf sets
// all.rp_filter 2; EVPN exit nodes 0), which passes zonea's address: it
// routes through vneta. The guard's egress-rpf-* rules in guest_in drop
// a packet to the resolver's or the proxy's port whose source does not
// route back through the interface it came in on (fib saddr . iif oif
// missing). Without them this failed (every row: zoneb's answer); the
// leg's own address (zoneb's subnet, routed through vnetb) is answered,
// so the leg delivers, and each zone's own guest keeps its policy over
// UDP and TCP. The rules come before guest_in's established rule: a
// query's 5-tuple asked the ordinary way first is an established flow,
// and with the rules after it the same 5-tuple through the underlay got
// zoneb's answer (every row).
func TestQueryElsewhereOnBed(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	s := newStack(t, ctx, Policy{Mode: "open"})
	underlayLeg(t, ctx, s)
	inet, other := testvm.InternetAddr, "other."+testvm.InternetName
	for i, tc := range []struct {
		name         string
		rpFilter     int
		zonea, zoneb Policy
	}{
		{"zonea none, zoneb open, loose", 2, Policy{Mode: "none"}, Policy{Mode: "open"}},
		{"zonea none, zoneb open, off", 0, Policy{Mode: "none"}, Policy{Mode: "open"}},
		{"zonea allowlist, zoneb allowlist, loose", 2,
			Policy{Mode: "allowlist", Allow: []string{other}}, Policy{Mode: "allowlist", Allow: []string{testvm.InternetName}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			setRPFilter(t, ctx, s, tc.rpFilter)
			s.set(t, ctx, "zonea", tc.zonea)
			s.set(t, ctx, "zoneb", tc.zoneb)
			// the ordinary ways, over UDP and TCP: each zone's own policy
			for _, tcp := range []bool{false, true} {
				if got, err := s.resolve("zonea", testvm.InternetName, s.gw["zonea"]+":53", tcp); err == nil || !strings.Contains(err.Error(), "NXDOMAIN") {
					t.Fatalf("zonea asked for %s (tcp=%v): %v, %v; want NXDOMAIN", testvm.InternetName, tcp, got, err)
				}
				if got, err := s.resolve("zoneb", testvm.InternetName, s.gw["zoneb"]+":53", tcp); err != nil || len(got) != 1 || got[0] != inet {
					t.Fatalf("zoneb asked for %s (tcp=%v): %v, %v; want %s", testvm.InternetName, tcp, got, err, inet)
				}
			}
			// the leg's own address (zoneb's subnet) through the underlay:
			// zoneb's answer, so the way in works
			if got, err := resolveFrom(s, underlayLegAddr+":0", testvm.InternetName, s.gw["zoneb"]+":53", time.Minute); err != nil || len(got) != 1 || got[0] != inet {
				t.Fatalf("the leg's own address through zoneb's uplink: %v, %v; want %s", got, err, inet)
			}
			// zonea's guest's address the same way: no answer at all
			drops := func() float64 { return guardDrops(t, s.g, "guest_in", "egress-rpf-resolver-udp") }
			before := drops()
			if got, err := resolveFrom(s, s.guests["zonea"].IPv4().String()+":0", testvm.InternetName, s.gw["zoneb"]+":53", 2*time.Second); err == nil {
				t.Errorf("zonea's guest, its query sent through zoneb's VXLAN uplink, got %s: %v; want no answer", testvm.InternetName, got)
			} else if !isTimeout(err) {
				t.Errorf("zonea's guest through zoneb's uplink: %v; want no answer (a timeout)", err)
			}
			if after := drops(); after <= before {
				t.Errorf("egress-rpf-resolver-udp counted %v drops, before %v: want more", after, before)
			}
			// a query's 5-tuple asked the ordinary way first (through
			// the tap, a host route to zoneb's gateway by zonea's):
			// zonea's answer, and the same 5-tuple through the underlay
			// is conntrack's established flow, dropped all the same
			from := fmt.Sprintf("%s:%d", s.guests["zonea"].IPv4(), 20000+i)
			route := func(op string) {
				t.Helper()
				if out, err := exec.CommandContext(ctx, "ip", "-n", s.guests["zonea"].NS, "route", op, s.gw["zoneb"]+"/32", "via", s.gw["zonea"]).CombinedOutput(); err != nil {
					t.Fatalf("route %s: %v: %s", op, err, out)
				}
			}
			route("add")
			got, err := resolveFrom(s, from, testvm.InternetName, s.gw["zoneb"]+":53", time.Minute)
			route("del")
			if err == nil || !strings.Contains(err.Error(), "NXDOMAIN") {
				t.Fatalf("zonea's guest from %s the ordinary way: %v, %v; want NXDOMAIN", from, got, err)
			}
			if got, err := resolveFrom(s, from, testvm.InternetName, s.gw["zoneb"]+":53", 2*time.Second); err == nil {
				t.Errorf("zonea's guest from %s, an established query's 5-tuple, through zoneb's VXLAN uplink got %s: %v; want no answer", from, testvm.InternetName, got)
			} else if !isTimeout(err) {
				t.Errorf("zonea's guest from %s, established, through zoneb's uplink: %v; want no answer (a timeout)", from, err)
			}
		})
	}
}

// resolveFrom asks server for name (A) over UDP from zonea's guest, its
// socket bound to src (address:port, port 0 for any); it returns the addresses, or the rcode as an
// error.
func resolveFrom(s *stack, src, name, server string, timeout time.Duration) ([]string, error) {
	var got []string
	err := s.b.Do(s.guests["zonea"].NS, func() error {
		local, err := net.ResolveUDPAddr("udp4", src)
		if err != nil {
			return err
		}
		got, err = askA(&dns.Client{Timeout: timeout, Dialer: &net.Dialer{Timeout: timeout, LocalAddr: local}}, name, server)
		return err
	})
	return got, err
}

// guardDrops is the guard's drop counter of rule in chain, as exported
// (pve_inspect_guard_rule_drop_packets_total); 0 when there is none.
func guardDrops(t *testing.T, g *firewall.Guard, chain, rule string) float64 {
	t.Helper()
	reg := prometheus.NewRegistry()
	reg.MustRegister(g.Collector())
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() != "pve_inspect_guard_rule_drop_packets_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if labels["chain"] == chain && labels["rule"] == rule {
				return m.GetCounter().GetValue()
			}
		}
	}
	return 0
}
