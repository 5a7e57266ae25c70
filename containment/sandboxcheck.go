package containment

// This file is the sandbox engine's containment check (sandbox.Checker):
// SandboxChecker fills the plan's per-sandbox part (the
// VM's zone gateway and subnet, the zone resolver's local name, the guests
// of the node's other sandboxes) around a node-wide part the daemon supplies
// (host addresses, control ports, metadata, LAN, public targets, and the
// policy the node's mode promises), runs the probe in the VM through the
// guest agent, or in a container member through the engine's guest of it
// (ctguest: no agent; the container rows added, container.go), and
// converts the rows. With GuestPorts set it also asks for
// the layer-2 rows on the VM's vnet bridge, leaving the VM's own ports out
// of the node's watch. An allow-list sandbox whose egress the engine can
// re-apply (CheckTarget.ReapplyEgress) gets the row of an old keep-alive
// connection: the check re-applies its unchanged policy once, which cuts
// every connection the egress proxy holds for the zone, the agent's too.
//
// On a node with many sandboxes the plan is sampled (this package's
// sample.go): the node addresses that lie in another sandbox's subnet are
// that zone's gateway and go to Spec.OtherGateways, and every run takes
// the next rotation, so consecutive checks on the node cover every other
// zone and LAN target. The report's Sampling says what a run left out.
// The other sandboxes' guest addresses come from the node's files (the
// VMs' MACs and the zones' DHCP leases), never from those guests.

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/pve-inspect/pve-inspect/qga"
	"github.com/pve-inspect/pve-inspect/sandbox"
	"github.com/pve-inspect/pve-inspect/sandboxapi/apitype"
)

// SandboxChecker is the containment check of a sandbox: it implements
// sandbox.Checker.
type SandboxChecker struct {
	// Runner uploads and runs the probe.
	Runner *Runner
	// Client and QGADir reach the VM's agent (<QGADir>/<vmid>.qga).
	Client *qga.Client
	QGADir string
	// Node returns the node-wide part of the plan and the policy the node's
	// current mode promises (guard only, or lockdown).
	Node func(ctx context.Context) (Spec, Policy, error)
	// Sandbox, when set, adapts the node's spec and policy to the sandbox
	// (its egress policy: an allow-list or none sandbox reaches no public
	// address and recurses for no external name; an allow-list one gets
	// the egress rows).
	Sandbox func(sandbox string, spec Spec, p Policy) (Spec, Policy)
	// LocalName is the name a zone's resolver answers itself.
	LocalName func(zone string) string
	// OtherZonePort is probed on other sandboxes' guests (22).
	OtherZonePort uint16
	// GuestAddrs returns the addresses the node gave VM vmid in zone
	// (portmap.Paths.GuestAddrs: its MACs from the VM's configuration, the
	// zone's DHCP leases): the other sandboxes' guests the cross-zone
	// rows aim at. Nil: no such rows.
	GuestAddrs func(vmid int, zone string) ([]netip.Addr, error)
	// GuestPorts, when set, adds the layer-2 spoofing rows (the Runner
	// needs an Observer): it names the node's bridge ports of NIC netN of
	// member vmid, a container or a VM (firewall.GuestPortNames), which
	// the node's watch leaves out.
	GuestPorts func(container bool, vmid, nic int) []string

	// rotation is the last rotation a run took (0: none yet; the first
	// run starts from the clock, so a restarted daemon does not start at
	// the same window again).
	rotation atomic.Uint64
}

// nextRotation returns the rotation of a new run: the one after the last.
func (c *SandboxChecker) nextRotation() uint64 {
	for {
		last := c.rotation.Load()
		next := last + 1
		if last == 0 {
			next = uint64(time.Now().Unix())
		}
		if c.rotation.CompareAndSwap(last, next) {
			return next
		}
	}
}

var _ sandbox.Checker = (*SandboxChecker)(nil)

