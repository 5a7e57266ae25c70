package egress

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/miekg/dns"
	"golang.org/x/sys/unix"

	"github.com/pve-inspect/pve-inspect/testvm"
)

// TestFirewallBridgeHostileGuestOnBed (review55b): a hostile firewall=1
// guest (root in its VM) talks to its firewall bridge fwbr<vmid>i0 itself
// instead of through it. fwbr has no address, but the node's stack
// answered an ARP request arriving on it for the gateway's address with
// fwbr's own MAC (arp_ignore 0: any local address, any interface), and a
// frame to that MAC (or an Ethernet broadcast) is handed to the node's
// stack on fwbr: routed with iif fwbr, an interface of no egress policy
// (egressByInterface leaves firewall bridges out), or delivered locally.
// Each case is something the guest's zone policy forbids:
//
//   - arp: the node answers ARP on fwbr (fwbr's MAC learned);
//   - routed: a none zone's guest sends UDP to the internet host through
//     fwbr (one-way exfiltration: masquerade's reply comes back in
//     conntrack zone 0 and misses the zone-1 entry);
//   - broadcast: an allowlist zone's guest's query, asked once the
//     ordinary way (redirected to the daemon's resolver, so fwbr's zone-1
//     entry of the original tuple to the gateway's port 53 saw a reply),
//     is sent again in an Ethernet broadcast frame: the copy fwbr hands
//     up is accepted as established in zone 1 and reaches the zone's
//     dnsmasq, which answers a denied name.
func TestFirewallBridgeHostileGuestOnBed(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	s := newStackWith(t, ctx, Policy{Mode: "open"}, stackConfig{firewall: true})
	s.set(t, ctx, "zonea", Policy{Mode: "allowlist", Allow: []string{testvm.InternetName}})
	s.set(t, ctx, "zoneb", Policy{Mode: "none"})
	s.set(t, ctx, "zonec", Policy{Mode: "open"})

	t.Run("arp", func(t *testing.T) {
		g := s.guests["zoneb"]
		fwbr, _, _ := testvm.FirewallBridgeNames(g.VMID, 0)
		fwbrMAC := s.nodeLinkMAC(t, fwbr)
		macs, err := arpReplies(s.b, g.NS, g.MAC, g.IPv4(), netip.MustParseAddr(s.gw["zoneb"]))
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("ARP replies for %s: %v (fwbr %s)", s.gw["zoneb"], macs, fwbrMAC)
		if slices.ContainsFunc(macs, func(m net.HardwareAddr) bool { return m.String() == fwbrMAC.String() }) {
			t.Errorf("the node answered ARP on %s with its MAC %s", fwbr, fwbrMAC)
		}
	})

	t.Run("routed", func(t *testing.T) {
		g := s.guests["zoneb"]
		fwbr, _, _ := testvm.FirewallBridgeNames(g.VMID, 0)
		fwbrMAC := s.nodeLinkMAC(t, fwbr)
		mark := make([]byte, 16)
		_, _ = rand.Read(mark)
		got, err := s.udpArrives(mark, func() error {
			// the gateway's address on fwbr's MAC, as the guest learned it
			if out, err := nsRun(g.NS, "ip", "neigh", "replace", s.gw["zoneb"], "lladdr", fwbrMAC.String(), "dev", "eth0", "nud", "permanent"); err != nil {
				return fmt.Errorf("%v: %s", err, out)
			}
			defer func() { _, _ = nsRun(g.NS, "ip", "neigh", "del", s.gw["zoneb"], "dev", "eth0") }()
			return s.b.Do(g.NS, func() error {
				c, err := net.Dial("udp4", net.JoinHostPort(testvm.InternetAddr, "9"))
				if err != nil {
					return err
				}
				defer c.Close()
				for range 5 {
					if _, err := c.Write(mark); err != nil {
						return err
					}
					time.Sleep(100 * time.Millisecond)
				}
				return nil
			})
		})
		if err != nil {
			t.Fatal(err)
		}
		if got {
			t.Errorf("a none zone's guest's UDP reached the internet host through %s", fwbr)
		}
	})

	t.Run("broadcast", func(t *testing.T) {
		g := s.guests["zonea"]
		gw := netip.MustParseAddr(s.gw["zonea"])
		denied := "other." + testvm.InternetName
		answers, err := s.broadcastQuery(g, gw, denied)
		if err != nil {
			t.Fatal(err)
		}
		for _, a := range answers {
			t.Logf("answer from %s: rcode %s, %d answers", a.from, dns.RcodeToString[a.msg.Rcode], len(a.msg.Answer))
			if len(a.msg.Answer) > 0 {
				t.Errorf("an allowlist zone's guest resolved %s (denied) through its firewall bridge: %v", denied, a.msg.Answer)
			}
		}
	})
}

