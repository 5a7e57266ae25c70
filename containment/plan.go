package containment

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"time"

	"github.com/pve-inspect/pve-inspect/containment/probe"
)

// Verdict is an expected or observed state of a check.
type Verdict string

// Verdicts.
const (
	Reachable Verdict = "reachable" // something answered (a refusal included)
	Blocked   Verdict = "blocked"   // nothing answered: timeout, unreachable, no DNS reply, or DNS without an answer
	Present   Verdict = "present"   // a local fact holds (the DHCP lease)
	Absent    Verdict = "absent"    // a local fact does not hold
	Errored   Verdict = "error"     // the probe could not try
	Missing   Verdict = "missing"   // the probe's report has no result for the check
)

// Group names what a check is about.
type Group string

// Groups, in the order the table shows them.
const (
	GroupControl      Group = "control"       // positive controls
	GroupControlPlane Group = "control-plane" // host ports via gateway and host addresses
	GroupMetadata     Group = "metadata"      // cloud metadata endpoints
	GroupOtherZone    Group = "other-zone"    // guests of other sandboxes
	GroupLAN          Group = "lan"           // the operator's networks
	GroupInternet     Group = "internet"      // public addresses
	GroupDNS          Group = "dns"           // recursion through the zone resolver
	GroupIPv6         Group = "ipv6"          // IPv6 to the internet
	GroupEgress       Group = "egress"        // the sandbox's egress policy
	GroupLayer2       Group = "layer2"        // forged frames from the guest (layer2.go)
	// GroupContainer (container.go) is declared with the container rows.
)

// Policy says what each category must be. Use GuardPolicy, LockdownPolicy
// or OpenPolicy, or build one.
type Policy struct {
	Name         string  // shown in the report
	ControlPlane Verdict // host ports via gateway and every host address
	Metadata     Verdict // metadata GET, token PUT, metadata DNS
	OtherZone    Verdict // other zones' guests
	LAN          Verdict // LAN addresses
	Internet     Verdict // public HTTP/HTTPS
	DNSRecursion Verdict // an external name through the zone resolver
	IPv6         Verdict // IPv6 to the internet
	// Egress is the sandbox's egress mode when it is not open (WithEgress):
	// its DNS goes to the daemon's resolver, which answers only allowed
	// names, so the zone's local name is expected unresolved and is no
	// positive control.
	Egress string
	// Layer2 is what a forged frame from the guest (spoofed source
	// address or MAC, gratuitous ARP for the gateway) does: blocked when
	// the guard's layer-2 table is in force. Checked when Spec.Layer2 asks
	// for these rows.
	Layer2 Verdict
}

// GuardPolicy is the host guard on, lockdown off: the internet (and DNS
// recursion) is reachable, everything else blocked.
func GuardPolicy() Policy {
	return Policy{Name: "guard", ControlPlane: Blocked, Metadata: Blocked, OtherZone: Blocked, LAN: Blocked,
		Internet: Reachable, DNSRecursion: Reachable, IPv6: Blocked, Layer2: Blocked}
}

// LockdownPolicy is the guard with the egress lockdown: everything blocked.
func LockdownPolicy() Policy {
	return Policy{Name: "lockdown", ControlPlane: Blocked, Metadata: Blocked, OtherZone: Blocked, LAN: Blocked,
		Internet: Blocked, DNSRecursion: Blocked, IPv6: Blocked, Layer2: Blocked}
}

// OpenPolicy expects everything reachable: the test bed's honesty check
// with no guard installed (the bed must see every leak).
func OpenPolicy() Policy {
	return Policy{Name: "open", ControlPlane: Reachable, Metadata: Reachable, OtherZone: Reachable, LAN: Reachable,
		Internet: Reachable, DNSRecursion: Reachable, IPv6: Reachable, Layer2: Reachable}
}

// WithEgress adapts p to a sandbox's egress mode: under "none" and
// "allowlist" the public addresses and the external name (a fresh random
// label, which no allow-list should cover) are expected blocked, and stop
// being positive controls; "open" (or anything else) leaves p as it is.
// An allowed CIDR that holds a [check] public address makes that row
// reachable: leave such addresses out of check.public.
func WithEgress(p Policy, mode string) Policy {
	if mode != "none" && mode != "allowlist" {
		return p
	}
	p.Name += " + egress " + mode
	p.Internet, p.DNSRecursion = Blocked, Blocked
	p.Egress = mode
	return p
}