// Run implements sandbox.Checker.
func (c *SandboxChecker) Run(ctx context.Context, t sandbox.CheckTarget) (apitype.CheckReport, error) {
	spec, pol, err := c.Node(ctx)
	if err != nil {
		return apitype.CheckReport{}, fmt.Errorf("containment check: node facts: %w", err)
	}
	if c.Sandbox != nil {
		spec, pol = c.Sandbox(t.Sandbox.ID, spec, pol)
	}
	var nw *apitype.Network
	for i, n := range t.Sandbox.Networks {
		if len(t.VM.Networks) > 0 && n.Name == t.VM.Networks[0] {
			nw = &t.Sandbox.Networks[i]
		}
	}
	if nw == nil && len(t.VM.Networks) > 0 {
		if id, ok := apitype.SharedVNetOf(t.VM.Networks[0]); ok {
			// the plan's gateway and subnet are a sandbox network's
			return apitype.CheckReport{}, fmt.Errorf("containment check: VM %s's first NIC is on the shared vnet %s, not on a network of its sandbox: the check runs from a VM whose first NIC is", t.VM.Name, id)
		}
	}
	if nw == nil {
		return apitype.CheckReport{}, fmt.Errorf("containment check: VM %s has no network", t.VM.Name)
	}
	if spec.Gateway, err = netip.ParseAddr(nw.Gateway); err != nil {
		return apitype.CheckReport{}, fmt.Errorf("containment check: gateway: %w", err)
	}
	if spec.Subnet, err = netip.ParsePrefix(nw.CIDR); err != nil {
		return apitype.CheckReport{}, fmt.Errorf("containment check: subnet: %w", err)
	}
	spec.LocalName = c.LocalName(t.Sandbox.Zone)
	if c.GuestPorts != nil {
		spec.Layer2 = c.layer2(ctx, t, nw, spec.Subnet)
	}
	// a container shares the node's kernel: its rows too
	spec.Container = t.VM.Kind == apitype.KindLXC
	port := c.OtherZonePort
	if port == 0 {
		port = 22
	}
	spec.OtherZone = append(spec.OtherZone, c.otherGuests(t, port)...)
	spec.HostAddrs, spec.OtherGateways = splitGateways(spec.HostAddrs, t.Others)
	spec.Rotation = c.nextRotation()
	spec.LAN = outsideSandboxes(spec.LAN, t)
	spec, runner := withKeepAlive(spec, c.Runner, t.ReapplyEgress)
	plan, err := NewPlan(spec, pol)
	if err != nil {
		return apitype.CheckReport{}, fmt.Errorf("containment check: %w", err)
	}
	guest, err := c.guest(t)
	if err != nil {
		return apitype.CheckReport{}, fmt.Errorf("containment check: %w", err)
	}
	res, err := runner.Run(ctx, guest, plan)
	if err != nil {
		return apitype.CheckReport{}, fmt.Errorf("containment check: %w", err)
	}
	if m, ok := t.Guest.(NodeIDMapper); ok && spec.Container {
		// the id map as the node reads it, not as the container says
		uid, gid, err := m.NodeIDMaps(ctx)
		crossCheckIDMap(res, uid, gid, err)
	}
	rep := apitype.CheckReport{Pass: res.Passed()}
	if s := res.Sampling; s != nil {
		rep.Sampling = &apitype.CheckSampling{RowsNotProbed: s.RowsLeftOut, NotProbed: s.LeftOut, Runs: s.Runs, Note: s.String()}
	}
	for _, r := range res.Rows {
		detail := r.Detail
		if r.Why != "" {
			detail += "; " + r.Why
		}
		rep.Rows = append(rep.Rows, apitype.CheckRow{Target: r.Name, Probe: r.Target, Expected: string(r.Expect),
			Observed: string(r.Observed), Pass: r.Status == Pass, Control: r.Control, Detail: detail})
	}
	return rep, nil
}

// guest is where the probe of t runs: a VM's guest agent (AgentGuest),
// or a container entered from the node through the engine's guest of it
// (EngineGuest over ctguest).
func (c *SandboxChecker) guest(t sandbox.CheckTarget) (Guest, error) {
	if t.VM.Kind == apitype.KindLXC {
		if t.Guest == nil {
			return nil, fmt.Errorf("container %s: no guest to enter it through", t.VM.Name)
		}
		return EngineGuest{Guest: t.Guest}, nil
	}
	return AgentGuest{Agent: c.Client.Agent(filepath.Join(c.QGADir, strconv.Itoa(t.VM.VMID)+".qga"))}, nil
}

// withKeepAlive adds the row of an old keep-alive connection to an
// allow-list sandbox's plan (spec has egress rows) when the engine can
// re-apply the sandbox's policy: the returned runner is r with that as
// its Change. The check then cuts the sandbox's open proxied connections
// once. Otherwise spec and r come back as they are.
func withKeepAlive(spec Spec, r *Runner, reapply func(context.Context) error) (Spec, *Runner) {
	if spec.Egress == nil || reapply == nil {
		return spec, r
	}
	e := *spec.Egress
	e.KeepAlive = true
	spec.Egress = &e
	run := *r
	run.Change = reapply
	return spec, &run
}

