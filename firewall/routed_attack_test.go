package firewall

import (
	"context"
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// dhcpRelayed is a BOOTREQUEST as a relay agent at giaddr would forward
// it: a DISCOVER for chaddr mac.
func dhcpRelayed(mac net.HardwareAddr, giaddr netip.Addr, xid uint32) []byte {
	b := make([]byte, 240)
	b[0], b[1], b[2] = 1, 1, 6
	binary.BigEndian.PutUint32(b[4:], xid)
	g := giaddr.As4()
	copy(b[24:28], g[:])
	copy(b[28:], mac)
	copy(b[236:], []byte{99, 130, 83, 99})
	return append(b, 53, 1, 1, 255)
}

// strangerNeighbours lists the IPv4 neighbour entries of dev in n that are
// none of keep and not multicast.
func strangerNeighbours(t *testing.T, n *testNS, dev string, keep ...netip.Addr) []string {
	t.Helper()
	l, err := n.Netlink().LinkByName(dev)
	if err != nil {
		t.Fatal(err)
	}
	neigh, err := n.Netlink().NeighList(l.Attrs().Index, netlink.FAMILY_V4)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
next:
	for _, e := range neigh {
		ip, ok := netip.AddrFromSlice(e.IP.To4())
		if !ok || ip.IsMulticast() {
			continue
		}
		for _, k := range keep {
			if ip == k {
				continue next
			}
		}
		out = append(out, ip.String())
	}
	return out
}

// TestGuestCannotFillNeighbourTableThroughZoneDHCP (review 4): the
// routed-to-no-guest rule bounds what the node *forwards*, but the zone's
// dnsmasq (as Proxmox SDN runs it: dhcp-hostsfile, dhcp-ignore=tag:!known,
// dhcp-authoritative) answers a relayed request at its giaddr, port 67,
// from the node itself (output path, no forward hook). A guest that
// sends DISCOVERs for its own MAC to its gateway, each with another
// giaddr of its /16, makes the node resolve each giaddr: the same
// neighbour-table fill, without routing anything. So does a broadcast
// INFORM from 0.0.0.0 with another ciaddr each (dnsmasq
// dhcp.c dhcp_packet: no source address to answer, so ciaddr:68).
// dnsmasq's send buffer bounds the rate (~167 unresolved replies per
// dnsmasq outstanding, ~3 s each), not the address count.
func TestGuestCannotFillNeighbourTableThroughZoneDHCP(t *testing.T) {
	const targets = 300
	// (A REQUEST from 0.0.0.0 with a foreign ciaddr is NAKed by broadcast:
	// no entry. Each mode gets its own node: the replies of one that wait
	// for resolution fill dnsmasq's send buffer for the next.)
	for mode, dropped := range map[string][]string{
		"giaddr": {"guest-dhcp-relay"},
		// the port's pins drop it first (bridge dhcp-ciaddr)
		"ciaddr-inform-from-zero": {"dhcp-ciaddr", "guest-dhcp-ciaddr"},
	} {
		t.Run(mode, func(t *testing.T) {
			n, a := zoneDHCPNode(t)
			before := counters(t, n)
			if err := a.ns.Do(func() error {
				c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: a.addr.AsSlice(), Port: 68})
				if err != nil {
					return err
				}
				defer c.Close()
				raw, err := openRaw("eth0")
				if err != nil {
					return err
				}
				defer raw.close()
				for i := range targets {
					x := netip.AddrFrom4([4]byte{10, 77, byte(1 + i/250), byte(1 + i%250)})
					if mode == "giaddr" {
						x = netip.AddrFrom4([4]byte{10, 77, byte(101 + i/250), byte(1 + i%250)})
						if _, err := c.WriteToUDP(dhcpRelayed(a.mac, x, uint32(i+1)), &net.UDPAddr{IP: net.IPv4(10, 77, 0, 1), Port: 67}); err != nil {
							return err
						}
					} else {
						typ := byte(8) // INFORM
						p := dhcpRelayed(a.mac, netip.IPv4Unspecified(), uint32(i+1))
						k := x.As4()
						copy(p[12:16], k[:])
						p[242] = typ
						if err := raw.send(dhcpFrame(a.mac, p)); err != nil {
							return err
						}
					}
					time.Sleep(2 * time.Millisecond)
				}
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			// every request reached the node and was dropped before
			// dnsmasq could answer it
			waitDropped(t, n, before, targets, dropped...)
			base := map[string]int{"giaddr": 101, "ciaddr-inform-from-zero": 1}[mode]
			var s []string
			for _, x := range strangerNeighbours(t, n, "vnetA", a.addr) {
				if b := netip.MustParseAddr(x).As4(); int(b[2]) == base || int(b[2]) == base+1 {
					s = append(s, x)
				}
			}
			if len(s) > 20 {
				t.Errorf("after %d DHCP requests (%s) from one guest the node resolves %d addresses on vnetA that no guest holds, e.g. %v", targets, mode, len(s), s[:5])
			}
		})
	}
}

// zoneDHCPNode is a guarded node whose vnetA carries a sandbox's /16
// with the zone's dnsmasq, and one mapped guest on it (10.77.0.50).
func zoneDHCPNode(t *testing.T) (*testNS, *floodGuest) {
	n := basicNode(t)
	cfg := testConfig(t)
	n.IP(t, "addr", "add", "10.77.0.1/16", "dev", "vnetA") // the sandbox's /16 network
	a := plugGuest(t, n, "tap901i0", "vnetA", "10.77.0.50", "10.77.0.1")
	g := startGuard(t, n, cfg)
	if err := g.SetPorts(t.Context(), []Port{{Name: a.port, MAC: a.mac, IPv4: []netip.Addr{a.addr}}}); err != nil {
		t.Fatal(err)
	}

	dir := t.TempDir()
	hosts := filepath.Join(dir, "ethers")
	if err := os.WriteFile(hosts, []byte(fmt.Sprintf("%s,%s\n", a.mac, a.addr)), 0o644); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cmd := n.Command(ctx, "dnsmasq", "--keep-in-foreground", "--conf-file=/dev/null", "--bind-interfaces",
		"--except-interface=lo", "--port=0", "--user=root", "--pid-file="+filepath.Join(dir, "pid"),
		"--dhcp-leasefile="+filepath.Join(dir, "leases"), "--dhcp-hostsfile="+hosts, "--dhcp-ignore=tag:!known",
		"--dhcp-authoritative", "--log-facility=-", "--interface=vnetA",
		"--dhcp-range=set:vnetA,10.77.0.10,10.77.255.250,255.255.0.0,1h")
	logf, err := os.Create(filepath.Join(dir, "dnsmasq.log"))
	if err != nil {
		t.Fatal(err)
	}
	defer logf.Close()
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); _ = cmd.Wait() })
	waitDHCPServer(t, n)

	return n, a
}

