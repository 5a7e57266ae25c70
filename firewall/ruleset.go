package firewall

import (
	"encoding/binary"
	"fmt"
	"net/netip"
	"slices"
	"sort"
	"strings"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// Names of the table and its sets and chains.
const (
	TableName = "pve-inspect"

	SetMetadata4     = "metadata4"
	SetMetadata6     = "metadata6"
	SetPrivate4      = "private4"
	SetPrivate4Allow = "private4_allow"
	SetMgmt          = "mgmt"
	SetTrusted       = "trusted"
	SetLockdown      = "lockdown"
	SetFailClosed    = "failclosed"
	SetZonePeers     = "zone_peers"
	SetUplinkNets4   = "uplink_nets4"

	chainGuestIn = "guest_in"
)

// TableFlags are the flags the guard's table carries.
const TableFlags = nftables.TableFlagOwner | nftables.TableFlagPersist

// Classification is the current view of the node's interfaces.
type Classification struct {
	// Management are interfaces carrying a default route (v4 or v6,
	// multipath next hops included), sorted.
	Management []string
	// Trusted are the configured trusted interfaces, sorted.
	Trusted []string
	// Interfaces are all links of the node, sorted.
	Interfaces []string
	// UplinkNets are the IPv4 subnets of the management interfaces'
	// addresses (the segment other nodes and the router's admin side live
	// on) and their on-link routes, masked and sorted. Prefixes shorter
	// than /8 are left out.
	UplinkNets []netip.Prefix
	// Enslaved are the links that have a master (bridge ports), sorted by
	// port: the layer-2 table guards the guest ports of zone bridges.
	Enslaved []Enslaved
}

// Enslaved is one link with its master (a bridge port and its bridge).
type Enslaved struct {
	Port, Bridge string
}

// Equal reports whether two classifications are the same.
func (c Classification) Equal(o Classification) bool {
	return slices.Equal(c.Management, o.Management) && slices.Equal(c.Trusted, o.Trusted) &&
		slices.Equal(c.Interfaces, o.Interfaces) && slices.Equal(c.UplinkNets, o.UplinkNets) &&
		slices.Equal(c.Enslaved, o.Enslaved)
}

// Switches are the run-time states the lockdown controller flips.
type Switches struct {
	// Lockdown fills @lockdown with the management interfaces.
	Lockdown bool
	// FailClosed fills @failclosed with every protocol: blanket forward drop.
	FailClosed bool
}

// Ruleset is the desired content of table inet pve-inspect (or, with
// Family bridge, of the layer-2 table bridge pve-inspect), as data.
type Ruleset struct {
	// Family is the table's family; zero means inet.
	Family nftables.TableFamily
	Sets   []*SetSpec
	Chains []*ChainSpec
	// Notes are facts about the rendering an operator must see (plan,
	// status), e.g. a rule left out because its user does not exist.
	Notes []string

	// norm holds each rule's expressions as a verify compares them
	// (normalizedExprs), made once per rendering: a verify marshals only
	// what it reads. nil computes them each time.
	norm *exprCache
}

// SetSpec is one named set of the table.
type SetSpec struct {
	Name     string
	KeyType  nftables.SetDatatype
	Interval bool
	Concat   bool
	// Timeout gives the set the timeout flag: members may expire.
	Timeout bool
	// Dynamic sets are filled at run time by another writer (the egress
	// resolver's learned addresses): the guard creates them empty and
	// never compares or rewrites their members.
	Dynamic bool
	// Eval sets are updated from the packet path (an update expression in
	// a rule: nft flags dynamic); Size bounds their members.
	Eval     bool
	Size     uint32
	Elements []nftables.SetElement
	// Text is the readable form of each member, for plan and status.
	Text []string
}

// ChainSpec is one chain; Hook is nil for a regular chain.
type ChainSpec struct {
	Name     string
	Hook     *nftables.ChainHook
	HookName string
	// Type is the chain type; empty means filter.
	Type     nftables.ChainType
	Priority int32
	Rules    []*RuleSpec
}

// RuleSpec is one rule. Comment identifies it (kernel userdata comment,
// metric label); Text is its nft syntax.
type RuleSpec struct {
	Comment string
	Text    string
	Exprs   []expr.Any
}

// Set returns the set named name, or nil.
func (r *Ruleset) Set(name string) *SetSpec {
	for _, s := range r.Sets {
		if s.Name == name {
			return s
		}
	}
	return nil
}

func (r *Ruleset) family() nftables.TableFamily {
	if r.Family == nftables.TableFamilyUnspecified {
		return nftables.TableFamilyINet
	}
	return r.Family
}

// TableRef names the table, e.g. "table inet pve-inspect".
func (r *Ruleset) TableRef() string {
	name := "inet"
	switch r.family() {
	case nftables.TableFamilyBridge:
		name = "bridge"
	case nftables.TableFamilyARP:
		name = "arp"
	}
	return "table " + name + " " + TableName
}

// RuleCount is the number of rules in the ruleset.
func (r *Ruleset) RuleCount() int {
	n := 0
	for _, c := range r.Chains {
		n += len(c.Rules)
	}
	return n
}

// Render builds the desired ruleset from the configuration, the interface
// classification and the switches. It does not touch the kernel.
func Render(cfg Config, cls Classification, sw Switches) (*Ruleset, error) {
	rs := &Ruleset{norm: newExprCache()}

	addPrefixSet := func(name string, typ nftables.SetDatatype, ps []netip.Prefix) {
		m := mergePrefixes(ps)
		s := &SetSpec{Name: name, KeyType: typ, Interval: true, Elements: intervalElements(m)}
		for _, r := range m {
			s.Text = append(s.Text, rangeText(r))
		}
		rs.Sets = append(rs.Sets, s)
	}
	md4 := append(DefaultMetadata4(), cfg.Metadata4...)
	md6 := append(DefaultMetadata6(), cfg.Metadata6...)
	for _, p := range md4 {
		if !p.Addr().Is4() {
			return nil, fmt.Errorf("metadata4 entry %s is not IPv4", p)
		}
	}
	for _, p := range md6 {
		if !p.Addr().Is6() || p.Addr().Is4In6() {
			return nil, fmt.Errorf("metadata6 entry %s is not IPv6", p)
		}
	}
	for _, p := range cfg.Private4Allow {
		if !p.Addr().Is4() {
			return nil, fmt.Errorf("private4 allow entry %s is not IPv4", p)
		}
	}
	addPrefixSet(SetMetadata4, nftables.TypeIPAddr, md4)
	addPrefixSet(SetMetadata6, nftables.TypeIP6Addr, md6)
	addPrefixSet(SetPrivate4, nftables.TypeIPAddr, DefaultPrivate4())
	addPrefixSet(SetPrivate4Allow, nftables.TypeIPAddr, cfg.Private4Allow)
	addPrefixSet(SetUplinkNets4, nftables.TypeIPAddr, cls.UplinkNets)

	rs.Sets = append(rs.Sets, ifNameSet(SetMgmt, cls.Management), ifNameSet(SetTrusted, cls.Trusted),
		lockdownSet(cls, sw), failClosedSet(sw))

	zp := &SetSpec{Name: SetZonePeers, KeyType: nftables.MustConcatSetType(nftables.TypeIFName, nftables.TypeIFName), Concat: true}
	for _, p := range zonePeers(cfg.Zones, cls) {
		zp.Elements = append(zp.Elements, nftables.SetElement{Key: append(ifname(p[0]), ifname(p[1])...)})
		zp.Text = append(zp.Text, fmt.Sprintf("%s . %s", p[0], p[1]))
	}
	rs.Sets = append(rs.Sets, zp)
	rs.Sets = append(rs.Sets, guestAddrSets(nil)...)

	pre := &ChainSpec{Name: "prerouting", Hook: nftables.ChainHookPrerouting, HookName: "prerouting", Priority: -300}
	pre.Rules = []*RuleSpec{
		firewallBridgeZone(), // fwbridge.go
		rule("metadata4", "ip daddr @metadata4 counter drop",
			nfproto(unix.NFPROTO_IPV4), ipDaddr(4), lookup(SetMetadata4, false), drop()),
		rule("metadata6", "ip6 daddr @metadata6 counter drop",
			nfproto(unix.NFPROTO_IPV6), ipDaddr(6), lookup(SetMetadata6, false), drop()),
	}

	fwd := &ChainSpec{Name: "forward", Hook: nftables.ChainHookForward, HookName: "forward", Priority: -150}
	fwd.Rules = []*RuleSpec{
		rule("linklocal-saddr", "ip saddr 169.254.0.0/16 counter drop",
			nfproto(unix.NFPROTO_IPV4),
			&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: []byte{255, 255, 0, 0}, Xor: []byte{0, 0, 0, 0}},
			&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{169, 254, 0, 0}}, drop()),
		rule("ipv6", "meta nfproto ipv6 counter drop", nfproto(unix.NFPROTO_IPV6), drop()),
		rule("failclosed", "meta nfproto @failclosed counter drop",
			&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1}, lookup(SetFailClosed, false), drop()),
		rule("lockdown-in", "iifname @lockdown counter drop", meta(expr.MetaKeyIIFNAME), lookup(SetLockdown, false), drop()),
		rule("lockdown-out", "oifname @lockdown counter drop", meta(expr.MetaKeyOIFNAME), lookup(SetLockdown, false), drop()),
		firewallBridgeRouted(), // fwbridge.go
		rule("cross-zone", "iifname != @mgmt oifname != @mgmt iifname . oifname != @zone_peers counter drop",
			meta(expr.MetaKeyIIFNAME), lookup(SetMgmt, true),
			meta(expr.MetaKeyOIFNAME), lookup(SetMgmt, true),
			meta(expr.MetaKeyIIFNAME), &expr.Meta{Key: expr.MetaKeyOIFNAME, Register: 2},
			lookup(SetZonePeers, true), drop()),
	}
	fwd.Rules = append(fwd.Rules, routedRules()...)
	fwd.Rules = append(fwd.Rules,
		rule("private4", "oifname @mgmt ip daddr @private4 ip daddr != @private4_allow counter drop",
			meta(expr.MetaKeyOIFNAME), lookup(SetMgmt, false),
			nfproto(unix.NFPROTO_IPV4), ipDaddr(4), lookup(SetPrivate4, false), lookup(SetPrivate4Allow, true), drop()),
		rule("uplink-subnet", "oifname @mgmt ip daddr @uplink_nets4 ip daddr != @private4_allow counter drop",
			meta(expr.MetaKeyOIFNAME), lookup(SetMgmt, false),
			nfproto(unix.NFPROTO_IPV4), ipDaddr(4), lookup(SetUplinkNets4, false), lookup(SetPrivate4Allow, true), drop()),
	)

	in := &ChainSpec{Name: "input", Hook: nftables.ChainHookInput, HookName: "input", Priority: -150}
	in.Rules = []*RuleSpec{
		clearUpMark("guest-up-clear-in"),
		firewallBridgeInput(), // fwbridge.go
		rule("guest-input", `iifname != "lo" iifname != @mgmt iifname != @trusted counter jump guest_in`,
			meta(expr.MetaKeyIIFNAME), &expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: ifname("lo")},
			lookup(SetMgmt, true), lookup(SetTrusted, true),
			&expr.Counter{}, &expr.Verdict{Kind: expr.VerdictJump, Chain: chainGuestIn}),
	}
	gin := &ChainSpec{Name: chainGuestIn}
	gin.Rules = append(guestDHCPRules(),
		rule("guest-established", "ct state established,related counter accept",
			&expr.Ct{Key: expr.CtKeySTATE, Register: 1},
			&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
				Mask: binary.NativeEndian.AppendUint32(nil, expr.CtStateBitESTABLISHED|expr.CtStateBitRELATED),
				Xor:  []byte{0, 0, 0, 0}},
			&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: []byte{0, 0, 0, 0}}, accept()),
		// DHCP only to the guest's own bridge, like DNS: an address of it
		// (a renewal to the zone's dnsmasq) or the limited broadcast (a
		// client without a lease); not another zone's dnsmasq, nor the
		// management address
		rule("guest-dhcp", "udp dport 67-68 fib daddr . iif type local counter accept",
			l4proto(unix.IPPROTO_UDP), dport(),
			&expr.Cmp{Op: expr.CmpOpGte, Register: 1, Data: be16(67)},
			&expr.Cmp{Op: expr.CmpOpLte, Register: 1, Data: be16(68)}, daddrOnIIF(), accept()),
		rule("guest-dhcp-broadcast", "udp dport 67 ip daddr 255.255.255.255 counter accept",
			l4proto(unix.IPPROTO_UDP), dport(), &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: be16(67)},
			nfproto(unix.NFPROTO_IPV4), ipDaddr(4), &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{255, 255, 255, 255}}, accept()),
		// DNS only to an address of the guest's own bridge (the zone
		// resolver on its gateway): not to the node's other addresses, nor
		// to another zone's resolver
		rule("guest-dns-udp", "udp dport 53 fib daddr . iif type local counter accept",
			l4proto(unix.IPPROTO_UDP), dport(), &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: be16(53)}, daddrOnIIF(), accept()),
		rule("guest-dns-tcp", "tcp dport 53 fib daddr . iif type local counter accept",
			l4proto(unix.IPPROTO_TCP), dport(), &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: be16(53)}, daddrOnIIF(), accept()),
		rule("guest-input-drop", "counter drop", drop()),
	)

	out := &ChainSpec{Name: "output", Hook: nftables.ChainHookOutput, HookName: "output", Priority: -150}
	uid, ok, err := resolveUID(cfg.DnsmasqUser)
	if err != nil {
		return nil, fmt.Errorf("dnsmasq user: %w", err)
	}
	if ok {
		out.Rules = []*RuleSpec{
			rule("dnsmasq-lockdown", fmt.Sprintf("meta skuid %d oifname @lockdown counter drop", uid),
				&expr.Meta{Key: expr.MetaKeySKUID, Register: 1},
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binary.NativeEndian.AppendUint32(nil, uid)},
				meta(expr.MetaKeyOIFNAME), lookup(SetLockdown, false), drop()),
		}
	} else {
		rs.Notes = append(rs.Notes, fmt.Sprintf("dnsmasq user %q does not exist: output rule dnsmasq-lockdown left out", cfg.DnsmasqUser))
	}

	rs.Chains = []*ChainSpec{pre, fwd, in, gin, out}
	if err := addEgress(rs, cfg, cls); err != nil {
		return nil, err
	}
	if err := addFlood(rs, cfg.Flood); err != nil {
		return nil, err
	}
	return rs, nil
}