// nodeLinkMAC is the MAC address of the node's link name.
func (s *stack) nodeLinkMAC(t *testing.T, name string) net.HardwareAddr {
	t.Helper()
	var mac net.HardwareAddr
	if err := s.b.Do(s.b.NodeNS(), func() error {
		i, err := net.InterfaceByName(name)
		if err != nil {
			return err
		}
		mac = i.HardwareAddr
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return mac
}

// arpReplies asks for tpa from eth0 in guest namespace ns (sender mac,
// spa; a broadcast request) and returns the sender MACs of the replies
// seen within a second and a half.
func arpReplies(b *testvm.Bed, ns string, mac net.HardwareAddr, spa, tpa netip.Addr) ([]net.HardwareAddr, error) {
	var out []net.HardwareAddr
	err := b.Do(ns, func() error {
		fd, idx, err := rawSocket(unix.ETH_P_ARP)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		s, d := spa.As4(), tpa.As4()
		bcast := net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
		frame := slices.Concat(ethHeader(bcast, mac, unix.ETH_P_ARP),
			[]byte{0, 1, 8, 0, 6, 4, 0, 1}, mac, s[:], make([]byte, 6), d[:])
		if err := unix.Sendto(fd, frame, 0, &unix.SockaddrLinklayer{Ifindex: idx, Halen: 6}); err != nil {
			return err
		}
		buf := make([]byte, 2048)
		for deadline := time.Now().Add(1500 * time.Millisecond); time.Now().Before(deadline); {
			n, _, err := unix.Recvfrom(fd, buf, 0)
			if err != nil || n < 42 {
				continue
			}
			// an ARP reply (op 2) from tpa
			if binary.BigEndian.Uint16(buf[20:]) == 2 && netip.AddrFrom4([4]byte(buf[28:32])) == tpa {
				out = append(out, slices.Clone(net.HardwareAddr(buf[22:28])))
			}
		}
		return nil
	})
	return out, err
}

// rawSocket opens a packet socket for ethertype proto on eth0 of the
// current namespace, with a read timeout of 100 ms, and returns it with
// eth0's index.
func rawSocket(proto uint16) (int, int, error) {
	i, err := net.InterfaceByName("eth0")
	if err != nil {
		return -1, 0, err
	}
	p := int(proto<<8 | proto>>8)
	fd, err := unix.Socket(unix.AF_PACKET, unix.SOCK_RAW|unix.SOCK_CLOEXEC, p)
	if err != nil {
		return -1, 0, err
	}
	tv := unix.Timeval{Usec: 100000}
	if err := unix.SetsockoptTimeval(fd, unix.SOL_SOCKET, unix.SO_RCVTIMEO, &tv); err != nil {
		unix.Close(fd)
		return -1, 0, err
	}
	if err := unix.Bind(fd, &unix.SockaddrLinklayer{Protocol: uint16(p), Ifindex: i.Index}); err != nil {
		unix.Close(fd)
		return -1, 0, err
	}
	return fd, i.Index, nil
}

func ethHeader(dst, src net.HardwareAddr, typ uint16) []byte {
	b := slices.Concat([]byte(dst), []byte(src), []byte{0, 0})
	binary.BigEndian.PutUint16(b[12:], typ)
	return b
}

// ipv4UDP is an IPv4/UDP packet (no UDP checksum).
func ipv4UDP(sip, dip netip.Addr, sport, dport uint16, payload []byte) []byte {
	ip := make([]byte, 20)
	ip[0], ip[8], ip[9] = 0x45, 64, unix.IPPROTO_UDP
	binary.BigEndian.PutUint16(ip[2:], uint16(20+8+len(payload)))
	s, d := sip.As4(), dip.As4()
	copy(ip[12:], s[:])
	copy(ip[16:], d[:])
	var sum uint32
	for i := 0; i < 20; i += 2 {
		sum += uint32(binary.BigEndian.Uint16(ip[i:]))
	}
	for sum > 0xffff {
		sum = sum>>16 + sum&0xffff
	}
	binary.BigEndian.PutUint16(ip[10:], ^uint16(sum))
	udp := make([]byte, 8)
	binary.BigEndian.PutUint16(udp[0:], sport)
	binary.BigEndian.PutUint16(udp[2:], dport)
	binary.BigEndian.PutUint16(udp[4:], uint16(8+len(payload)))
	return slices.Concat(ip, udp, payload)
}

type dnsAnswer struct {
	from net.Addr
	msg  *dns.Msg
}

// broadcastQuery asks gw:53 for name (A) from guest g twice from one UDP
// port: the ordinary way, then the same datagram in an Ethernet broadcast
// frame sent from eth0. It returns every answer the port got.
func (s *stack) broadcastQuery(g *testvm.Guest, gw netip.Addr, name string) ([]dnsAnswer, error) {
	var out []dnsAnswer
	err := s.b.Do(g.NS, func() error {
		pc, err := net.ListenPacket("udp4", net.JoinHostPort(g.IPv4().String(), "0"))
		if err != nil {
			return err
		}
		defer pc.Close()
		m := new(dns.Msg)
		m.SetQuestion(dns.Fqdn(name), dns.TypeA)
		q, err := m.Pack()
		if err != nil {
			return err
		}
		dst := &net.UDPAddr{IP: gw.AsSlice(), Port: 53}
		read := func(d time.Duration) {
			buf := make([]byte, 4096)
			_ = pc.SetReadDeadline(time.Now().Add(d))
			for {
				n, from, err := pc.ReadFrom(buf)
				if err != nil {
					return
				}
				r := new(dns.Msg)
				if r.Unpack(buf[:n]) == nil {
					out = append(out, dnsAnswer{from, r})
				}
			}
		}
		if _, err := pc.WriteTo(q, dst); err != nil {
			return err
		}
		read(2 * time.Second)
		if len(out) == 0 {
			return errors.New("no answer to the ordinary query")
		}
		fd, idx, err := rawSocket(unix.ETH_P_IP)
		if err != nil {
			return err
		}
		defer unix.Close(fd)
		port := uint16(pc.LocalAddr().(*net.UDPAddr).Port)
		bcast := net.HardwareAddr{0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
		frame := slices.Concat(ethHeader(bcast, g.MAC, unix.ETH_P_IP), ipv4UDP(g.IPv4(), gw, port, 53, q))
		if err := unix.Sendto(fd, frame, 0, &unix.SockaddrLinklayer{Ifindex: idx, Halen: 6}); err != nil {
			return err
		}
		read(2 * time.Second)
		return nil
	})
	return out, err
}

// udpArrives runs send while a UDP socket of the bed's uplink namespace,
// bound to the internet host's port 9, listens, and reports whether a
// datagram holding mark arrived there.
func (s *stack) udpArrives(mark []byte, send func() error) (bool, error) {
	var pc net.PacketConn
	if err := s.b.Do(s.b.UplinkNS(), func() (err error) {
		pc, err = net.ListenPacket("udp4", net.JoinHostPort(testvm.InternetAddr, "9"))
		return err
	}); err != nil {
		return false, err
	}
	defer pc.Close()
	if err := send(); err != nil {
		return false, err
	}
	buf := make([]byte, 2048)
	_ = pc.SetReadDeadline(time.Now().Add(2 * time.Second))
	for {
		n, _, err := pc.ReadFrom(buf)
		if err != nil {
			return false, nil
		}
		if bytes.Contains(buf[:n], mark) {
			return true, nil
		}
	}
}