func (p Policy) validate() error {
	for _, f := range []struct {
		name string
		v    Verdict
	}{{"control_plane", p.ControlPlane}, {"metadata", p.Metadata}, {"other_zone", p.OtherZone}, {"lan", p.LAN},
		{"internet", p.Internet}, {"dns_recursion", p.DNSRecursion}, {"ipv6", p.IPv6}} {
		if f.v != Reachable && f.v != Blocked {
			return fmt.Errorf("policy %s: %q, want reachable or blocked", f.name, f.v)
		}
	}
	return nil
}

// Port is a host port with the service name shown in the table.
type Port struct {
	Port uint16
	Name string
}

// DefaultControlPorts are the Proxmox control-plane ports. Append the
// daemon's API and metrics ports.
func DefaultControlPorts() []Port {
	return []Port{{8006, "Proxmox API"}, {22, "SSH"}, {3128, "spiceproxy"}}
}

// DefaultMetadata are the cloud metadata HTTP endpoints of the threat model.
func DefaultMetadata() []netip.Addr {
	return []netip.Addr{
		netip.MustParseAddr("169.254.169.254"), netip.MustParseAddr("100.100.100.200"),
		netip.MustParseAddr("168.63.129.16"), netip.MustParseAddr("fd00:ec2::254"),
		netip.MustParseAddr("fe80::a9fe:a9fe"),
	}
}

// DefaultMetadataDNS are metadata DNS resolvers (AWS 169.254.169.253).
func DefaultMetadataDNS() []netip.Addr {
	return []netip.Addr{netip.MustParseAddr("169.254.169.253")}
}

// Spec describes where the VM sits and what to aim at. A nil slice with a
// default gets the default; an empty non-nil slice means none.
type Spec struct {
	// Gateway is the zone gateway: the VM's default gateway and the zone
	// resolver. Required.
	Gateway netip.Addr
	// Subnet is the zone subnet; when valid, the lease must lie inside it.
	Subnet netip.Prefix
	// Gateway6 is the zone's IPv6 gateway, if any; probed like a host address.
	Gateway6 netip.Addr
	// HostAddrs are the node's other addresses (management, other bridges, v6).
	HostAddrs []netip.Addr
	// ControlPorts are probed on the gateway(s) and every host address;
	// nil = DefaultControlPorts.
	ControlPorts []Port
	// Metadata are metadata HTTP endpoints (GET and IMDSv2 token PUT on
	// port 80); nil = DefaultMetadata.
	Metadata []netip.Addr
	// MetadataDNS are metadata resolvers asked ExternalName; nil = DefaultMetadataDNS.
	MetadataDNS []netip.Addr
	// OtherZone are guests of other zones; a closed port still answers (refused).
	OtherZone []netip.AddrPort
	// LAN are addresses on the operator's networks.
	LAN []netip.AddrPort
	// Public are IPv4 internet addresses: HTTP on 80 and HTTPS on 443.
	Public []netip.Addr
	// Public6 are IPv6 internet addresses: HTTP on 80.
	Public6 []netip.Addr
	// ExternalName is resolved through the zone resolver (DNS recursion).
	// Required. Use a name no cache holds (a random label under a wildcard
	// domain): a cached answer would read as working recursion.
	ExternalName string
	// LocalName is a name the zone resolver answers itself (positive control). Required.
	LocalName string
	// Timeout bounds each probe; 0 = 3s.
	Timeout time.Duration
	// Egress, when set, adds the rows of an allow-list egress policy.
	Egress *EgressSpec
	// UDPPorts are the node's UDP services, probed on the gateway(s) and
	// every host address; nil = DefaultUDPPorts.
	UDPPorts []Port
	// PeerUDPPorts are probed on every OtherZone and LAN address; nil =
	// DefaultPeerUDPPorts.
	PeerUDPPorts []Port
	// Layer2, when set, adds the layer-2 spoofing rows (layer2.go); the
	// Runner then needs an Observer.
	Layer2 *Layer2Spec
	// OtherGateways are node addresses that are other zones' gateways:
	// they get the control-plane rows of HostAddrs, but are sampled when
	// the plan is over its budget (sample.go). An address also in
	// HostAddrs, or the VM's own gateway, is probed as that.
	OtherGateways []netip.Addr
	// Budget is the most rows a plan holds before the rows of other
	// zones' gateways and guests and of LAN targets are sampled
	// (sample.go); 0 = DefaultBudget. The rows that are always probed
	// still must fit in probe.MaxTargets.
	Budget int
	// Rotation picks the window of a sampled plan: consecutive values
	// cover consecutive windows. Give each run the next value.
	Rotation uint64
	// Container adds the container rows (container.go): the guest is a
	// container on the node's kernel, and the probe tries what its root
	// must not be able to do there. Always probed, expected denied.
	Container bool
}