// waitDHCPServer waits until a process listens on UDP port 67 in n (the
// zone's dnsmasq started above): a request sent before is lost.
func waitDHCPServer(t *testing.T, n *testNS) {
	t.Helper()
	eventually(t, "dnsmasq listening on udp 67", func() bool {
		var tab []byte
		if err := n.Do(func() (err error) {
			// the thread's own network namespace, not the process's
			tab, err = os.ReadFile("/proc/thread-self/net/udp")
			return err
		}); err != nil {
			t.Fatal(err)
		}
		for _, line := range strings.Split(string(tab), "\n")[1:] {
			// local_address is the second field, ADDR:PORT in hex
			if f := strings.Fields(line); len(f) > 1 && strings.HasSuffix(f[1], ":0043") {
				return true
			}
		}
		return false
	})
}

// dhcpFrame is payload from 0.0.0.0:68 to 255.255.255.255:67, broadcast.
func dhcpFrame(mac net.HardwareAddr, payload []byte) []byte {
	ip := make([]byte, 20)
	ip[0], ip[8], ip[9] = 0x45, 64, unix.IPPROTO_UDP
	binary.BigEndian.PutUint16(ip[2:], uint16(28+len(payload)))
	copy(ip[16:], []byte{255, 255, 255, 255})
	var s uint32
	for i := 0; i < 20; i += 2 {
		s += uint32(binary.BigEndian.Uint16(ip[i:]))
	}
	for s > 0xffff {
		s = s&0xffff + s>>16
	}
	binary.BigEndian.PutUint16(ip[10:], ^uint16(s))
	udp := make([]byte, 8)
	binary.BigEndian.PutUint16(udp[0:], 68)
	binary.BigEndian.PutUint16(udp[2:], 67)
	binary.BigEndian.PutUint16(udp[4:], uint16(8+len(payload)))
	eth := append([]byte{255, 255, 255, 255, 255, 255}, mac...)
	eth = append(eth, 8, 0)
	return append(append(append(eth, ip...), udp...), payload...)
}