// ifNameSet is an interface-name set holding names.
func ifNameSet(name string, names []string) *SetSpec {
	s := &SetSpec{Name: name, KeyType: nftables.TypeIFName}
	for _, n := range sortedUnique(names) {
		s.Elements = append(s.Elements, nftables.SetElement{Key: ifname(n)})
		s.Text = append(s.Text, n)
	}
	return s
}

// lockdownSet is @lockdown: the management interfaces while the lockdown
// is on, empty otherwise.
func lockdownSet(cls Classification, sw Switches) *SetSpec {
	var lock []string
	if sw.Lockdown {
		lock = cls.Management
	}
	return ifNameSet(SetLockdown, lock)
}

// failClosedSet is @failclosed: every protocol while fail-closed is on.
func failClosedSet(sw Switches) *SetSpec {
	fc := &SetSpec{Name: SetFailClosed, KeyType: nftables.TypeNFProto}
	if sw.FailClosed {
		fc.Elements = []nftables.SetElement{{Key: []byte{unix.NFPROTO_IPV4}}, {Key: []byte{unix.NFPROTO_IPV6}}}
		fc.Text = []string{"ipv4", "ipv6"}
	}
	return fc
}

// zonePeers lists the (in, out) interface pairs forwarding may join without
// crossing a zone: every pair inside one configured zone, every interface
// with itself, every pair of trusted interfaces. Sorted, unique.
func zonePeers(zones map[string][]string, cls Classification) [][2]string {
	seen := map[[2]string]bool{}
	addAll := func(names []string) {
		for _, a := range names {
			for _, b := range names {
				seen[[2]string{a, b}] = true
			}
		}
	}
	for _, bridges := range zones {
		addAll(bridges)
	}
	addAll(cls.Trusted)
	for _, n := range cls.Interfaces {
		seen[[2]string{n, n}] = true
	}
	out := make([][2]string, 0, len(seen))
	for p := range seen {
		out = append(out, p)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i][0] != out[j][0] {
			return out[i][0] < out[j][0]
		}
		return out[i][1] < out[j][1]
	})
	return out
}

