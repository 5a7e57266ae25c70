package firewall

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// Names of the egress sets and chain (DESIGN.md section 10).
const (
	SetEgressNone      = "egress_none"
	SetEgressAllowlist = "egress_allowlist"
	SetEgressDNS       = "egress_dns"
	// SetEgressDNSZone holds the bridges of the daemon's own open zones:
	// their DNS to the zone's own address (its dnsmasq) goes through the
	// daemon's resolver, which records it and asks the dnsmasq unchanged.
	SetEgressDNSZone  = "egress_dns_zone"
	SetEgressAllow4   = "egress_allow4"
	SetEgressDeny4    = "egress_deny4"
	SetEgressLearned4 = "egress_learned4"
	// SetEgressLearnedPorts4 holds interface . address . tcp port: the
	// ports a name:port entry opens by address alone (no name check).
	SetEgressLearnedPorts4 = "egress_learned_ports4"
	SetEgressPeekPorts     = "egress_peek_ports"
	// SetEgressDenied counts, per guest interface, the packets the
	// egress rules drop (one member per interface, a counter each).
	SetEgressDenied = "egress_denied"
	// SetEgressDenied4 notes the destinations of those packets
	// (interface . address, a counter each), bounded by EgressDeniedSize.
	SetEgressDenied4 = "egress_denied4"

	chainEgressNAT       = "egress_nat"
	chainEgressDrop      = "egress_drop"
	chainEgressAllowlist = "egress_allowlist_fwd"
)

// EgressLearnedSize bounds each learned set (the addresses the resolver
// opened, the node's guests together); the registry caps every zone's
// share well below it, so one zone cannot fill it for the others.
const EgressLearnedSize = 65536

// Bounds of the denial sets a guest's dropped packets fill. The per
// interface set cannot grow past the node's guest interfaces; the
// destination set is capped, and a member not hit for EgressDeniedTTL
// expires. A full destination set only stops noting new destinations:
// the packet is still dropped and still counted per interface.
const (
	EgressDeniedIfSize = 4096
	EgressDeniedSize   = 8192
	EgressDeniedTTL    = 2 * time.Minute
)

// EgressMode is what a zone's guests may reach through the uplink.
type EgressMode string

// Egress modes.
const (
	// EgressOpen: the internet (minus @private4, metadata and the uplink
	// subnets, as for every guest).
	EgressOpen EgressMode = "open"
	// EgressAllowlist: only the zone's CIDRs and the addresses its
	// resolver learned from allowed names.
	EgressAllowlist EgressMode = "allowlist"
	// EgressNone: nothing; the zone's DNS is answered by the daemon's
	// resolver, which refuses every name.
	EgressNone EgressMode = "none"
)

// ParseEgressMode returns the mode named s ("" is open).
func ParseEgressMode(s string) (EgressMode, error) {
	switch m := EgressMode(s); m {
	case "":
		return EgressOpen, nil
	case EgressOpen, EgressAllowlist, EgressNone:
		return m, nil
	}
	return "", fmt.Errorf("egress mode %q: want open, allowlist or none", s)
}

// ZoneEgress is the kernel side of one zone's egress policy: the mode and
// its address parts. Names are the resolver's business; the addresses it
// learns go into @egress_learned4 through Guard.Learn.
type ZoneEgress struct {
	// Bridges are the zone's vnet bridges (the guest interfaces the
	// policy applies to).
	Bridges []string
	Mode    EgressMode
	// Allow are IPv4 prefixes always reachable in allowlist mode.
	Allow []netip.Prefix
	// Deny are IPv4 prefixes never reachable, in any mode.
	Deny []netip.Prefix
}

func (z ZoneEgress) validate() error {
	if _, err := ParseEgressMode(string(z.Mode)); err != nil {
		return err
	}
	for _, n := range z.Bridges {
		if n == "" || len(n) > 15 || n == "lo" {
			return fmt.Errorf("bad bridge name %q", n)
		}
	}
	for _, p := range append(slices.Clone(z.Allow), z.Deny...) {
		if !p.IsValid() || !p.Addr().Is4() {
			return fmt.Errorf("egress prefix %s is not IPv4", p)
		}
	}
	return nil
}

// EgressConfig is the static part of the egress policy.
type EgressConfig struct {
	// Default applies to every guest interface whose zone has no policy of
	// its own (zones the daemon did not create).
	Default ZoneEgress
	// DNSPort is the local port of the daemon's resolver; guest DNS
	// (udp and tcp 53) from allowlist and none zones is redirected to it.
	// Zero means 15353.
	DNSPort uint16
	// ProxyPort is the local port of the Host/SNI peek proxy; tcp 80/443
	// from allowlist zones to name-learned addresses is redirected to it.
	// Zero means 15380.
	ProxyPort uint16
	// Mark marks the daemon's own upstream sockets for the proxy; Mark+1
	// marks the resolver's. Zero means 0x70690000.
	Mark uint32
}