// TestGuestCannotSweepOnLinkRouteOfUplink (review 4): @uplink_nets4 holds
// the subnets of the management interfaces' addresses only. An on-link
// route of the uplink without an address of the node in it (a provider's
// extra on-link range, "ip route add ... dev vmbr0") is not in it, so a
// guest routed out of the uplink to each of its addresses makes the node
// resolve each there: the routed-to-no-guest rule exempts @mgmt.
func TestGuestCannotSweepOnLinkRouteOfUplink(t *testing.T) {
	n := basicNode(t)
	cfg := testConfig(t)
	n.IP(t, "route", "add", "198.51.0.0/16", "dev", "eth0")
	if err := n.Do(func() error { return os.WriteFile("/proc/sys/net/ipv4/ip_forward", []byte("1"), 0o644) }); err != nil {
		t.Fatal(err)
	}
	a := plugGuest(t, n, "tap901i0", "vnetA", "10.10.1.50", "10.10.1.1")
	g := startGuard(t, n, cfg)
	if err := g.SetPorts(t.Context(), []Port{{Name: a.port, MAC: a.mac, IPv4: []netip.Addr{a.addr}}}); err != nil {
		t.Fatal(err)
	}
	const targets = 300
	before := counters(t, n)
	if err := a.ns.Do(func() error {
		return sendUDPTo(targets, func(i int) string { return fmt.Sprintf("198.51.%d.%d:9", 1+i/250, 1+i%250) })
	}); err != nil {
		t.Fatal(err)
	}
	// every packet was routed to the uplink and dropped there, before
	// the node resolved its destination
	waitDropped(t, n, before, targets, "uplink-subnet")
	if s := strangerNeighbours(t, n, "eth0"); len(s) > 20 {
		t.Errorf("after %d routed packets the node resolves %d addresses on its uplink, e.g. %v", targets, len(s), s[:5])
	}
}

// TestGuestDHCPRenewalStillAnswered: the DHCP field rules leave a guest's
// own exchanges alone: a renewal (REQUEST from its address, ciaddr its
// address) is acknowledged by the zone's dnsmasq at the guest's port 68.
func TestGuestDHCPRenewalStillAnswered(t *testing.T) {
	_, a := zoneDHCPNode(t)
	if err := a.ns.Do(func() error {
		c, err := net.ListenUDP("udp4", &net.UDPAddr{IP: a.addr.AsSlice(), Port: 68})
		if err != nil {
			return err
		}
		defer c.Close()
		p := dhcpRelayed(a.mac, netip.IPv4Unspecified(), 4242)
		k := a.addr.As4()
		copy(p[12:16], k[:])
		p[242] = 3 // REQUEST
		if _, err := c.WriteToUDP(p, &net.UDPAddr{IP: net.IPv4(10, 77, 0, 1), Port: 67}); err != nil {
			return err
		}
		_ = c.SetReadDeadline(time.Now().Add(time.Minute))
		buf := make([]byte, 1500)
		for {
			n, _, err := c.ReadFromUDP(buf)
			if err != nil {
				return fmt.Errorf("no answer to the renewal: %w", err)
			}
			if n >= 240 && buf[0] == 2 && binary.BigEndian.Uint32(buf[4:]) == 4242 {
				if got := netip.AddrFrom4([4]byte(buf[16:20])); got != a.addr {
					return fmt.Errorf("renewal answered with yiaddr %s, want %s", got, a.addr)
				}
				return nil
			}
		}
	}); err != nil {
		t.Fatal(err)
	}
}

// rawSender sends whole Ethernet frames out of one interface of the
// namespace it was opened in (a guest forging what its kernel would not).
type rawSender struct{ fd, ifindex int }

// openRaw opens a packet socket for iface; call it inside the namespace.
func openRaw(iface string) (*rawSender, error) {
	ifi, err := net.InterfaceByName(iface)
	if err != nil {
		return nil, err
	}
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	return &rawSender{fd: fd, ifindex: ifi.Index}, nil
}

func (r *rawSender) send(frame []byte) error {
	return unix.Sendto(r.fd, frame, 0, &unix.SockaddrLinklayer{Ifindex: r.ifindex, Halen: 6})
}

func (r *rawSender) close() { unix.Close(r.fd) }