func sortedUnique(s []string) []string {
	s = slices.Clone(s)
	slices.Sort(s)
	return slices.Compact(s)
}

// ifname pads an interface name to IFNAMSIZ the way the kernel stores it.
func ifname(n string) []byte {
	b := make([]byte, unix.IFNAMSIZ)
	copy(b, n)
	return b
}

func be16(v uint16) []byte { return binary.BigEndian.AppendUint16(nil, v) }

// daddrOnIIF matches packets to an address of the interface they came in
// on: "fib daddr . iif type local".
func daddrOnIIF() []expr.Any {
	return []expr.Any{
		&expr.Fib{Register: 1, FlagDADDR: true, FlagIIF: true, ResultADDRTYPE: true},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binary.NativeEndian.AppendUint32(nil, unix.RTN_LOCAL)},
	}
}

// rule builds a rule from expressions and expression lists; every rule
// counts, so a counter goes right before the verdict unless one is there.
func rule(comment, text string, parts ...any) *RuleSpec {
	var exprs []expr.Any
	for _, p := range parts {
		switch v := p.(type) {
		case []expr.Any:
			exprs = append(exprs, v...)
		case expr.Any:
			exprs = append(exprs, v)
		default:
			panic(fmt.Sprintf("rule %s: bad part %T", comment, p))
		}
	}
	n := len(exprs)
	if n < 2 {
		exprs = []expr.Any{&expr.Counter{}, exprs[0]}
	} else if _, isCounter := exprs[n-2].(*expr.Counter); !isCounter {
		exprs = append(exprs[:n-1:n-1], &expr.Counter{}, exprs[n-1])
	}
	return &RuleSpec{Comment: comment, Text: text, Exprs: exprs}
}

