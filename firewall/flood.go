package firewall

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// Names of the flood sets and chains (the control plane under a guest
// flood, issue 34).
const (
	// SetMgmtPorts are the node's management TCP ports: connection
	// tracking skips them on the management interfaces and on lo.
	SetMgmtPorts = "mgmt_ports"
	// SetGuestRate holds one packet policer per guest interface.
	SetGuestRate = "guest_rate"
	// SetGuestConns holds one connection count per guest interface.
	SetGuestConns = "guest_conns"
	// SetGuestDNSRate holds one DNS packet policer per guest interface.
	SetGuestDNSRate = "guest_dns_rate"
	// SetPortARPRate and SetPortBcastRate hold one policer per guest
	// bridge port (table bridge pve-inspect).
	SetPortARPRate   = "port_arp_rate"
	SetPortBcastRate = "port_bcast_rate"

	chainRawOut = "raw_out"
	chainFlood  = "flood"
)

// Defaults of FloodConfig.
const (
	// DefaultConnLimit is how many tracked connections one guest
	// interface (a zone's bridge, all its guests) may hold:
	// DefaultNodeConnLimit shared by 64 zones (the daemon's default
	// [egress] owners), so every zone at its limit fits the node-wide
	// bound together.
	DefaultConnLimit = 2048
	// DefaultPacketRate and DefaultPacketBurst police the packets one
	// guest interface sends to the node or through it. A virtio NIC hands
	// the bridge GRO-merged packets (up to 64 KiB each), so bulk traffic
	// stays far below the rate; a flood of small packets does not.
	DefaultPacketRate  = 50000
	DefaultPacketBurst = 10000
	// DefaultDNSRate and DefaultDNSBurst police the DNS packets (udp and
	// tcp to port 53) one guest interface sends, before they reach the
	// node's resolvers: a zone's guests resolve a few names a second, and
	// one zone's flood cannot fill the resolver socket every zone shares.
	DefaultDNSRate  = 500
	DefaultDNSBurst = 1000
	// DefaultNodeConnLimit is how many tracked connections all guest
	// interfaces together may hold: well under pve-firewall's
	// nf_conntrack_max of 262144 (src/PVE/Firewall.pm
	// update_nf_conntrack_max, the host option nf_conntrack_max), so
	// guests of many zones cannot fill the node's conntrack table.
	DefaultNodeConnLimit = 131072
	// DefaultPortARPRate and DefaultPortARPBurst police the ARP frames of
	// one guest port (a guest resolves its gateway and neighbours, a few
	// frames a second).
	DefaultPortARPRate  = 100
	DefaultPortARPBurst = 200
	// DefaultPortBroadcastRate and DefaultPortBroadcastBurst police the
	// broadcast and multicast frames of one guest port (ARP requests,
	// DHCP discovers, mDNS).
	DefaultPortBroadcastRate  = 200
	DefaultPortBroadcastBurst = 400

	// FloodSetSize bounds each per-interface and per-port set; members of
	// the policer sets expire after FloodRateTTL without a packet, those
	// of the connection count set once their interface has no tracked
	// connection left.
	FloodSetSize = 4096
	FloodRateTTL = time.Minute
)

// DefaultManagementPorts are the node's management TCP ports: SSH and the
// Proxmox API (pveproxy). The daemon adds its API and metrics ports.
func DefaultManagementPorts() []uint16 { return []uint16{22, 8006} }

// FloodConfig bounds what one guest interface or port can do to the
// node's control plane. Zero values mean the defaults.
type FloodConfig struct {
	// ManagementPorts are TCP ports of the node exempt from connection
	// tracking on the management interfaces and on lo, both directions: a
	// conntrack table guests filled cannot refuse them. nil means
	// DefaultManagementPorts.
	ManagementPorts []uint16
	// ConnLimit is how many tracked connections one guest interface may
	// hold; its new connections beyond are dropped.
	ConnLimit uint32
	// NodeConnLimit is how many tracked connections all guest interfaces
	// together may hold; new guest connections beyond are dropped.
	NodeConnLimit uint32
	// DNSRate and DNSBurst police each guest interface's DNS packets
	// (udp and tcp to port 53), before the egress redirects.
	DNSRate, DNSBurst uint32
	// PacketRate (packets a second) and PacketBurst police every guest
	// interface's packets to and through the node, before connection
	// tracking.
	PacketRate, PacketBurst uint32
	// PortARPRate and PortARPBurst police each guest port's ARP frames.
	PortARPRate, PortARPBurst uint32
	// PortBroadcastRate and PortBroadcastBurst police each guest port's
	// broadcast and multicast frames.
	PortBroadcastRate, PortBroadcastBurst uint32
}

