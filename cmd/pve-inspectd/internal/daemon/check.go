package daemon

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"

	"github.com/pve-inspect/pve-inspect/cmd/pve-inspectd/internal/config"
	"github.com/pve-inspect/pve-inspect/containment"
	"github.com/pve-inspect/pve-inspect/containment/l2observe"
	"github.com/pve-inspect/pve-inspect/containment/lantargets"
	"github.com/pve-inspect/pve-inspect/firewall"
	"github.com/pve-inspect/pve-inspect/firewall/portmap"
	"github.com/pve-inspect/pve-inspect/qga"
)

// lockdownView is what the check needs to know of the lockdown.
type lockdownView interface {
	// LockedDown reports whether the lockdown is asked for and in force.
	LockedDown() bool
}

// egressView is what the check needs to know of a sandbox's egress policy.
type egressView interface {
	// Mode returns the egress mode of the sandbox's zone.
	Mode(sandbox string) string
	// AllowsName reports whether the sandbox's policy allows name.
	AllowsName(sandbox, name string) bool
}

// NewChecker builds the containment check the API's check endpoint runs:
// the node-wide part of the plan comes from the node's own addresses, the
// daemon's ports and the [check] section; the policy from the lockdown and
// the sandbox's egress mode (ev may be nil).
func NewChecker(cfg config.Config, qc *qga.Client, lv lockdownView, ev egressView) *containment.SandboxChecker {
	return newChecker(cfg, qc, lv, ev, netns.None())
}

// newChecker is NewChecker reading the node's addresses, routes and
// neighbours, and watching its bridges, in the network namespace node
// (netns.None(): the daemon's own).
func newChecker(cfg config.Config, qc *qga.Client, lv lockdownView, ev egressView, node netns.NsHandle) *containment.SandboxChecker {
	c := cfg.Check
	var adapt func(string, containment.Spec, containment.Policy) (containment.Spec, containment.Policy)
	if ev != nil {
		adapt = func(sb string, spec containment.Spec, p containment.Policy) (containment.Spec, containment.Policy) {
			mode := ev.Mode(sb)
			// the egress rows need names the sandbox's policy really
			// allows and denies; without them the rows are left out
			if mode == "allowlist" && c.EgressAllowedName != "" && c.EgressDeniedName != "" &&
				ev.AllowsName(sb, c.EgressAllowedName) && !ev.AllowsName(sb, c.EgressDeniedName) {
				spec.Egress = &containment.EgressSpec{AllowedName: c.EgressAllowedName, DeniedName: c.EgressDeniedName}
				if a, err := netip.ParseAddr(c.EgressDeniedAddr); err == nil {
					spec.Egress.DeniedAddr = a
				}
			}
			return spec, containment.WithEgress(p, mode)
		}
	}
	var obsOpts []l2observe.Option
	if node.IsOpen() {
		obsOpts = append(obsOpts, l2observe.WithNetNS(node))
	}
	return &containment.SandboxChecker{
		Sandbox: adapt,
		Runner: &containment.Runner{ProbePath: c.ProbePath, GuestDir: c.GuestDir, Concurrency: c.Concurrency,
			Observer: l2observe.New(obsOpts...)},
		// the guard's layer-2 table is always in force: the spoofing rows
		// are expected blocked
		GuestPorts: firewall.GuestPortNames,
		// the other sandboxes' guests, as the node gave them their
		// addresses: the check never calls into another tenant's guest
		GuestAddrs: func(vmid int, zone string) ([]netip.Addr, error) {
			return portmap.Paths{Root: cfg.Guard.NodeRoot}.GuestAddrs(vmid, zone, time.Now())
		},
		Client: qc,
		QGADir: cfg.API.QGADir,
		Node: func(context.Context) (containment.Spec, containment.Policy, error) {
			spec, err := nodeSpec(cfg, node)
			pol := containment.GuardPolicy()
			if lv != nil && lv.LockedDown() {
				pol = containment.LockdownPolicy()
			}
			return spec, pol, err
		},
		LocalName: func(zone string) string { return strings.ReplaceAll(c.LocalName, "{zone}", zone) },
	}
}

// nodeSpec is the node-wide part of a containment plan, read from the
// network namespace node: every node address (control-plane rows, TCP and
// UDP), and, besides the configured [check] lan targets, the LAN targets
// lantargets.Discover finds without configuration. The per-sandbox part
// (containment.SandboxChecker) adds the gateway, the other sandboxes' guests, and drops
// LAN targets inside any sandbox's subnet.
func nodeSpec(cfg config.Config, node netns.NsHandle) (containment.Spec, error) {
	c := cfg.Check
	if c.ExternalName == "" || c.LocalName == "" || len(c.Public) == 0 {
		return containment.Spec{}, errors.New("check.external_name, check.local_name and check.public must be set for the containment check")
	}
	var spec containment.Spec
	h, err := netlink.NewHandleAt(node)
	if err != nil {
		return spec, fmt.Errorf("node addresses: netlink: %w", err)
	}
	defer h.Close()
	addrs, err := h.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return spec, fmt.Errorf("node addresses: %w", err)
	}
	for _, a := range addrs {
		ip, ok := netip.AddrFromSlice(a.IP)
		if !ok || ip.IsLoopback() || ip.IsLinkLocalUnicast() {
			continue
		}
		spec.HostAddrs = append(spec.HostAddrs, ip.Unmap())
	}
	spec.ControlPorts = containment.DefaultControlPorts()
	for _, l := range []struct{ addr, name string }{{cfg.Metrics.Listen, "metrics"}, {cfg.API.Listen, "sandbox API"}} {
		if _, p, err := net.SplitHostPort(l.addr); err == nil {
			if n, err := strconv.ParseUint(p, 10, 16); err == nil && n > 0 {
				spec.ControlPorts = append(spec.ControlPorts, containment.Port{Port: uint16(n), Name: l.name})
			}
		}
	}
	spec.LAN = c.LANAddrs()
	// and, without configuration, the node's gateways, its neighbours on
	// the uplinks and one address per private block (not the sandboxes'
	// own auto pool)
	var exclude []netip.Prefix
	if p, err := netip.ParsePrefix(cfg.API.AutoCIDRPool); err == nil {
		exclude = append(exclude, p)
	}
	found, err := lantargets.Discover(h, exclude)
	if err != nil {
		return spec, fmt.Errorf("lan targets: %w", err)
	}
	for _, ap := range lantargets.AddrPorts(found) {
		if !slices.Contains(spec.LAN, ap) {
			spec.LAN = append(spec.LAN, ap)
		}
	}
	spec.Public, spec.Public6 = c.PublicAddrs()
	var r [4]byte
	_, _ = rand.Read(r[:])
	spec.ExternalName = strings.ReplaceAll(c.ExternalName, "{random}", "x"+hex.EncodeToString(r[:]))
	spec.Timeout = c.Timeout
	spec.Budget = c.Budget
	return spec, nil
}