// WithEgress sets the zones' egress policies Start applies (see
// SetEgress). A restarting daemon passes the policies it persisted, so
// adopting the orphaned table never opens a zone to the default.
func WithEgress(policies map[string]ZoneEgress) Option {
	return func(o *options) { o.egress = policies }
}

// Ports and mark the egress rules use.
func (c EgressConfig) ports() (dns, proxy uint16, mark uint32) {
	dns, proxy, mark = c.DNSPort, c.ProxyPort, c.Mark
	if dns == 0 {
		dns = 15353
	}
	if proxy == 0 {
		proxy = 15380
	}
	if mark == 0 {
		mark = 0x70690000
	}
	return dns, proxy, mark
}

// ProxyMark is the socket mark of the proxy's upstream connections; the
// output chain lets them out only to the uplink, never to @private4,
// metadata or the uplink subnets, and never while the lockdown is on.
func (c EgressConfig) ProxyMark() uint32 { _, _, m := c.ports(); return m }

// ResolverMark is the socket mark of the resolver's upstream queries; the
// output chain drops them while the lockdown is on.
func (c EgressConfig) ResolverMark() uint32 { return c.ProxyMark() + 1 }

// Ports returns the resolver and proxy ports in use.
func (c EgressConfig) Ports() (dns, proxy uint16) { d, p, _ := c.ports(); return d, p }

// egressByInterface maps every guest interface to its zone's policy: the
// bridges of zones with a policy of their own get it, every other
// interface that is not lo, management, trusted or a guest NIC's firewall
// bridge (fwbr<vmid>i<n>) gets the default. A
// bridge that is management or trusted gets nothing (a policy never
// applies to the node's own networks).
func egressByInterface(cfg Config, cls Classification) map[string]ZoneEgress {
	skip := map[string]bool{"lo": true}
	for _, n := range append(slices.Clone(cls.Management), cls.Trusted...) {
		skip[n] = true
	}
	out := map[string]ZoneEgress{}
	for _, id := range slices.Sorted(maps.Keys(cfg.ZoneEgress)) {
		z := cfg.ZoneEgress[id]
		for _, b := range z.Bridges {
			if !skip[b] {
				out[b] = z
			}
		}
	}
	for _, n := range cls.Interfaces {
		// a firewall bridge's pass is checked again at its vnet
		// (fwbridge.go); a policy of its own would redirect its DNS
		// to an address it does not have
		if _, ok := out[n]; !ok && !skip[n] && !isFirewallBridge(n) {
			out[n] = cfg.Egress.Default
		}
	}
	return out
}

// ownOpenBridges are the bridges of the daemon's own zones (SetEgress:
// its sandboxes, whose policy the resolver knows) in open mode. A zone
// the daemon did not create (the configured ones, Proxmox's, the
// reference plugin's) keeps its DNS path untouched.
func ownOpenBridges(cfg Config) map[string]bool {
	out := map[string]bool{}
	for id, z := range cfg.ZoneEgress {
		if strings.HasPrefix(id, runZonePrefix) && (z.Mode == EgressOpen || z.Mode == "") {
			for _, b := range z.Bridges {
				out[b] = true
			}
		}
	}
	return out
}