// withDefaults returns c with every zero value replaced by its default.
func (c FloodConfig) withDefaults() FloodConfig {
	def := func(v *uint32, d uint32) {
		if *v == 0 {
			*v = d
		}
	}
	def(&c.ConnLimit, DefaultConnLimit)
	def(&c.NodeConnLimit, DefaultNodeConnLimit)
	def(&c.DNSRate, DefaultDNSRate)
	def(&c.DNSBurst, DefaultDNSBurst)
	def(&c.PacketRate, DefaultPacketRate)
	def(&c.PacketBurst, DefaultPacketBurst)
	def(&c.PortARPRate, DefaultPortARPRate)
	def(&c.PortARPBurst, DefaultPortARPBurst)
	def(&c.PortBroadcastRate, DefaultPortBroadcastRate)
	def(&c.PortBroadcastBurst, DefaultPortBroadcastBurst)
	if c.ManagementPorts == nil {
		c.ManagementPorts = DefaultManagementPorts()
	}
	c.ManagementPorts = slices.Clone(c.ManagementPorts)
	slices.Sort(c.ManagementPorts)
	c.ManagementPorts = slices.Compact(c.ManagementPorts)
	return c
}

func (c FloodConfig) validate() error {
	if slices.Contains(c.ManagementPorts, 0) {
		return fmt.Errorf("management port 0")
	}
	return nil
}

// guestSide matches packets from a guest interface: not lo, not a
// management or trusted interface (the input policy's test).
func guestSide() []expr.Any {
	return []expr.Any{meta(expr.MetaKeyIIFNAME), &expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: ifname("lo")},
		lookup(SetMgmt, true), lookup(SetTrusted, true)}
}

// policer is "update @set { <key> timeout 60s limit rate over r/second
// burst b packets }": it matches the packets of a key past its rate.
func policer(set string, rate, burst uint32) *expr.Dynset {
	return &expr.Dynset{SrcRegKey: 1, SetName: set, Operation: unix.NFT_DYNSET_OP_UPDATE, Timeout: FloodRateTTL,
		Exprs: []expr.Any{&expr.Limit{Type: expr.LimitTypePkts, Rate: uint64(rate), Over: true, Unit: expr.LimitTimeSecond, Burst: burst}}}
}

func policerText(key string, rate, burst uint32) string {
	return fmt.Sprintf("%s timeout %ds limit rate over %d/second burst %d packets", key, int(FloodRateTTL.Seconds()), rate, burst)
}

// evalSet is a set the packet path fills, one member per interface.
func evalSet(name string, timeout bool) *SetSpec {
	return &SetSpec{Name: name, KeyType: nftables.TypeIFName, Timeout: timeout, Dynamic: true, Eval: true, Size: FloodSetSize}
}

