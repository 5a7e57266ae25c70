package containment

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strings"

	"github.com/pve-inspect/pve-inspect/containment/l2observe"
	"github.com/pve-inspect/pve-inspect/containment/probe"
)

// Layer-2 rows: the guest (root in its VM) sends forged frames through a
// raw socket, broadcast toward the gateway: a datagram from another
// address of its subnet, one from a random MAC, and a gratuitous ARP
// claiming the gateway's address. The node watches its side of the zone
// bridge (package l2observe) while the probe runs: the bridge device and
// every port but the guest's own. A forged frame seen there is a leak. A
// legitimate datagram sent the same raw way is the positive control: it
// must reach the node, or an unseen forgery proves nothing.

// Layer2Spec asks for the layer-2 rows (Spec.Layer2).
type Layer2Spec struct {
	// Bridge is the node's zone bridge the VM's NIC is a port of (the vnet).
	Bridge string
	// GuestPorts are the bridge ports of the VM's NIC (tap, fwpr); they
	// are not watched.
	GuestPorts []string
	// GuestAddr, when valid, is the VM's IPv4 address: the spoofed source
	// address is chosen to differ from it.
	GuestAddr netip.Addr
}

// Layer2Watch is where the node watches for the layer-2 rows' frames.
type Layer2Watch struct {
	Bridge  string     `json:"bridge"`
	Exclude []string   `json:"exclude"`
	Gateway netip.Addr `json:"gateway"`
}

// Layer2Observer watches the node side of a bridge while during runs
// (l2observe.Observer satisfies it).
type Layer2Observer interface {
	Observe(ctx context.Context, q l2observe.Query, during func(context.Context) error) (l2observe.Sightings, error)
}

// layer2Port is the UDP port of the layer-2 datagrams (discard).
const layer2Port = 9

// layer2Seen is what the node saw of the layer-2 frames, or why it saw
// nothing (s nil).
type layer2Seen struct {
	s   *l2observe.Sightings
	err error
}

// addLayer2 adds the layer-2 control and rows to p.
func addLayer2(p *Plan, spec Spec, pol Policy, add func(Check)) error {
	l := spec.Layer2
	if pol.Layer2 != Reachable && pol.Layer2 != Blocked {
		return fmt.Errorf("policy layer2: %q, want reachable or blocked", pol.Layer2)
	}
	if l.Bridge == "" || len(l.Bridge) > 15 || strings.ContainsAny(l.Bridge, "/ \t\n") {
		return fmt.Errorf("spec: layer2: bridge %q: want an interface name", l.Bridge)
	}
	if !spec.Subnet.IsValid() || !spec.Subnet.Addr().Is4() || spec.Subnet.Bits() > 29 {
		return fmt.Errorf("spec: layer2: subnet %s: want an IPv4 subnet of at least 8 addresses (the spoofed address is drawn from it)", spec.Subnet)
	}
	src, err := randomHost(spec.Subnet, spec.Gateway, l.GuestAddr)
	if err != nil {
		return fmt.Errorf("spec: layer2: %w", err)
	}
	mac, err := randomMAC()
	if err != nil {
		return fmt.Errorf("spec: layer2: %w", err)
	}
	gw := netip.AddrPortFrom(spec.Gateway, layer2Port).String()
	rows := []Check{
		{Group: GroupControl, Name: "raw frame from the guest's own MAC and address reaches the node", Expect: Reachable, Control: true,
			Target: probe.Target{Kind: probe.KindL2Control, Addr: gw}},
		{Group: GroupLayer2, Name: "spoofed source address " + src.String() + " reaches a sibling VM or the node", Expect: pol.Layer2,
			Target: probe.Target{Kind: probe.KindL2SpoofAddr, Addr: gw, SrcAddr: src.String()}},
		{Group: GroupLayer2, Name: "spoofed MAC " + mac.String() + " reaches a sibling VM or the node", Expect: pol.Layer2,
			Target: probe.Target{Kind: probe.KindL2SpoofMAC, Addr: gw, SrcMAC: mac.String()}},
		{Group: GroupLayer2, Name: "gratuitous ARP for the gateway " + spec.Gateway.String() + " reaches a sibling VM or the node", Expect: pol.Layer2,
			Target: probe.Target{Kind: probe.KindL2GratuitousARP, Addr: gw}},
	}
	for _, c := range rows {
		var n [probe.NonceLen]byte
		if _, err := rand.Read(n[:]); err != nil {
			return fmt.Errorf("spec: layer2: nonce: %w", err)
		}
		c.Target.Nonce = hex.EncodeToString(n[:])
		add(c)
	}
	p.Layer2 = &Layer2Watch{Bridge: l.Bridge, Exclude: slices.Clone(l.GuestPorts), Gateway: spec.Gateway}
	return nil
}

