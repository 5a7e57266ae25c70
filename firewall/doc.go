// Package firewall builds and keeps in force the host guard: one nftables
// table, inet pve-inspect, owned by the daemon (table flags owner|persist),
// that confines guests (DESIGN.md section 3).
//
// The desired table is data (Ruleset: sets, chains, rules with comments and
// counters) rendered by Render from a Config, the interface Classification
// and the lockdown Switches. A Guard applies it in one netlink batch through
// github.com/google/nftables and keeps it in force:
//
//	g, err := firewall.New(cfg, firewall.WithLogger(log))
//	err = g.Start(ctx)   // in force and verified when nil: signal readiness now
//	err = g.Run(ctx)     // route/link watch, nftables monitor, periodic verify
//	g.Close()            // the table stays (persist) for the next Start
//
// The lockdown controller drives it through SetLockdown, SetFailClosed,
// Management, Subscribe and Verify (a *DriftError names every difference);
// the sandbox API tells it the SDN zones it creates with SetZones.
//
// Ownership: the kernel binds an owned table to the netlink socket that
// created or adopted it; only that socket may change it, every other
// process gets EPERM, and "nft flush ruleset" skips it. With persist the
// table outlives its owner as an orphan (owner flag cleared). An orphan can
// be changed by anyone, and a process takes it over by sending NEWTABLE
// with owner|persist (the kernel then records its port id). Start does
// that, and in the same batch fixes whatever changed while no daemon ran:
// set members only (rules and counters kept), or a full rebuild (delete and
// re-create in one batch, so the table is never absent). A same-named table
// without persist is replaced the same way; one owned by a live process is
// an *OwnedError.
//
// Rules (hook, priority), each with a counter and a comment naming it:
//
//	prerouting -300  fwbr-ct-zone: iifname "fwbr*" ct zone set 1 (the pass
//	                 of a NIC's Proxmox firewall bridge in SDN's conntrack
//	                 zone, so the vnet pass gets its own entry and its
//	                 NAT: fwbridge.go); metadata4, metadata6: ip/ip6 daddr
//	                 @metadataN drop
//	forward    -150  linklocal-saddr, ipv6, failclosed (meta nfproto @failclosed),
//	                 lockdown-in/out (iifname/oifname @lockdown),
//	                 fwbr-routed (iifname "fwbr*" oifname != "fwbr*":
//	                 routed in from a firewall bridge; fwbridge.go),
//	                 cross-zone (iifname . oifname != @zone_peers between non-mgmt
//	                 interfaces), routed-to-no-guest (a packet a guest
//	                 port handed up to the node, GuestUpMark, leaving
//	                 through no @mgmt interface to an address not in
//	                 @guest_addrs4: routed.go), guest-up-clear,
//	                 private4 (oifname @mgmt ip daddr @private4
//	                 not in @private4_allow), uplink-subnet (the same for the
//	                 subnets of the management interfaces: other nodes, the
//	                 router's admin side, even when they are public addresses)
//	input      -150  guest-up-clear-in (GuestUpMark off); fwbr-input
//	                 (iifname "fwbr*" drop: fwbridge.go); guest-input: not
//	                 lo, @mgmt or @trusted -> guest_in: guest-dhcp-relay,
//	                 guest-dhcp-ciaddr drop (routed.go); ct
//	                 established,related, udp 67-68, udp/tcp 53 accept; drop
//	output     -150  dnsmasq-lockdown: meta skuid <dnsmasq> oifname @lockdown drop
//
// Egress policy per zone (DESIGN.md section 10, egress.go): open,
// allowlist or none, keyed by the guest's incoming interface, evaluated
// after every rule above (the lockdown always wins):
//
//	forward    -150  egress-none (iifname @egress_none to @mgmt),
//	                 egress-deny (iifname . ip daddr @egress_deny4),
//	                 egress-allowlist (iifname @egress_allowlist: jump
//	                 egress_allowlist_fwd), each a jump to egress_drop
//	egress_allowlist_fwd  return for iifname . ip daddr in @egress_allow4
//	                 (CIDRs: everything) or iifname . ip daddr . tcp dport
//	                 in @egress_learned_ports4 (name:port entries); anything
//	                 else, also to a name-learned address, to egress_drop
//	egress_drop      update @egress_denied { iifname counter },
//	                 update @egress_denied4 { iifname . ip daddr counter },
//	                 drop (its own rule: a full set never skips it)
//	egress_nat -100  guest DNS (udp/tcp 53, any server) from @egress_dns to the
//	                 daemon's resolver; DNS from @egress_dns_zone (the
//	                 daemon's own open zones) to the zone's own address
//	                 (fib daddr . iif type local) to the resolver too, which
//	                 records it and asks the zone's dnsmasq unchanged; tcp
//	                 80/443 from allowlist zones to
//	                 learned (not CIDR-allowed) addresses to the peek proxy
//	guest_in         egress-rpf-resolver-udp/-tcp, egress-rpf-proxy: to the
//	                 resolver's and the proxy's ports, a source that does not
//	                 route back through the input interface (fib saddr . iif
//	                 oif missing) drops, before the established rule (the
//	                 resolver and the proxy name a guest's zone by that
//	                 interface; a zone's uplink port is not pinned at layer
//	                 2); then the redirected ports accept (ct status dnat)
//	output     -150  the daemon's marked upstream sockets: none under the
//	                 lockdown; the proxy's only to @mgmt, never private,
//	                 metadata, uplink subnets or IPv6
//
// @egress_learned4 and @egress_learned_ports4 (timeout flag, 65536
// members each) are filled by Learn/LearnOpen from the resolver's answers
// (a name-learned address opens only tcp 80/443 through the peek proxy); @egress_denied and @egress_denied4 (dynamic, bounded, members
// with counters and a two-minute idle timeout) by the kernel from the
// packets egress_drop drops, read through EgressDrops. Verify does not
// compare the members of these four sets.
//
// Guest floods (flood.go, FloodConfig; issue 34): the control plane stays
// in service while guests flood the node:
//
//	prerouting -300  mgmt-notrack-in: iifname @mgmt tcp dport @mgmt_ports
//	                 to a local address notrack; guest-flood-rate: a guest
//	                 interface's packets past its policer in @guest_rate
//	                 drop (before they cost a conntrack entry);
//	                 guest-dns-rate-udp/-tcp: its DNS packets past its
//	                 policer in @guest_dns_rate drop (before the redirect
//	                 to the resolver every zone shares)
//	raw_out    -300  (output) mgmt-notrack-out: replies from @mgmt_ports out
//	                 of @mgmt notrack; the same to and from them on lo
//	flood      -150  (prerouting) guest-flood-conns: a guest interface's new
//	                 connection past its count in @guest_conns drop
//	port_guard       (layer 2, first) arp-flood, broadcast-flood: a guest
//	                 port's ARP and broadcast/multicast frames past their
//	                 policers in @port_arp_rate, @port_bcast_rate drop
//
// The kernel fills those six sets; verify compares their flags and size,
// not their members.
//
// Run-time state is set membership only (@mgmt, @lockdown, @failclosed,
// @zone_peers), so switches never rewrite a rule and counters survive.
// A change is applied by its difference (update.go): a new bridge, a
// port moved, a zone added or removed, the port map, a lockdown flip send
// the members they change in one batch, and the interface classification
// is kept per link from its own events (classify.go); nothing lists every
// link or rewrites a large set on the update path. Render stays the
// definition: Start, repairs and structural changes render the whole
// table, and the periodic verify compares the patched sets with it.
//
// A third table, arp pve-inspect (arptable.go), with the same flags, drops
// ARP arriving on a guest port's own device (frames to link-local groups
// the bridge hands up past its hooks) and on a firewall bridge (fwbr-arp:
// fwbridge.go), applied and verified with the others.
//
// Layer 2 (DESIGN.md section 10): a second table, bridge pve-inspect, with
// the same owner|persist flags, applied in the same batch, verified and
// repaired with the inet table (repairs counted apart:
// pve_inspect_guard_bridge_repairs_total). RenderBridge builds it; the
// port map (SetPorts: port, MAC, assigned IPv4) is set membership:
//
//	prerouting -300  port_in: iifname @guest_ports jump port_guard
//	port_guard       dhcp-server (udp sport 67), dhcp-to-client (udp dport
//	                 68), router-advert, dhcp-ciaddr (a request's ciaddr
//	                 neither 0 nor the port's) drop; unmapped (iifname != @ports)
//	                 -> port_unmapped; mac (iifname . ether saddr !=
//	                 @port_mac) drop; arp -> port_arp; dhcp-client
//	                 (0.0.0.0:68 -> :67) accept; ip4-saddr (iifname . ip
//	                 saddr != @port_ip4) drop; ip4 accept; other drop
//	port_unmapped    dhcp-client accept; drop (fail safe: DHCP only)
//	port_up (input -300) guest-up, unseen-up-*: meta mark set meta
//	                 mark | GuestUpMark on what a guest port hands up
//	port_arp         arp-shape (Ethernet/IPv4 only), arp-mac (sender MAC
//	                 != @port_mac), arp-ip (sender IP != @port_ip4, 0.0.0.0
//	                 probes accepted) drop
//
// @guest_ports are the mapped ports and every port of a zone bridge named
// like a Proxmox guest port (GuestPortPrefixes: tap, veth, fwpr), kept
// from link events; the rules key on the port name because "meta
// ibrname" needs nft_meta_bridge, which not every kernel has. Uplink
// ports of VLAN or VXLAN zones are not guest ports. The daemon fills the
// map with firewall/portmap from the VM configs and the zones' DHCP
// leases; an unmapped guest port is counted in
// pve_inspect_guard_bridge_unmapped_ports.
package firewall