// addFlood adds the flood protections to the inet table:
//
//   - prerouting (raw, before connection tracking): tcp to a management
//     port of the node on a management interface is not tracked; every
//     guest interface's packets pass a policer (dropped past the rate
//     before they cost a conntrack entry), and its DNS packets pass a
//     DNS policer (one zone's DNS flood cannot fill the resolver's socket
//     that every zone shares);
//   - raw_out (output, raw): the node's replies from a management port
//     on a management interface, and lo connections to or from one, are
//     not tracked;
//   - flood (prerouting, after connection tracking, before the egress
//     redirects): a guest interface's new connections beyond ConnLimit
//     tracked ones are dropped. NodeConnLimit is not a rule: one count of
//     every guest's connections is one list the kernel walks on a new
//     connection (nf_conncount, at most once a jiffy), which under a
//     flood cost the other zones their DNS; the config keeps ConnLimit
//     times the interfaces it admits under NodeConnLimit instead.
//
// Management traffic never meets the input policy's established rule (it
// arrives on @mgmt; guest_in is for guest interfaces only), so untracked
// packets lose nothing there.
func addFlood(rs *Ruleset, fc FloodConfig) error {
	fc = fc.withDefaults()
	if err := fc.validate(); err != nil {
		return fmt.Errorf("flood: %w", err)
	}
	ports := &SetSpec{Name: SetMgmtPorts, KeyType: nftables.TypeInetService}
	for _, p := range fc.ManagementPorts {
		ports.Elements = append(ports.Elements, nftables.SetElement{Key: be16(p)})
		ports.Text = append(ports.Text, strconv.Itoa(int(p)))
	}
	rs.Sets = append(rs.Sets, ports, evalSet(SetGuestRate, true), evalSet(SetGuestDNSRate, true), evalSet(SetGuestConns, false))

	tcpPort := func(off uint32) []expr.Any {
		return append(l4proto(unix.IPPROTO_TCP),
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: off, Len: 2},
			lookup(SetMgmtPorts, false))
	}
	dportOff, sportOff := uint32(2), uint32(0)
	notrack := []expr.Any{&expr.Counter{}, &expr.Notrack{}}
	pre := rs.chain("prerouting")
	pre.Rules = append(pre.Rules,
		rule("mgmt-notrack-in", "iifname @mgmt tcp dport @mgmt_ports fib daddr type local counter notrack",
			meta(expr.MetaKeyIIFNAME), lookup(SetMgmt, false), tcpPort(dportOff),
			&expr.Fib{Register: 1, FlagDADDR: true, ResultADDRTYPE: true},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binary.NativeEndian.AppendUint32(nil, unix.RTN_LOCAL)},
			notrack),
		rule("guest-flood-rate", `iifname != "lo" iifname != @mgmt iifname != @trusted update @guest_rate { `+
			policerText("iifname", fc.PacketRate, fc.PacketBurst)+" } counter drop",
			guestSide(), policer(SetGuestRate, fc.PacketRate, fc.PacketBurst), drop()),
		dnsPolicer("udp", unix.IPPROTO_UDP, fc),
		dnsPolicer("tcp", unix.IPPROTO_TCP, fc),
	)
	out := &ChainSpec{Name: chainRawOut, Hook: nftables.ChainHookOutput, HookName: "output", Priority: -300}
	out.Rules = []*RuleSpec{
		rule("mgmt-notrack-out", "oifname @mgmt tcp sport @mgmt_ports counter notrack",
			meta(expr.MetaKeyOIFNAME), lookup(SetMgmt, false), tcpPort(sportOff), notrack),
		rule("mgmt-notrack-lo", `oifname "lo" tcp dport @mgmt_ports counter notrack`,
			meta(expr.MetaKeyOIFNAME), &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifname("lo")}, tcpPort(dportOff), notrack),
		rule("mgmt-notrack-lo-reply", `oifname "lo" tcp sport @mgmt_ports counter notrack`,
			meta(expr.MetaKeyOIFNAME), &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifname("lo")}, tcpPort(sportOff), notrack),
	}
	fl := &ChainSpec{Name: chainFlood, Hook: nftables.ChainHookPrerouting, HookName: "prerouting", Priority: -150}
	fl.Rules = []*RuleSpec{
		rule("guest-flood-conns", fmt.Sprintf(`iifname != "lo" iifname != @mgmt iifname != @trusted ct state new add @guest_conns { iifname ct count over %d } counter drop`, fc.ConnLimit),
			guestSide(), ctStateNew(),
			meta(expr.MetaKeyIIFNAME),
			// a connection count cannot live in a set with timeouts: its
			// member goes when the interface's last connection does
			&expr.Dynset{SrcRegKey: 1, SetName: SetGuestConns, Operation: unix.NFT_DYNSET_OP_ADD,
				Exprs: []expr.Any{&expr.Connlimit{Count: fc.ConnLimit, Flags: expr.NFT_CONNLIMIT_F_INV}}},
			drop()),
	}
	rs.Chains = append(rs.Chains, out, fl)
	return nil
}

// ErrNodeConnLimit: the node-wide bound on guest connections is not below
// the node's nf_conntrack_max, so guests can still fill the conntrack
// table before the bound drops anything.
var ErrNodeConnLimit = errors.New("guard node_conn_limit is not below the node's nf_conntrack_max")