// randomHost draws a host address of subnet that is none of avoid.
func randomHost(subnet netip.Prefix, avoid ...netip.Addr) (netip.Addr, error) {
	base := binary.BigEndian.Uint32(subnet.Masked().Addr().AsSlice())
	size := uint32(1) << (32 - subnet.Bits())
	if size < 4 {
		return netip.Addr{}, fmt.Errorf("no free address in %s", subnet)
	}
	hosts := size - 2 // neither the network nor the broadcast address
	var r [4]byte
	if _, err := rand.Read(r[:]); err != nil {
		return netip.Addr{}, err
	}
	// From a random host on, the first one not avoided: random, and sure
	// to find the free host of a nearly full subnet (64 random picks of
	// six hosts with five taken missed it about once in 10^5 calls).
	start := binary.BigEndian.Uint32(r[:]) % hosts
	for i := range min(hosts, uint32(len(avoid))+1) {
		var b [4]byte
		binary.BigEndian.PutUint32(b[:], base+1+(start+i)%hosts)
		if a := netip.AddrFrom4(b); !slices.Contains(avoid, a) {
			return a, nil
		}
	}
	return netip.Addr{}, fmt.Errorf("no free address in %s", subnet)
}

// randomMAC is a random locally administered unicast MAC.
func randomMAC() (net.HardwareAddr, error) {
	m := make(net.HardwareAddr, 6)
	if _, err := rand.Read(m); err != nil {
		return nil, err
	}
	m[0] = m[0]&^0x01 | 0x02
	return m, nil
}

// isLayer2 reports the checks judged from the node's watch.
func isLayer2(c Check) bool {
	switch c.Target.Kind {
	case probe.KindL2Control, probe.KindL2SpoofAddr, probe.KindL2SpoofMAC, probe.KindL2GratuitousARP:
		return true
	}
	return false
}

// watch runs the probe (run), inside the observer's watch when the plan
// has layer-2 rows.
func (r *Runner) watch(ctx context.Context, p *Plan, run func(context.Context) error) *layer2Seen {
	if p.Layer2 == nil {
		_ = run(ctx)
		return nil
	}
	if r.Observer == nil {
		_ = run(ctx)
		return &layer2Seen{err: errors.New("the node has no layer-2 observer")}
	}
	q := l2observe.Query{Bridge: p.Layer2.Bridge, Exclude: p.Layer2.Exclude, Gateway: p.Layer2.Gateway}
	for _, c := range p.Checks {
		if n, err := hex.DecodeString(c.Target.Nonce); err == nil && isLayer2(c) {
			q.Nonces = append(q.Nonces, n)
		}
	}
	ran := false
	s, err := r.Observer.Observe(ctx, q, func(ctx context.Context) error {
		ran = true
		return run(ctx)
	})
	if !ran {
		_ = run(ctx) // the other rows do not depend on the watch
	}
	if err != nil {
		return &layer2Seen{err: err}
	}
	return &layer2Seen{s: &s}
}

// observeLayer2 judges a layer-2 check from the probe's result and the
// node's watch: reachable when the frame was seen (the control: by the
// node itself), blocked when the watch saw it nowhere.
func observeLayer2(c Check, r probe.Result, w *Layer2Watch, l2 *layer2Seen) (Verdict, string) {
	switch {
	case r.Outcome == probe.OutcomeError:
		return Errored, "the guest could not send: " + r.Detail
	case r.Outcome != probe.OutcomeSent:
		return Errored, "unexpected probe outcome " + string(r.Outcome)
	case w == nil || l2 == nil:
		return Errored, "the node did not watch its bridge"
	case l2.s == nil:
		return Errored, "the node could not watch its bridge: " + l2.err.Error()
	}
	s := l2.s
	nonce, _ := hex.DecodeString(c.Target.Nonce)
	where := s.SeenOn(nonce)
	if c.Target.Kind == probe.KindL2GratuitousARP {
		for _, cl := range s.GatewayClaims {
			if !slices.Contains(where, cl.Iface) {
				where = append(where, cl.Iface)
			}
		}
		slices.Sort(where)
	}
	sent := "sent " + r.Detail
	if c.Target.Kind == probe.KindL2Control {
		if slices.Contains(where, s.Bridge) {
			return Reachable, fmt.Sprintf("seen by the node (%s); %s", s.Bridge, sent)
		}
		return Blocked, fmt.Sprintf("not seen by the node (%s): the raw path does not work; %s", s.Bridge, sent)
	}
	if len(where) > 0 {
		return Reachable, fmt.Sprintf("seen on %s (%s is the node); %s", strings.Join(where, ", "), s.Bridge, sent)
	}
	ports := "no other port"
	if len(s.Ports) > 0 {
		ports = strings.Join(s.Ports, ", ")
	}
	return Blocked, fmt.Sprintf("not seen by the node (%s) nor on %s; %s", s.Bridge, ports, sent)
}

// describeLayer2 renders a layer-2 target for the table ("" for other kinds).
func describeLayer2(t probe.Target) string {
	switch t.Kind {
	case probe.KindL2Control:
		return "raw UDP to " + t.Addr + " from own MAC and address"
	case probe.KindL2SpoofAddr:
		return "raw UDP to " + t.Addr + " from own MAC, source " + t.SrcAddr
	case probe.KindL2SpoofMAC:
		return "raw UDP to " + t.Addr + " from own address, MAC " + t.SrcMAC
	case probe.KindL2GratuitousARP:
		a, _, _ := strings.Cut(t.Addr, ":")
		return "raw ARP request and reply: " + a + " is at own MAC"
	}
	return ""
}