// addEgress adds the egress sets and rules (DESIGN.md section 10) to rs.
// They come after the lockdown, cross-zone, private and metadata rules, so
// the lockdown always wins and no policy opens those paths.
func addEgress(rs *Ruleset, cfg Config, cls Classification) error {
	if err := cfg.Egress.Default.validate(); err != nil {
		return fmt.Errorf("egress default: %w", err)
	}
	for id, z := range cfg.ZoneEgress {
		if err := z.validate(); err != nil {
			return fmt.Errorf("egress of zone %s: %w", id, err)
		}
	}
	byIf := egressByInterface(cfg, cls)
	names := slices.Sorted(maps.Keys(byIf))
	own := ownOpenBridges(cfg)
	var none, allow, dns, dnsZone []string
	var allow4, deny4 []ifPrefix
	for _, n := range names {
		z := byIf[n]
		switch z.Mode {
		case EgressNone:
			none = append(none, n)
			dns = append(dns, n)
		case EgressAllowlist:
			allow = append(allow, n)
			dns = append(dns, n)
			for _, p := range mergePrefixes(z.Allow) {
				allow4 = append(allow4, ifPrefix{n, p})
			}
		case EgressOpen:
			if own[n] {
				dnsZone = append(dnsZone, n)
			}
		}
		for _, p := range mergePrefixes(z.Deny) {
			deny4 = append(deny4, ifPrefix{n, p})
		}
	}
	ifSet := func(name string, members []string) {
		s := &SetSpec{Name: name, KeyType: nftables.TypeIFName}
		for _, n := range members {
			s.Elements = append(s.Elements, nftables.SetElement{Key: ifname(n)})
			s.Text = append(s.Text, n)
		}
		rs.Sets = append(rs.Sets, s)
	}
	ifSet(SetEgressNone, none)
	ifSet(SetEgressAllowlist, allow)
	ifSet(SetEgressDNS, dns)
	ifSet(SetEgressDNSZone, dnsZone)
	ifAddr := nftables.MustConcatSetType(nftables.TypeIFName, nftables.TypeIPAddr)
	rangeSet := func(name string, members []ifPrefix) {
		s := &SetSpec{Name: name, KeyType: ifAddr, Concat: true, Interval: true}
		for _, m := range members {
			s.Elements = append(s.Elements, nftables.SetElement{
				Key:    append(ifname(m.ifname), m.r.from.AsSlice()...),
				KeyEnd: append(ifname(m.ifname), m.r.to.AsSlice()...)})
			s.Text = append(s.Text, fmt.Sprintf("%s . %s", m.ifname, rangeText(m.r)))
		}
		rs.Sets = append(rs.Sets, s)
	}
	rangeSet(SetEgressAllow4, allow4)
	rangeSet(SetEgressDeny4, deny4)
	rs.Sets = append(rs.Sets,
		&SetSpec{Name: SetEgressLearned4, KeyType: ifAddr, Concat: true, Timeout: true, Dynamic: true, Size: EgressLearnedSize},
		&SetSpec{Name: SetEgressLearnedPorts4, KeyType: nftables.MustConcatSetType(nftables.TypeIFName, nftables.TypeIPAddr, nftables.TypeInetService),
			Concat: true, Timeout: true, Dynamic: true, Size: EgressLearnedSize},
		&SetSpec{Name: SetEgressPeekPorts, KeyType: nftables.TypeInetService,
			Elements: []nftables.SetElement{{Key: be16(80)}, {Key: be16(443)}}, Text: []string{"80", "443"}},
		&SetSpec{Name: SetEgressDenied, KeyType: nftables.TypeIFName, Timeout: true, Dynamic: true, Eval: true, Size: EgressDeniedIfSize},
		&SetSpec{Name: SetEgressDenied4, KeyType: ifAddr, Concat: true, Timeout: true, Dynamic: true, Eval: true, Size: EgressDeniedSize})
	addEgressRules(rs, cfg.Egress)
	return nil
}

// ifPrefix is one member of an interface . address range set.
type ifPrefix struct {
	ifname string
	r      addrRange
}

// ifDaddr loads iifname . ip daddr into registers 1 and 2 (a concatenation
// key for the egress range and learned sets); IPv4 only.
func ifDaddr() []expr.Any {
	return append(nfproto(unix.NFPROTO_IPV4), meta(expr.MetaKeyIIFNAME),
		&expr.Payload{DestRegister: 2, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4})
}

// noteIn updates set with the key in register 1 (and on), refreshing the
// member's timeout and counting the packet in its counter.
func noteIn(set string) *expr.Dynset {
	return &expr.Dynset{SrcRegKey: 1, SetName: set, Operation: unix.NFT_DYNSET_OP_UPDATE,
		Timeout: EgressDeniedTTL, Exprs: []expr.Any{&expr.Counter{}}}
}

func markIs(m uint32) []expr.Any {
	return []expr.Any{&expr.Meta{Key: expr.MetaKeyMARK, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binary.NativeEndian.AppendUint32(nil, m)}}
}

// ctDNAT matches connections whose destination was rewritten (our redirect).
func ctDNAT() []expr.Any {
	return []expr.Any{&expr.Ct{Key: expr.CtKeySTATUS, Register: 1},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binary.NativeEndian.AppendUint32(nil, 0x20), Xor: []byte{0, 0, 0, 0}}, // IPS_DST_NAT
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: []byte{0, 0, 0, 0}}}
}

func portIs(proto byte, port uint16) []expr.Any {
	return append(l4proto(proto), dport(), &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: be16(port)})
}

