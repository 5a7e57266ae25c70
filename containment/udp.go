package containment

import (
	"fmt"
	"net/netip"
	"slices"
	"time"

	"github.com/pve-inspect/pve-inspect/containment/probe"
)

// UDP rows. What "reachable" means for UDP, where silence proves nothing by
// itself (a service may ignore a datagram it does not like, a firewall may
// drop it):
//
//   - a reply from the target: reachable;
//   - ICMP port unreachable (ECONNREFUSED on the probe's connected socket):
//     reachable, the target's stack got the datagram, like a refused TCP
//     connection;
//   - ICMP host, net or administratively prohibited unreachable: blocked;
//   - silence: decided by the canary, a datagram the probe sends first (and
//     resends) to a closed high port on the same address. If the canary came
//     back as port unreachable, the host answers UDP there and says when
//     nothing listens, so silence on the row's port means a silent service
//     took the datagram: reachable (a firewall that passes the canary's
//     port but drops the row's reads as a leak: the safe error). If the
//     canary was silent too, nothing arrives: blocked.
//
// Two controls keep a probe that cannot read ICMP errors from reading
// everything as blocked: the canary on the guest's own loopback must come
// back refused, and, when the policy promises the internet, so must the
// canary on a public address (the ICMP error crosses the NAT back).
//
// A host rate-limits its ICMP errors per peer (Linux: a burst of 6, then
// one a second for IPv4; a fresh IPv6 peer may get none for about a
// second). So the probe sends every canary first, all at once, resending
// for the whole timeout, before any row's datagram. Still,
// a host that answered many datagrams from the same guest within seconds
// (a second check right after the first) can read as silent: run the
// check on a fresh VM, as the package doc says, and note that a broad leak
// always shows in some rows even when the rate limit hides others.
//
// Under an egress policy (allowlist, none) the node redirects the guest's
// DNS to its own resolver, so udp 53 rows and the public canary (whose
// address the policy may allow) are left out.

// DefaultUDPPorts are the node's UDP services, probed on the zone gateway
// (not DNS: the zone resolver is the one allowed service there) and every
// host address.
func DefaultUDPPorts() []Port {
	return []Port{{53, "DNS"}, {123, "NTP"}, {161, "SNMP"}, {5405, "corosync/knet"}}
}

// DefaultPeerUDPPorts are probed on every LAN address and other zone guest.
func DefaultPeerUDPPorts() []Port {
	return []Port{{53, "DNS"}, {161, "SNMP"}}
}

// udpSelfCheckAddr is where the self-check control aims: the guest's own
// loopback, where the kernel always answers a closed port (no rate limit).
var udpSelfCheckAddr = netip.AddrPortFrom(netip.MustParseAddr("127.0.0.1"), 9)

// udpPublicPort is the row port of the public canary control; its verdict
// comes from the canary alone.
const udpPublicPort = 33434

// payloadFor is the datagram a live service on port must answer.
func payloadFor(port uint16) string {
	switch port {
	case 53:
		return probe.PayloadDNS
	case 123:
		return probe.PayloadNTP
	}
	return probe.PayloadGeneric
}