// EgressSpec names what an allow-list sandbox's rows aim at.
type EgressSpec struct {
	// AllowedName is allowed by the policy and serves HTTPS: it must
	// resolve through the zone resolver and connect (positive controls).
	AllowedName string
	// DeniedName is not allowed: it must not resolve, and presenting it
	// (SNI) to the allowed name's address must be refused.
	DeniedName string
	// DeniedAddr is an address the policy does not allow: tcp 443 to it
	// must be blocked. Optional.
	DeniedAddr netip.Addr
	// KeepAlive adds the row of an old keep-alive connection: the guest
	// opens one to AllowedName (HTTPS, port 443) through the egress proxy,
	// the Runner's Change re-applies the sandbox's policy (a new policy
	// generation, which cuts every proxied connection of the zone, the
	// agent's own included), and a second request on the old connection
	// must fail. The Runner then needs Change and a StreamGuest.
	KeepAlive bool
}

// Check is one row to probe.
type Check struct {
	Group  Group        `json:"group"`
	Name   string       `json:"name"`
	Target probe.Target `json:"target"`
	Expect Verdict      `json:"expect"`
	// Control marks a positive control: it must be reachable, and if it is
	// not, the whole check fails and blocked rows are unproven.
	Control bool `json:"control,omitempty"`
	// NeedAnswer (dns) counts only NOERROR with at least one answer as
	// reachable: the question is whether resolution works, not whether
	// the server exists.
	NeedAnswer bool `json:"need_answer,omitempty"`
	// NeedResponse (http, https) counts only an HTTP response as
	// reachable: a connection closed before one (a refused name) is
	// blocked.
	NeedResponse bool `json:"need_response,omitempty"`
	// ByCanary (udp) judges the row by closed ports alone: reachable when
	// the canary or the row's own (closed) port came back refused (the UDP
	// controls).
	ByCanary bool `json:"by_canary,omitempty"`

	// sample is the address whose rows are sampled together when the
	// plan is over its budget (invalid: always probed).
	sample netip.Addr
}

// Lease is the DHCP-lease control's expectation.
type Lease struct {
	Subnet  netip.Prefix `json:"subnet"`  // the lease lies inside it (when valid)
	Gateway netip.Addr   `json:"gateway"` // the IPv4 default route goes via it
}

// Plan is the list of checks for one VM under one policy.
type Plan struct {
	Policy string  `json:"policy"`
	Lease  Lease   `json:"lease"`
	Checks []Check `json:"checks"`
	// Layer2 is where the node watches for the layer-2 rows' frames (nil
	// without such rows).
	Layer2 *Layer2Watch `json:"layer2,omitempty"`
	// Sampling says which rows this run leaves out (nil: none; sample.go).
	Sampling *Sampling `json:"sampling,omitempty"`
}

// TokenTTLHeader is the IMDSv2 header the token PUT carries.
const TokenTTLHeader = "X-aws-ec2-metadata-token-ttl-seconds"

// NewPlan builds the checks for spec under policy: every row, or, when
// they are more than spec.Budget, a sample of them (sample.go).
func NewPlan(spec Spec, pol Policy) (*Plan, error) {
	if spec.Budget < 0 {
		return nil, fmt.Errorf("spec: budget %d: want 0 (the default) or more", spec.Budget)
	}
	p, err := buildPlan(spec, pol)
	if err != nil {
		return nil, err
	}
	if err := p.sample(spec.Budget, spec.Rotation); err != nil {
		return nil, err
	}
	req := p.request(0, signalPlaceholder)
	if err := probe.ValidateRequest(req); err != nil {
		return nil, fmt.Errorf("spec: %w", err)
	}
	b, err := json.Marshal(req)
	if err != nil {
		return nil, fmt.Errorf("spec: encode request: %w", err)
	}
	if len(b) > probe.MaxRequestBytes {
		return nil, fmt.Errorf("spec: the probe request has %d bytes, over its bound of %d", len(b), probe.MaxRequestBytes)
	}
	return p, nil
}