func redirectTo(port uint16) []expr.Any {
	return []expr.Any{&expr.Immediate{Register: 1, Data: be16(port)},
		// the kernel stores max = min and the proto-specified flag
		&expr.Redir{RegisterProtoMin: 1, RegisterProtoMax: 1, Flags: unix.NF_NAT_RANGE_PROTO_SPECIFIED}}
}

func addEgressRules(rs *Ruleset, ec EgressConfig) {
	dnsPort, proxyPort, mark := ec.ports()
	chain := func(name string) *ChainSpec {
		for _, c := range rs.Chains {
			if c.Name == name {
				return c
			}
		}
		panic("egress: no chain " + name)
	}
	fwd := chain("forward")
	toDrop := &expr.Verdict{Kind: expr.VerdictJump, Chain: chainEgressDrop}
	fwd.Rules = append(fwd.Rules,
		rule("egress-none", "iifname @egress_none oifname @mgmt counter jump egress_drop",
			meta(expr.MetaKeyIIFNAME), lookup(SetEgressNone, false),
			meta(expr.MetaKeyOIFNAME), lookup(SetMgmt, false), toDrop),
		rule("egress-deny", "oifname @mgmt meta nfproto ipv4 iifname . ip daddr @egress_deny4 counter jump egress_drop",
			meta(expr.MetaKeyOIFNAME), lookup(SetMgmt, false), ifDaddr(), lookup(SetEgressDeny4, false), toDrop),
		rule("egress-allowlist", "iifname @egress_allowlist oifname @mgmt counter jump "+chainEgressAllowlist,
			meta(expr.MetaKeyIIFNAME), lookup(SetEgressAllowlist, false),
			meta(expr.MetaKeyOIFNAME), lookup(SetMgmt, false),
			&expr.Counter{}, &expr.Verdict{Kind: expr.VerdictJump, Chain: chainEgressAllowlist}),
	)
	// What an allow-list zone may send through the uplink unchecked: its
	// CIDRs (every port and protocol) and the tcp ports of its name:port
	// entries on the addresses those names resolved to. A name-learned
	// address is no pass on its own: tcp 80/443 to it were redirected to
	// the Host/SNI check in prerouting and never get here; every other
	// port and protocol to it (QUIC on udp 443, TLS on 8443, SSH) is
	// dropped. Forwarded packets are checked every one (no established
	// shortcut), so a forgotten address cuts flows already open.
	rs.Chains = append(rs.Chains, &ChainSpec{Name: chainEgressAllowlist, Rules: []*RuleSpec{
		rule("egress-allow-cidr", "meta nfproto ipv4 iifname . ip daddr @egress_allow4 counter return",
			ifDaddr(), lookup(SetEgressAllow4, false), &expr.Verdict{Kind: expr.VerdictReturn}),
		rule("egress-allow-port", "meta l4proto tcp meta nfproto ipv4 iifname . ip daddr . tcp dport @egress_learned_ports4 counter return",
			l4proto(unix.IPPROTO_TCP), ifDaddr(),
			// the port goes into the 32-bit register after the address
			// (NFT_REG32_05): concatenations pad each part to 4 bytes
			&expr.Payload{DestRegister: 13, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
			lookup(SetEgressLearnedPorts4, false), &expr.Verdict{Kind: expr.VerdictReturn}),
		rule("egress-allowlist-drop", "counter jump egress_drop", toDrop),
	}})
	// Only packets the rules above drop get here: the updates note them
	// per interface and per destination (no work for allowed traffic).
	// An update that cannot add a member (set full) ends its own rule
	// only; the last rule drops whatever happened before it.
	ttl := fmt.Sprintf("timeout %ds", int(EgressDeniedTTL.Seconds()))
	rs.Chains = append(rs.Chains, &ChainSpec{Name: chainEgressDrop, Rules: []*RuleSpec{
		{Comment: "egress-denied-iface", Text: "update @egress_denied { iifname " + ttl + " counter }",
			Exprs: []expr.Any{meta(expr.MetaKeyIIFNAME), noteIn(SetEgressDenied)}},
		{Comment: "egress-denied-dest", Text: "meta nfproto ipv4 update @egress_denied4 { iifname . ip daddr " + ttl + " counter }",
			Exprs: append(ifDaddr(), noteIn(SetEgressDenied4))},
		rule("egress-denied-drop", "counter drop", drop()),
	}})
	nat := &ChainSpec{Name: chainEgressNAT, Hook: nftables.ChainHookPrerouting, HookName: "prerouting",
		Type: nftables.ChainTypeNAT, Priority: -100}
	nat.Rules = []*RuleSpec{
		rule("egress-dns-udp", fmt.Sprintf("iifname @egress_dns udp dport 53 counter redirect to :%d", dnsPort),
			meta(expr.MetaKeyIIFNAME), lookup(SetEgressDNS, false), portIs(unix.IPPROTO_UDP, 53), redirectTo(dnsPort)),
		rule("egress-dns-tcp", fmt.Sprintf("iifname @egress_dns tcp dport 53 counter redirect to :%d", dnsPort),
			meta(expr.MetaKeyIIFNAME), lookup(SetEgressDNS, false), portIs(unix.IPPROTO_TCP, 53), redirectTo(dnsPort)),
		rule("egress-dns-zone-udp", fmt.Sprintf("iifname @egress_dns_zone udp dport 53 fib daddr . iif type local counter redirect to :%d", dnsPort),
			meta(expr.MetaKeyIIFNAME), lookup(SetEgressDNSZone, false), portIs(unix.IPPROTO_UDP, 53), daddrOnIIF(), redirectTo(dnsPort)),
		rule("egress-dns-zone-tcp", fmt.Sprintf("iifname @egress_dns_zone tcp dport 53 fib daddr . iif type local counter redirect to :%d", dnsPort),
			meta(expr.MetaKeyIIFNAME), lookup(SetEgressDNSZone, false), portIs(unix.IPPROTO_TCP, 53), daddrOnIIF(), redirectTo(dnsPort)),
		rule("egress-peek", fmt.Sprintf("iifname @egress_allowlist tcp dport @egress_peek_ports meta nfproto ipv4 iifname . ip daddr != @egress_allow4 iifname . ip daddr @egress_learned4 counter redirect to :%d", proxyPort),
			meta(expr.MetaKeyIIFNAME), lookup(SetEgressAllowlist, false),
			l4proto(unix.IPPROTO_TCP), dport(), lookup(SetEgressPeekPorts, false),
			ifDaddr(), lookup(SetEgressAllow4, true), lookup(SetEgressLearned4, false), redirectTo(proxyPort)),
	}
	rs.Chains = append(rs.Chains, nat)

	gin := chain(chainGuestIn)
	// before the established rule: a datagram that reuses the 5-tuple of
	// a query the guest sent the ordinary way is established too
	at := slices.IndexFunc(gin.Rules, func(r *RuleSpec) bool { return r.Comment == "guest-established" })
	if at < 0 {
		panic("egress: no guest-established rule in " + chainGuestIn)
	}
	gin.Rules = slices.Insert(gin.Rules, at, redirectedRPF(dnsPort, proxyPort)...)
	last := gin.Rules[len(gin.Rules)-1]
	gin.Rules = append(gin.Rules[:len(gin.Rules)-1],
		rule("egress-resolver-udp", fmt.Sprintf("udp dport %d ct status dnat counter accept", dnsPort),
			portIs(unix.IPPROTO_UDP, dnsPort), ctDNAT(), accept()),
		rule("egress-resolver-tcp", fmt.Sprintf("tcp dport %d ct status dnat counter accept", dnsPort),
			portIs(unix.IPPROTO_TCP, dnsPort), ctDNAT(), accept()),
		rule("egress-proxy", fmt.Sprintf("tcp dport %d ct status dnat counter accept", proxyPort),
			portIs(unix.IPPROTO_TCP, proxyPort), ctDNAT(), accept()),
		last)

	out := chain("output")
	out.Rules = append(out.Rules,
		rule("egress-proxy-lockdown", fmt.Sprintf("meta mark %#x oifname @lockdown counter drop", mark),
			markIs(mark), meta(expr.MetaKeyOIFNAME), lookup(SetLockdown, false), drop()),
		rule("egress-resolver-lockdown", fmt.Sprintf("meta mark %#x oifname @lockdown counter drop", mark+1),
			markIs(mark+1), meta(expr.MetaKeyOIFNAME), lookup(SetLockdown, false), drop()),
		rule("egress-proxy-uplink", fmt.Sprintf("meta mark %#x oifname != @mgmt counter drop", mark),
			markIs(mark), meta(expr.MetaKeyOIFNAME), lookup(SetMgmt, true), drop()),
		rule("egress-proxy-ipv6", fmt.Sprintf("meta mark %#x meta nfproto ipv6 counter drop", mark),
			markIs(mark), nfproto(unix.NFPROTO_IPV6), drop()),
		rule("egress-proxy-private", fmt.Sprintf("meta mark %#x ip daddr @private4 ip daddr != @private4_allow counter drop", mark),
			markIs(mark), nfproto(unix.NFPROTO_IPV4), ipDaddr(4), lookup(SetPrivate4, false), lookup(SetPrivate4Allow, true), drop()),
		rule("egress-proxy-metadata", fmt.Sprintf("meta mark %#x ip daddr @metadata4 counter drop", mark),
			markIs(mark), nfproto(unix.NFPROTO_IPV4), ipDaddr(4), lookup(SetMetadata4, false), drop()),
		rule("egress-proxy-uplink-subnet", fmt.Sprintf("meta mark %#x ip daddr @uplink_nets4 ip daddr != @private4_allow counter drop", mark),
			markIs(mark), nfproto(unix.NFPROTO_IPV4), ipDaddr(4), lookup(SetUplinkNets4, false), lookup(SetPrivate4Allow, true), drop()),
	)
}

// redirectedRPF drops, on the resolver's and the proxy's ports, what
// came in on an interface its source address does not route back
// through: the resolver names a UDP query's zone by the interface it came
// in on (IP_PKTINFO), the proxy and the resolver's TCP listener a
// connection by the interface of its handshake's ACK, and the layer-2
// table pins guest ports, not a zone's VXLAN or VLAN uplink port, so a
// packet carrying a zone A guest's address could come in on zone B's
// bridge (an accomplice on the underlay) and be answered under B's
// policy, the answer routed to A's guest. A Proxmox VE node's own source
// check is loose at most (pve-firewall sets all.rp_filter 2), which
// passes it. This is the strict check for these packets alone (the
// kernel's FIB lookup of the source; for IPv4 the route it finds must
// go out through the input interface, a VRF's device matching the
// routes of its ports; for IPv6 the lookup is restricted to it). A route
// through the bridge passes (a guest outside the bridge's subnet but
// routed to it); two bridges holding one IPv4 subnet cannot be told
// apart by the source: the lookup finds one route, and the other
// bridge's guests are dropped here (they get no reply routed to them
// from the node either).
func redirectedRPF(dnsPort, proxyPort uint16) []*RuleSpec {
	offIIF := []expr.Any{
		&expr.Fib{Register: 1, FlagSADDR: true, FlagIIF: true, ResultOIF: true, FlagPRESENT: true},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{0, 0, 0, 0}},
	}
	return []*RuleSpec{
		rule("egress-rpf-resolver-udp", fmt.Sprintf("udp dport %d fib saddr . iif oif missing counter drop", dnsPort),
			portIs(unix.IPPROTO_UDP, dnsPort), offIIF, drop()),
		rule("egress-rpf-resolver-tcp", fmt.Sprintf("tcp dport %d fib saddr . iif oif missing counter drop", dnsPort),
			portIs(unix.IPPROTO_TCP, dnsPort), offIIF, drop()),
		rule("egress-rpf-proxy", fmt.Sprintf("tcp dport %d fib saddr . iif oif missing counter drop", proxyPort),
			portIs(unix.IPPROTO_TCP, proxyPort), offIIF, drop()),
	}
}