// otherGuests returns the first guest of every other sandbox, at port,
// with its address as the node knows it (GuestAddrs): no call goes into
// another tenant's guest, and no guest can aim the row anywhere else.
// Only an address inside that sandbox's own subnets is taken; a guest
// without one (no lease yet) is left out.
func (c *SandboxChecker) otherGuests(t sandbox.CheckTarget, port uint16) []netip.AddrPort {
	if c.GuestAddrs == nil {
		return nil
	}
	var out []netip.AddrPort
	for _, o := range t.Others {
		if len(o.VMs) == 0 {
			continue
		}
		addrs, err := c.GuestAddrs(o.VMs[0].VMID, o.Zone)
		if err != nil {
			continue
		}
		for _, a := range addrs {
			if inNetworks(a, o.Networks) {
				out = append(out, netip.AddrPortFrom(a, port))
				break
			}
		}
	}
	return out
}

// splitGateways moves the node addresses that lie in another sandbox's
// subnet (that zone's gateway) from hosts to the other zones' gateways,
// whose rows are sampled on a busy node.
func splitGateways(hosts []netip.Addr, others []apitype.Sandbox) (own, gateways []netip.Addr) {
	for _, a := range hosts {
		other := false
		for _, o := range others {
			other = other || inNetworks(a, o.Networks)
		}
		if other {
			gateways = append(gateways, a)
		} else {
			own = append(own, a)
		}
	}
	return own, gateways
}

// inNetworks reports whether a lies in one of the networks' CIDRs.
func inNetworks(a netip.Addr, nws []apitype.Network) bool {
	for _, n := range nws {
		if p, err := netip.ParsePrefix(n.CIDR); err == nil && p.Contains(a) {
			return true
		}
	}
	return false
}

// outsideSandboxes drops the LAN targets that lie in a subnet of the
// sandbox or of another sandbox on the node: those are sandbox zones (the
// other-zone rows cover them), not the operator's network.
func outsideSandboxes(lan []netip.AddrPort, t sandbox.CheckTarget) []netip.AddrPort {
	out := lan[:0:0]
	for _, ap := range lan {
		in := inNetworks(ap.Addr(), t.Sandbox.Networks)
		for _, o := range t.Others {
			in = in || inNetworks(ap.Addr(), o.Networks)
		}
		if !in {
			out = append(out, ap)
		}
	}
	return out
}

// layer2 asks for the layer-2 rows of the VM's first NIC (net0, on nw's
// vnet bridge). The guest's own address, when it tells one inside the
// subnet, only keeps the spoofed address apart from it.
func (c *SandboxChecker) layer2(ctx context.Context, t sandbox.CheckTarget, nw *apitype.Network, subnet netip.Prefix) *Layer2Spec {
	l := &Layer2Spec{Bridge: nw.VNet, GuestPorts: c.GuestPorts(t.VM.Kind == apitype.KindLXC, t.VM.VMID, 0)}
	if c.GuestAddrs != nil {
		addrs, _ := c.GuestAddrs(t.VM.VMID, t.Sandbox.Zone)
		for _, a := range addrs {
			if subnet.Contains(a) {
				l.GuestAddr = a
				return l
			}
		}
	}
	if t.Guest != nil {
		if a, err := guestAddr(ctx, t.Guest); err == nil && subnet.Contains(a) {
			l.GuestAddr = a
		}
	}
	return l
}

// guestAddr asks the sandbox's own guest for its first global IPv4
// address (when the node's files do not tell it).
func guestAddr(ctx context.Context, g sandbox.Guest) (netip.Addr, error) {
	res, err := g.Exec(ctx, sandbox.GuestExec{Argv: []string{"ip", "-4", "-o", "addr", "show", "scope", "global"}, Timeout: 10, OutputLimit: 64 << 10})
	if err != nil {
		return netip.Addr{}, err
	}
	for _, line := range strings.Split(string(res.Stdout), "\n") {
		f := strings.Fields(line)
		for i := 0; i+1 < len(f); i++ {
			if f[i] == "inet" {
				if p, err := netip.ParsePrefix(f[i+1]); err == nil {
					return p.Addr(), nil
				}
			}
		}
	}
	return netip.Addr{}, errors.New("no global IPv4 address")
}