func meta(k expr.MetaKey) *expr.Meta { return &expr.Meta{Key: k, Register: 1} }

// nfproto matches the packet's family (meta nfproto).
func nfproto(p byte) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{p}},
	}
}

func lookup(set string, invert bool) *expr.Lookup {
	return &expr.Lookup{SourceRegister: 1, SetName: set, Invert: invert}
}

func drop() *expr.Verdict   { return &expr.Verdict{Kind: expr.VerdictDrop} }
func accept() *expr.Verdict { return &expr.Verdict{Kind: expr.VerdictAccept} }

// l4proto matches the transport protocol (meta l4proto).
func l4proto(p byte) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{p}},
	}
}

// dport loads the transport destination port into register 1.
func dport() expr.Any {
	return &expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2}
}

// ipDaddr loads the IPv4 or IPv6 destination address into register 1.
func ipDaddr(v int) expr.Any {
	if v == 4 {
		return &expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4}
	}
	return &expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 24, Len: 16}
}

// String renders the ruleset in nft syntax, for plan and status.
func (r *Ruleset) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s { # flags owner, persist\n", r.TableRef())
	for _, s := range r.Sets {
		fmt.Fprintf(&b, "\tset %s {\n\t\ttype %s\n", s.Name, s.KeyType.Name)
		if f := s.setFlags(); f != "" {
			fmt.Fprintf(&b, "\t\tflags %s\n", f)
		}
		if s.Size > 0 {
			fmt.Fprintf(&b, "\t\tsize %d\n", s.Size)
		}
		if len(s.Text) > 0 {
			fmt.Fprintf(&b, "\t\telements = { %s }\n", strings.Join(s.Text, ", "))
		}
		b.WriteString("\t}\n")
	}
	for _, c := range r.Chains {
		fmt.Fprintf(&b, "\tchain %s {\n", c.Name)
		if c.Hook != nil {
			fmt.Fprintf(&b, "\t\ttype %s hook %s priority %d; policy accept;\n", c.chainType(), c.HookName, c.Priority)
		}
		for _, ru := range c.Rules {
			fmt.Fprintf(&b, "\t\t%s comment %q\n", ru.Text, ru.Comment)
		}
		b.WriteString("\t}\n")
	}
	b.WriteString("}\n")
	return b.String()
}

func (c *ChainSpec) chainType() nftables.ChainType {
	if c.Type == "" {
		return nftables.ChainTypeFilter
	}
	return c.Type
}