// SetEgress replaces the egress policies of the run-time zones (zone id ->
// policy with its bridges). Every other guest interface gets the
// configured default. One batch; rules and counters stay; it returns once
// the kernel holds the new sets.
func (g *Guard) SetEgress(ctx context.Context, policies map[string]ZoneEgress) error {
	cp, err := cloneEgress(policies)
	if err != nil {
		return fmt.Errorf("set egress: %w", err)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	prev := g.egress
	g.egress = cp
	if err := g.applyZonesLocked(ctx, g.state, g.sw, g.zones); err != nil {
		g.egress = prev
		return fmt.Errorf("set egress: %w", err)
	}
	return nil
}

// cloneEgress validates and copies policies (an empty mode is open).
func cloneEgress(policies map[string]ZoneEgress) (map[string]ZoneEgress, error) {
	cp := make(map[string]ZoneEgress, len(policies))
	for id, z := range policies {
		if err := z.validate(); err != nil {
			return nil, fmt.Errorf("zone %s: %w", id, err)
		}
		if z.Mode == "" {
			z.Mode = EgressOpen
		}
		cp[id] = ZoneEgress{Bridges: slices.Clone(z.Bridges), Mode: z.Mode, Allow: slices.Clone(z.Allow), Deny: slices.Clone(z.Deny)}
	}
	return cp, nil
}

// EgressOf returns the egress policy in force for guest interface ifname
// and whether the interface is a guest interface at all (not lo,
// management or trusted). Unknown interfaces get the default.
func (g *Guard) EgressOf(iface string) (ZoneEgress, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	cfg := g.renderConfig(g.zones)
	cls := g.state
	if !slices.Contains(cls.Interfaces, iface) {
		cls.Interfaces = append(slices.Clone(cls.Interfaces), iface)
	}
	z, ok := egressByInterface(cfg, cls)[iface]
	return z, ok
}

// ZoneOfBridge names the zone whose bridge iface is (a configured or a
// run-time zone, by its own id; the lowest id if several hold it). The
// egress part makes each zone without a policy of its own an owner of its
// own quotas.
func (g *Guard) ZoneOfBridge(iface string) (string, bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	ids := g.zoneOf[iface]
	if len(ids) == 0 {
		return "", false
	}
	_, id, _ := strings.Cut(slices.Min(ids), ":")
	return id, true
}

// ErrNotGuest is returned by Learn for an interface that is not a guest
// interface (lo, management, trusted).
var ErrNotGuest = errors.New("not a guest interface")

// Opening is what a learned address opens for its interface.
type Opening struct {
	// Checked opens tcp 80 and 443 through the Host/SNI check
	// (@egress_learned4: the guard redirects them to the proxy).
	Checked bool
	// Ports are tcp ports opened by address alone, no name checked
	// (@egress_learned_ports4: name:port entries).
	Ports []uint16
}

// Learn adds addresses to @egress_learned4 for guest interface ifname
// (tcp 80/443 through the Host/SNI check; see LearnOpen).
func (g *Guard) Learn(ctx context.Context, iface string, addrs []netip.Addr, ttl time.Duration) (skipped []netip.Addr, err error) {
	return g.LearnOpen(ctx, iface, addrs, Opening{Checked: true}, ttl)
}

// LearnOpen opens addrs for guest interface ifname as open says, each
// member expiring after ttl (at least one second), in one batch. A member
// already there gets the new timeout. Only IPv4 addresses outside the
// private, metadata and uplink ranges are accepted; others are skipped
// and returned.
func (g *Guard) LearnOpen(ctx context.Context, iface string, addrs []netip.Addr, open Opening, ttl time.Duration) (skipped []netip.Addr, err error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if ttl < time.Second {
		ttl = time.Second
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.desired == nil {
		return nil, errors.New("learn: guard not started")
	}
	if iface == "lo" || slices.Contains(g.state.Management, iface) || slices.Contains(g.state.Trusted, iface) {
		return nil, fmt.Errorf("learn for %s: %w", iface, ErrNotGuest)
	}
	var checked, ports []nftables.SetElement
	for _, a := range addrs {
		if !g.learnableLocked(a) {
			skipped = append(skipped, a)
			continue
		}
		key := append(ifname(iface), a.AsSlice()...)
		if open.Checked {
			checked = append(checked, nftables.SetElement{Key: key, Timeout: ttl})
		}
		for _, p := range open.Ports {
			ports = append(ports, nftables.SetElement{Key: append(slices.Clone(key), be16(p)[0], be16(p)[1], 0, 0), Timeout: ttl})
		}
	}
	if len(checked)+len(ports) == 0 {
		return skipped, nil
	}
	sets := newSetObjects(&nftables.Table{Name: TableName, Family: family}, g.desired)
	// delete-then-add refreshes the timeout of a member already there;
	// the delete of an absent member would fail the batch, so add first
	// (a no-op for a present one), then delete and add again.
	for _, q := range []struct {
		set *nftables.Set
		els []nftables.SetElement
	}{{sets[SetEgressLearned4], checked}, {sets[SetEgressLearnedPorts4], ports}} {
		if len(q.els) == 0 {
			continue
		}
		for _, op := range []func(*nftables.Set, []nftables.SetElement) error{g.conn.SetAddElements, g.conn.SetDeleteElements, g.conn.SetAddElements} {
			if err := op(q.set, q.els); err != nil {
				return nil, fmt.Errorf("learn: %w", err)
			}
		}
	}
	if err := g.conn.Flush(); err != nil {
		return nil, fmt.Errorf("learn: %w", err)
	}
	return skipped, nil
}

// learnableLocked reports whether a name-learned address may be opened:
// IPv4, not in @private4 (unless allowed), @metadata4 or the uplink
// subnets. Defence in depth: the forward rules drop those anyway.
func (g *Guard) learnableLocked(a netip.Addr) bool {
	if !a.Is4() {
		return false
	}
	in := func(ps []netip.Prefix) bool {
		for _, p := range ps {
			if p.Contains(a) {
				return true
			}
		}
		return false
	}
	if in(g.cfg.Private4Allow) {
		return !in(DefaultMetadata4()) && !in(g.cfg.Metadata4)
	}
	return !in(DefaultPrivate4()) && !in(DefaultMetadata4()) && !in(g.cfg.Metadata4) && !in(g.state.UplinkNets)
}

// Forget removes every learned address of the given interfaces (a policy
// changed, so what the old one learned must not stay open), in one batch.
// A member that expires between the listing and the batch fails the
// batch; it is then listed and sent once more.
func (g *Guard) Forget(ctx context.Context, ifnames []string) error {
	want := map[string]bool{}
	for _, n := range ifnames {
		want[string(ifname(n))] = true
	}
	return g.forgetWhere(ctx, func(key string) bool { return want[key] })
}

// ForgetExcept removes the learned addresses of every interface not in
// keep (a daemon starting with changed policies: only the zones whose
// persisted policy is still in force keep what they learned).
func (g *Guard) ForgetExcept(ctx context.Context, keep []string) error {
	kept := map[string]bool{}
	for _, n := range keep {
		kept[string(ifname(n))] = true
	}
	return g.forgetWhere(ctx, func(key string) bool { return !kept[key] })
}

// forgetWhere removes the members of both learned sets whose interface
// (the padded key prefix) gone reports true for.
func (g *Guard) forgetWhere(ctx context.Context, gone func(key string) bool) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.desired == nil {
		return errors.New("forget: guard not started")
	}
	sets := newSetObjects(&nftables.Table{Name: TableName, Family: family}, g.desired)
	var err error
	for range 2 {
		if err = g.forgetOnce([]*nftables.Set{sets[SetEgressLearned4], sets[SetEgressLearnedPorts4]}, gone); err == nil || !errors.Is(err, unix.ENOENT) {
			break
		}
	}
	if err != nil {
		return fmt.Errorf("forget: %w", err)
	}
	return nil
}

func (g *Guard) forgetOnce(sets []*nftables.Set, gone func(key string) bool) error {
	del := make([][]nftables.SetElement, len(sets))
	n := 0
	for i, set := range sets {
		els, err := g.conn.GetSetElements(set)
		if err != nil {
			return fmt.Errorf("list learned: %w", err)
		}
		for _, e := range els {
			if len(e.Key) >= unix.IFNAMSIZ && gone(string(e.Key[:unix.IFNAMSIZ])) {
				del[i] = append(del[i], nftables.SetElement{Key: e.Key})
			}
		}
		n += len(del[i])
	}
	if n == 0 {
		return nil
	}
	for i, set := range sets {
		if len(del[i]) == 0 {
			continue
		}
		if err := g.conn.SetDeleteElements(set, del[i]); err != nil {
			return err
		}
	}
	return g.conn.Flush()
}

// EgressDrop is one member of the denial sets: the packets the egress
// rules dropped from Iface (to Addr, when valid) since the member was
// created, and their bytes (the member's counter counts both; IP bytes,
// headers included, as the forward hook sees them). A member not hit for
// EgressDeniedTTL expires; a new one starts from zero.
type EgressDrop struct {
	Iface          string
	Addr           netip.Addr
	Packets, Bytes uint64
}

// EgressDrops reads the denial sets: the per interface counts and the
// per destination ones.
func (g *Guard) EgressDrops(ctx context.Context) (ifaces, dests []EgressDrop, err error) {
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.desired == nil {
		return nil, nil, errors.New("egress drops: guard not started")
	}
	sets := newSetObjects(&nftables.Table{Name: TableName, Family: family}, g.desired)
	read := func(name string) ([]EgressDrop, error) {
		els, err := g.conn.GetSetElements(sets[name])
		if err != nil {
			return nil, fmt.Errorf("egress drops: list %s: %w", name, err)
		}
		out := make([]EgressDrop, 0, len(els))
		for _, e := range els {
			if len(e.Key) < unix.IFNAMSIZ || e.Counter == nil {
				continue
			}
			d := EgressDrop{Iface: string(bytes.TrimRight(e.Key[:unix.IFNAMSIZ], "\x00")), Packets: e.Counter.Packets, Bytes: e.Counter.Bytes}
			if a, ok := netip.AddrFromSlice(e.Key[unix.IFNAMSIZ:]); ok && len(e.Key) == unix.IFNAMSIZ+4 {
				d.Addr = a
			}
			out = append(out, d)
		}
		return out, nil
	}
	if ifaces, err = read(SetEgressDenied); err != nil {
		return nil, nil, err
	}
	if dests, err = read(SetEgressDenied4); err != nil {
		return nil, nil, err
	}
	return ifaces, dests, nil
}