// addUDP adds the UDP rows: the self-check control, the node's UDP
// services on the gateway(s) and every host address, the peer ports on
// other zones' guests and LAN addresses, and the public canary control.
//
// With both port lists empty (not nil) there are no UDP rows at all.
func addUDP(spec Spec, pol Policy, add func(Check)) error {
	if spec.UDPPorts != nil && len(spec.UDPPorts) == 0 && spec.PeerUDPPorts != nil && len(spec.PeerUDPPorts) == 0 {
		return nil
	}
	ports := spec.UDPPorts
	if ports == nil {
		ports = DefaultUDPPorts()
	}
	peer := spec.PeerUDPPorts
	if peer == nil {
		peer = DefaultPeerUDPPorts()
	}
	for _, p := range append(slices.Clone(ports), peer...) {
		if p.Port == 0 {
			return fmt.Errorf("spec: udp port 0 (%s)", p.Name)
		}
	}
	udp := func(ap netip.AddrPort) probe.Target {
		return probe.Target{Kind: probe.KindUDP, Addr: ap.String(), Payload: payloadFor(ap.Port())}
	}
	add(Check{Group: GroupControl, Name: "probe reads ICMP port unreachable (UDP canary on its own loopback)", Expect: Reachable,
		Control: true, ByCanary: true, Target: udp(udpSelfCheckAddr)})

	var hosts []nodeHost
	for _, h := range nodeHosts(spec) {
		if !slices.ContainsFunc(hosts, func(o nodeHost) bool { return o.a == h.a }) {
			hosts = append(hosts, h)
		}
	}
	// Under an egress policy the node redirects the guest's DNS (udp 53 to
	// any address) to its own resolver, which answers: no udp 53 row can
	// tell where the datagram would have gone (the egress rows cover DNS).
	dnsRows := pol.Egress == ""
	for _, h := range hosts {
		for _, pt := range ports {
			if (h.gateway || !dnsRows) && pt.Port == 53 {
				continue // the zone resolver: allowed, and covered by the DNS rows
			}
			add(Check{Group: GroupControlPlane, Name: fmt.Sprintf("%s (udp %d) via %s", portName(pt), pt.Port, h.via), Expect: pol.ControlPlane,
				Target: udp(netip.AddrPortFrom(h.a, pt.Port)), sample: h.sample})
		}
	}
	peerRows := func(g Group, label string, aps []netip.AddrPort, expect Verdict) {
		var seen []netip.Addr
		for _, ap := range aps {
			if slices.Contains(seen, ap.Addr()) {
				continue
			}
			seen = append(seen, ap.Addr())
			for _, pt := range peer {
				if !dnsRows && pt.Port == 53 {
					continue
				}
				add(Check{Group: g, Name: fmt.Sprintf("%s %s %s (udp %d)", label, ap.Addr(), portName(pt), pt.Port), Expect: expect,
					Target: udp(netip.AddrPortFrom(ap.Addr(), pt.Port)), sample: ap.Addr()})
			}
		}
	}
	peerRows(GroupOtherZone, "other zone guest", spec.OtherZone, pol.OtherZone)
	peerRows(GroupLAN, "LAN", spec.LAN, pol.LAN)
	for _, a := range spec.Public {
		if pol.Egress != "" {
			// the public address may be one the policy allows (learned
			// from an allowed name): no expectation holds for it
			break
		}
		add(Check{Group: GroupInternet, Name: "public " + a.String() + " answers a closed UDP port with ICMP port unreachable (UDP canary)",
			Expect: pol.Internet, Control: pol.Internet == Reachable, ByCanary: true,
			Target: udp(netip.AddrPortFrom(a, udpPublicPort))})
	}
	return nil
}

// observeUDP judges a udp row by the rule in this file's comment; with
// appends the probe's detail, timeout is the row's.
func observeUDP(c Check, r probe.Result, timeout time.Duration, with func(string) string) (Verdict, string) {
	if r.Outcome == probe.OutcomeError {
		return Errored, with("probe could not try")
	}
	canaryAnswers := r.Canary == probe.OutcomeRefused || r.Canary == probe.OutcomeReply
	if c.ByCanary {
		// the row's own port is a closed one too: either refusal will do
		if canaryAnswers || r.Outcome == probe.OutcomeRefused {
			return Reachable, with("a closed port came back with ICMP port unreachable: ICMP errors reach the probe")
		}
		if r.Canary == "" {
			return Errored, with("no canary result")
		}
		return Blocked, with("no closed port came back with ICMP port unreachable")
	}
	switch r.Outcome {
	case probe.OutcomeReply:
		return Reachable, with("UDP reply")
	case probe.OutcomeRefused:
		return Reachable, with("ICMP port unreachable: the datagram reached the host (like a refused TCP connection)")
	case probe.OutcomeUnreachable:
		return Blocked, with("ICMP unreachable or prohibited")
	case probe.OutcomeNoReply:
		switch {
		case canaryAnswers:
			return Reachable, with("silent, but a closed port on the same address answers: a silent service got the datagram")
		case r.Canary == probe.OutcomeNoReply || r.Canary == probe.OutcomeUnreachable:
			return Blocked, with(fmt.Sprintf("silent within %v, and the canary on the same address silent too", timeout))
		}
		return Errored, with("silent, and the canary is unknown: nothing can be said")
	}
	return Errored, "unknown outcome " + string(r.Outcome)
}

// describeUDP renders a udp target for the table: "udp 10.0.0.1:123 ntp".
func describeUDP(t probe.Target) string {
	if t.Payload == "" {
		return "udp " + t.Addr
	}
	return "udp " + t.Addr + " " + t.Payload
}
