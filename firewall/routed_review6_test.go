package firewall

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"testing"
	"time"
)

// arpRequestTo is an Ethernet frame from src to dst carrying an ARP
// request "who has tip, tell sip" (sender hardware address src).
func arpRequestTo(dst, src net.HardwareAddr, sip, tip netip.Addr) []byte {
	f := append(append(append([]byte{}, dst...), src...), 0x08, 0x06)
	f = append(f, 0, 1, 8, 0, 6, 4, 0, 1) // Ethernet/IPv4, request
	s, d := sip.As4(), tip.As4()
	f = append(append(f, src...), s[:]...)
	f = append(append(f, 0, 0, 0, 0, 0, 0), d[:]...)
	return append(f, make([]byte, 60-len(f))...)
}

// TestGuestLinkLocalGroupFramesBypassPortGuard (review 6): the bridge
// does not run its prerouting hook (port_in, port_guard: the MAC, source
// address, ARP pins and the ARP policer) for a frame to a reserved
// link-local group address 01:80:c2:00:00:0X that it does not forward
// (net/bridge/br_input.c br_handle_frame: 0x0e (LLDP) goes straight to
// __br_handle_local_finish, the others through NF_BR_LOCAL_IN only), and
// returns RX_HANDLER_PASS: the frame is then received by the node's own
// stack on the guest's port device (tap*). An ARP request there for an
// address of the node makes it create a neighbour entry for the sender
// address (net/ipv4/arp.c arp_process, neigh_event_ns), which no rule
// pinned: one entry per forged sender, in the host-wide table.
func TestGuestLinkLocalGroupFramesBypassPortGuard(t *testing.T) {
	for _, tc := range []struct {
		grp         byte
		plugLater   bool // the port comes after the guard started (its link event)
		description string
	}{{0x0e, false, "port before start"}, {0x03, false, "port before start"}, {0x0e, true, "port after start"}} {
		grp := tc.grp
		t.Run(fmt.Sprintf("01:80:c2:00:00:%02x %s", grp, tc.description), func(t *testing.T) {
			n := basicNode(t)
			cfg := testConfig(t)
			cfg.ProcRoot = "/proc" // the guard's sysctls, in the node's namespace
			var a *floodGuest
			if !tc.plugLater {
				a = plugGuest(t, n, "tap901i0", "vnetA", "10.10.1.50", "10.10.1.1")
			}
			g := startGuard(t, n, cfg)
			if tc.plugLater {
				runGuard(t, g) // the port's link event
				a = plugGuest(t, n, "tap901i0", "vnetA", "10.10.1.50", "10.10.1.1")
				eventually(t, "the new port's rp_filter 2", func() bool {
					var v []byte
					_ = n.Do(func() (err error) { v, err = os.ReadFile("/proc/sys/net/ipv4/conf/tap901i0/rp_filter"); return err })
					return strings.TrimSpace(string(v)) == "2"
				})
			}
			if err := g.SetPorts(t.Context(), []Port{{Name: a.port, MAC: a.mac, IPv4: []netip.Addr{a.addr}}}); err != nil {
				t.Fatal(err)
			}
			// rp_filter 0 for all: the kernel's default and what
			// pve-docs asks of EVPN exit nodes (a node with
			// pve-firewall gets 2 from its
			// /usr/lib/sysctl.d/pve-firewall.conf). The guard
			// gives guest ports 2 (looseRPFilter): the address-less port
			// fails the source check (fib_validate_source: no_addr ->
			// last_resort -> e_rpf) and nothing is created.
			if err := n.Do(func() error {
				return os.WriteFile("/proc/sys/net/ipv4/conf/all/rp_filter", []byte("0"), 0o644)
			}); err != nil {
				t.Fatal(err)
			}
			dst := net.HardwareAddr{0x01, 0x80, 0xc2, 0, 0, grp}
			gw := netip.MustParseAddr("10.10.1.1")
			s := linkLocalARPFlood(t, n, a, func(sip netip.Addr) []byte { return arpRequestTo(dst, a.mac, sip, gw) })
			if len(s) > 20 {
				t.Errorf("after 300 ARP requests to %s from one guest the node holds %d neighbour entries for addresses no guest has, e.g. %v",
					dst, len(s), s[:5])
			}
		})
	}
}

// TestGuestDHCPRebindFromUnspecifiedStillAnswered (review 6): a client
// rebinding (T2 passed, no renewal answered) broadcasts a REQUEST with
// ciaddr its address, and systemd-networkd (sd-dhcp-client.c
// dhcp_client_send_raw) and busybox udhcpc (send_renew through
// udhcp_send_raw_packet) send it from 0.0.0.0 over a packet socket.
// guest-dhcp-ciaddr drops it (0.0.0.0 . ciaddr is no member of
// @guest_self4), so such a guest loses its lease when its renewal fails
// once. dnsmasq answers it at ciaddr:68, the guest's own address.
func TestGuestDHCPRebindFromUnspecifiedStillAnswered(t *testing.T) {
	node, a := zoneDHCPNode(t)
	if err := a.ns.Do(func() error {
		c, err := net.ListenUDP("udp4", &net.UDPAddr{Port: 68})
		if err != nil {
			return err
		}
		defer c.Close()
		raw, err := openRaw("eth0")
		if err != nil {
			return err
		}
		defer raw.close()
		p := dhcpRelayed(a.mac, netip.IPv4Unspecified(), 4343)
		k := a.addr.As4()
		copy(p[12:16], k[:])
		p[242] = 3 // REQUEST, no server id, no requested address: REBINDING
		if err := raw.send(dhcpFrame(a.mac, p)); err != nil {
			return err
		}
		_ = c.SetReadDeadline(time.Now().Add(time.Minute))
		buf := make([]byte, 1500)
		for {
			n, _, err := c.ReadFromUDP(buf)
			if err != nil {
				out, _ := node.nft(t, "list", "chain", "inet", TableName, chainGuestIn)
				return fmt.Errorf("no answer to the rebinding request: %w\n%s", err, out)
			}
			if n >= 240 && buf[0] == 2 && binary.BigEndian.Uint32(buf[4:]) == 4343 {
				return nil
			}
		}
	}); err != nil {
		t.Fatal(err)
	}
}