// buildPlan builds every check for spec under policy, unsampled and not
// yet checked against the probe's bounds.
func buildPlan(spec Spec, pol Policy) (*Plan, error) {
	if err := pol.validate(); err != nil {
		return nil, err
	}
	if !spec.Gateway.Is4() {
		return nil, errors.New("spec: gateway: want an IPv4 address")
	}
	if spec.Subnet.IsValid() && !spec.Subnet.Contains(spec.Gateway) {
		return nil, fmt.Errorf("spec: gateway %s outside subnet %s", spec.Gateway, spec.Subnet)
	}
	if spec.LocalName == "" || spec.ExternalName == "" {
		return nil, errors.New("spec: local_name and external_name are required (the resolver control and the recursion check)")
	}
	if spec.Timeout < 0 || spec.Timeout > probe.MaxTimeoutMS*time.Millisecond {
		return nil, fmt.Errorf("spec: timeout %v outside 0..%dms", spec.Timeout, probe.MaxTimeoutMS)
	}
	if pol.Internet == Reachable && len(spec.Public) == 0 {
		return nil, errors.New("spec: policy expects the internet reachable but no public address is given (it is a positive control)")
	}
	ports := spec.ControlPorts
	if ports == nil {
		ports = DefaultControlPorts()
	}
	meta := spec.Metadata
	if meta == nil {
		meta = DefaultMetadata()
	}
	metaDNS := spec.MetadataDNS
	if metaDNS == nil {
		metaDNS = DefaultMetadataDNS()
	}
	tms := int(spec.Timeout / time.Millisecond)
	p := &Plan{Policy: pol.Name, Lease: Lease{Subnet: spec.Subnet, Gateway: spec.Gateway}}
	add := func(c Check) {
		c.Target.ID = "c" + strconv.Itoa(len(p.Checks)+1)
		c.Target.TimeoutMS = tms
		p.Checks = append(p.Checks, c)
	}
	resolver := netip.AddrPortFrom(spec.Gateway, 53).String()

	if pol.Egress == "" {
		add(Check{Group: GroupControl, Name: "zone resolver answers " + spec.LocalName, Expect: Reachable, Control: true, NeedAnswer: true,
			Target: probe.Target{Kind: probe.KindDNS, Addr: resolver, Name: spec.LocalName}})
	} else {
		// the daemon's resolver answers the names the zone's own dnsmasq
		// holds in every mode (the guests of one sample find each other)
		add(Check{Group: GroupEgress, Name: "zone-local name " + spec.LocalName + " answered (egress " + pol.Egress + ")",
			Expect: Reachable, NeedAnswer: true, Target: probe.Target{Kind: probe.KindDNS, Addr: resolver, Name: spec.LocalName}})
	}

	for _, h := range nodeHosts(spec) {
		for _, pt := range ports {
			if pt.Port == 0 {
				return nil, fmt.Errorf("spec: control port 0 (%s)", pt.Name)
			}
			add(Check{Group: GroupControlPlane, Name: fmt.Sprintf("%s (%d) via %s", portName(pt), pt.Port, h.via), Expect: pol.ControlPlane,
				Target: probe.Target{Kind: probe.KindTCP, Addr: netip.AddrPortFrom(h.a, pt.Port).String()}, sample: h.sample})
		}
	}
	for _, m := range meta {
		addr := netip.AddrPortFrom(m, 80).String()
		add(Check{Group: GroupMetadata, Name: "metadata GET " + m.String(), Expect: pol.Metadata,
			Target: probe.Target{Kind: probe.KindHTTP, Addr: addr, Path: "/latest/meta-data/instance-id"}})
		add(Check{Group: GroupMetadata, Name: "metadata token PUT " + m.String(), Expect: pol.Metadata,
			Target: probe.Target{Kind: probe.KindHTTP, Addr: addr, Method: "PUT", Path: "/latest/api/token",
				Headers: map[string]string{TokenTTLHeader: "21600"}}})
	}
	for _, m := range metaDNS {
		add(Check{Group: GroupMetadata, Name: "metadata DNS " + m.String() + " resolves " + spec.ExternalName, Expect: pol.Metadata,
			Target: probe.Target{Kind: probe.KindDNS, Addr: netip.AddrPortFrom(m, 53).String(), Name: spec.ExternalName}})
	}
	for _, g := range spec.OtherZone {
		add(Check{Group: GroupOtherZone, Name: "other zone guest " + g.Addr().String(), Expect: pol.OtherZone,
			Target: probe.Target{Kind: probe.KindTCP, Addr: g.String()}, sample: g.Addr()})
	}
	for _, l := range spec.LAN {
		add(Check{Group: GroupLAN, Name: "LAN " + l.Addr().String(), Expect: pol.LAN,
			Target: probe.Target{Kind: probe.KindTCP, Addr: l.String()}, sample: l.Addr()})
	}
	internetControl := pol.Internet == Reachable
	for _, a := range spec.Public {
		// under an egress policy a connection the peek proxy takes and
		// refuses (no allowed name) reaches nothing: only a response counts
		egress := pol.Egress != ""
		add(Check{Group: GroupInternet, Name: "public HTTP " + a.String(), Expect: pol.Internet, Control: internetControl, NeedResponse: egress,
			Target: probe.Target{Kind: probe.KindHTTP, Addr: netip.AddrPortFrom(a, 80).String()}})
		add(Check{Group: GroupInternet, Name: "public HTTPS " + a.String(), Expect: pol.Internet, Control: internetControl, NeedResponse: egress,
			Target: probe.Target{Kind: probe.KindHTTPS, Addr: netip.AddrPortFrom(a, 443).String()}})
	}
	add(Check{Group: GroupDNS, Name: "zone resolver recurses for " + spec.ExternalName, Expect: pol.DNSRecursion, NeedAnswer: true,
		Target: probe.Target{Kind: probe.KindDNS, Addr: resolver, Name: spec.ExternalName}})
	for _, a := range spec.Public6 {
		add(Check{Group: GroupIPv6, Name: "public HTTP over IPv6 " + a.String(), Expect: pol.IPv6,
			Target: probe.Target{Kind: probe.KindHTTP, Addr: netip.AddrPortFrom(a, 80).String()}})
	}
	if err := addUDP(spec, pol, add); err != nil {
		return nil, err
	}
	if e := spec.Egress; e != nil {
		if e.AllowedName == "" || e.DeniedName == "" {
			return nil, errors.New("spec: egress: allowed and denied names are required")
		}
		anyPort := netip.AddrPortFrom(netip.IPv4Unspecified(), 443).String()
		add(Check{Group: GroupEgress, Name: "allowed name " + e.AllowedName + " resolves", Expect: Reachable, Control: true, NeedAnswer: true,
			Target: probe.Target{Kind: probe.KindDNS, Addr: resolver, Name: e.AllowedName}})
		add(Check{Group: GroupEgress, Name: "allowed name " + e.AllowedName + " connects (HTTPS)", Expect: Reachable, Control: true, NeedResponse: true,
			Target: probe.Target{Kind: probe.KindHTTPS, Addr: anyPort, Name: e.AllowedName, Resolver: resolver}})
		add(Check{Group: GroupEgress, Name: "disallowed name " + e.DeniedName + " does not resolve", Expect: Blocked, NeedAnswer: true,
			Target: probe.Target{Kind: probe.KindDNS, Addr: resolver, Name: e.DeniedName}})
		add(Check{Group: GroupEgress, Name: "disallowed SNI " + e.DeniedName + " on the address of " + e.AllowedName + " is refused", Expect: Blocked, NeedResponse: true,
			Target: probe.Target{Kind: probe.KindHTTPS, Addr: anyPort, Name: e.AllowedName, Resolver: resolver, Host: e.DeniedName}})
		add(Check{Group: GroupEgress, Name: "disallowed Host " + e.DeniedName + " on the address of " + e.AllowedName + " is refused", Expect: Blocked, NeedResponse: true,
			Target: probe.Target{Kind: probe.KindHTTP, Addr: netip.AddrPortFrom(netip.IPv4Unspecified(), 80).String(), Name: e.AllowedName, Resolver: resolver, Host: e.DeniedName}})
		// what a hostile guest tries once the allowed name resolved: the
		// address opens tcp 80/443 through the name check and nothing
		// else (another TLS port of a CDN, SSH, QUIC)
		for _, pt := range []struct {
			kind probe.Kind
			port uint16
			what string
		}{{probe.KindTCP, 8443, "tcp 8443 (TLS, no name check)"}, {probe.KindTCP, 22, "tcp 22 (SSH)"}, {probe.KindUDP, 443, "udp 443 (QUIC)"}} {
			add(Check{Group: GroupEgress, Name: pt.what + " to the address of " + e.AllowedName + " is blocked", Expect: Blocked,
				Target: probe.Target{Kind: pt.kind, Addr: netip.AddrPortFrom(netip.IPv4Unspecified(), pt.port).String(), Name: e.AllowedName, Resolver: resolver}})
		}
		if e.KeepAlive {
			add(Check{Group: GroupEgress, Name: "keep-alive connection to " + e.AllowedName + " from before a policy change is cut", Expect: Blocked, NeedResponse: true,
				Target: probe.Target{Kind: probe.KindKeepAlive, Addr: anyPort, Name: e.AllowedName, Resolver: resolver}})
		}
		if e.DeniedAddr.IsValid() {
			add(Check{Group: GroupEgress, Name: "disallowed address " + e.DeniedAddr.String() + " is not reachable", Expect: Blocked,
				Target: probe.Target{Kind: probe.KindTCP, Addr: netip.AddrPortFrom(e.DeniedAddr, 443).String()}})
		}
	}
	if spec.Layer2 != nil {
		if err := addLayer2(p, spec, pol, add); err != nil {
			return nil, err
		}
	}
	if spec.Container {
		addContainer(add)
	}
	return p, nil
}