// CheckNodeConnLimit reads net.netfilter.nf_conntrack_max under procRoot
// ("/proc" when empty) and returns an error wrapping ErrNodeConnLimit
// when fc's NodeConnLimit is not below it (a read failure is returned as
// is: os.ErrNotExist when conntrack is not loaded).
func CheckNodeConnLimit(procRoot string, fc FloodConfig) error {
	if procRoot == "" {
		procRoot = "/proc"
	}
	fc = fc.withDefaults()
	b, err := os.ReadFile(filepath.Join(procRoot, "sys/net/netfilter/nf_conntrack_max"))
	if err != nil {
		return fmt.Errorf("read nf_conntrack_max: %w", err)
	}
	ctMax, err := strconv.ParseUint(strings.TrimSpace(string(b)), 10, 64)
	if err != nil {
		return fmt.Errorf("read nf_conntrack_max: %w", err)
	}
	if uint64(fc.NodeConnLimit) >= ctMax {
		return fmt.Errorf("%w: node_conn_limit %d, nf_conntrack_max %d: lower [guard] node_conn_limit or raise the host firewall's nf_conntrack_max",
			ErrNodeConnLimit, fc.NodeConnLimit, ctMax)
	}
	return nil
}

// ctStateNew matches "ct state new".
func ctStateNew() []expr.Any {
	return []expr.Any{&expr.Ct{Key: expr.CtKeySTATE, Register: 1},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binary.NativeEndian.AppendUint32(nil, expr.CtStateBitNEW), Xor: []byte{0, 0, 0, 0}},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: []byte{0, 0, 0, 0}}}
}

// dnsPolicer is the DNS policer's rule for one transport protocol: udp
// and tcp to port 53 share each interface's policer in @guest_dns_rate.
func dnsPolicer(proto string, p byte, fc FloodConfig) *RuleSpec {
	return rule("guest-dns-rate-"+proto, `iifname != "lo" iifname != @mgmt iifname != @trusted `+proto+` dport 53 update @guest_dns_rate { `+
		policerText("iifname", fc.DNSRate, fc.DNSBurst)+" } counter drop",
		guestSide(), l4proto(p), dport(), &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: be16(53)},
		meta(expr.MetaKeyIIFNAME), policer(SetGuestDNSRate, fc.DNSRate, fc.DNSBurst), drop())
}

// addBridgeFlood adds the per-port ARP and broadcast policers to the
// layer-2 table: first in port_guard, so a storm is cut before the
// per-frame checks and before it reaches the bridge's other ports.
func addBridgeFlood(rs *Ruleset, fc FloodConfig) {
	fc = fc.withDefaults()
	rs.Sets = append(rs.Sets, evalSet(SetPortARPRate, true), evalSet(SetPortBcastRate, true))
	g := rs.chain(chainPortGuard)
	g.Rules = append([]*RuleSpec{
		rule("arp-flood", "ether type arp update @port_arp_rate { "+policerText("iifname", fc.PortARPRate, fc.PortARPBurst)+" } counter drop",
			etherType(unix.ETH_P_ARP), meta(expr.MetaKeyIIFNAME), policer(SetPortARPRate, fc.PortARPRate, fc.PortARPBurst), drop()),
		rule("broadcast-flood", "ether daddr & 01:00:00:00:00:00 == 01:00:00:00:00:00 update @port_bcast_rate { "+
			policerText("iifname", fc.PortBroadcastRate, fc.PortBroadcastBurst)+" } counter drop",
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseLLHeader, Offset: 0, Len: 1},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 1, Mask: []byte{1}, Xor: []byte{0}},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{1}},
			meta(expr.MetaKeyIIFNAME), policer(SetPortBcastRate, fc.PortBroadcastRate, fc.PortBroadcastBurst), drop()),
	}, g.Rules...)
}

// chain returns the chain named name; it panics when there is none (a
// rendering bug).
func (r *Ruleset) chain(name string) *ChainSpec {
	for _, c := range r.Chains {
		if c.Name == name {
			return c
		}
	}
	panic("ruleset: no chain " + name)
}

// setFlags is the nft flags line of a set ("" for none).
func (s *SetSpec) setFlags() string {
	var f []string
	if s.Interval {
		f = append(f, "interval")
	}
	if s.Eval {
		f = append(f, "dynamic")
	}
	if s.Timeout {
		f = append(f, "timeout")
	}
	return strings.Join(f, ",")
}