// nodeHost is a node address the control-plane rows aim at.
type nodeHost struct {
	a       netip.Addr
	via     string
	gateway bool       // the VM's own zone gateway
	sample  netip.Addr // valid for another zone's gateway: sampled
}

// nodeHosts are the node addresses of the control-plane rows: the VM's
// gateway(s), then HostAddrs (as given), then the other zones' gateways
// not listed before.
func nodeHosts(spec Spec) []nodeHost {
	hosts := []nodeHost{{a: spec.Gateway, via: "gateway", gateway: true}}
	if spec.Gateway6.IsValid() {
		hosts = append(hosts, nodeHost{a: spec.Gateway6, via: "gateway v6", gateway: true})
	}
	for _, a := range spec.HostAddrs {
		hosts = append(hosts, nodeHost{a: a, via: "host " + a.String()})
	}
	for _, a := range spec.OtherGateways {
		if !slices.ContainsFunc(hosts, func(h nodeHost) bool { return h.a == a }) {
			hosts = append(hosts, nodeHost{a: a, via: "host " + a.String(), sample: a})
		}
	}
	return hosts
}

func portName(p Port) string {
	if p.Name != "" {
		return p.Name
	}
	return "port"
}

// signalPlaceholder stands for the signal path the Runner picks (as long
// as the longest it picks for the default guest directory) when NewPlan
// checks the request against the probe's bounds.
const signalPlaceholder = "/tmp/pve-inspect-probe-000000000000.signal"

// request is the probe input for the plan; signal is the guest path of
// the keep-alive rows' signal file.
func (p *Plan) request(concurrency int, signal string) *probe.Request {
	req := &probe.Request{Version: probe.Version, Concurrency: concurrency, Targets: make([]probe.Target, len(p.Checks))}
	for i, c := range p.Checks {
		req.Targets[i] = c.Target
		if c.Target.Kind == probe.KindKeepAlive {
			req.Targets[i].Signal = signal
		}
	}
	return req
}

// keepAlive reports whether the plan has a keep-alive row.
func (p *Plan) keepAlive() bool {
	return slices.ContainsFunc(p.Checks, func(c Check) bool { return c.Target.Kind == probe.KindKeepAlive })
}
