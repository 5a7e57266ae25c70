// Package mgmtport converges the Proxmox management-port rules of DESIGN.md
// section 3 through the Proxmox API: node firewall rules accepting tcp 8006
// and 22 (and the sandbox API port) on the default-route interface, udp/tcp
// 53 and udp 67 everywhere, with the node and cluster firewall enabled; and
// node OUT rules accepting the node's replies from those tcp ports (and
// every other port the guard notracks: New's notracked) out of
// the default-route interface.
//
// The OUT rules are there because the guard (package firewall) takes those
// connections out of connection tracking (its mgmt-notrack rules: a
// conntrack table guests filled cannot refuse them). The host firewall's
// output chain accepts the node's replies only as ESTABLISHED before the
// cluster's policy_out: pve-firewall's PVEFW-HOST-OUT (src/PVE/Firewall.pm
// generate_std_chains / ruleset_chain_add_conn_filters: "-m conntrack
// --ctstate RELATED,ESTABLISHED -j ACCEPT", then the node's OUT rules, then
// policy_out) and proxmox-firewall's default-out ct state vmap. An untracked
// reply is not ESTABLISHED; with policy_out DROP or REJECT it would be
// dropped. The node OUT rules are compiled by ruleset_generate_rule into
// PVEFW-HOST-OUT as "-o <iface> -p tcp --sport <port> -j ACCEPT", with no
// conntrack match: they accept untracked packets too.
//
// Our rules carry a comment starting with Tag; nothing else is touched. They
// are deleted and recreated only when they differ from the desired set, and
// re-converged whenever the default-route interface changes.
package mgmtport

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Tag starts the comment of every rule this package owns.
const Tag = "pve-inspect:mgmt"

// Rule is a node firewall rule.
type Rule struct {
	Pos    int
	Type   string // "in" or "out"
	Action string // "ACCEPT"
	Proto  string
	DPort  string
	// SPort restricts the source port (the OUT rules: the node's replies).
	SPort   string
	Iface   string
	Comment string
	Enable  bool
	// Digest is the digest of the rule list the rule was read from (each
	// rule of GET .../firewall/rules carries it); a delete sends it, so
	// Proxmox refuses it when the list changed since (positions moved).
	Digest string
}

// Firewall is what the converger needs from the Proxmox API. Implemented by
// pveapi.Client.
type Firewall interface {
	NodeRules(ctx context.Context) ([]Rule, error)
	// AddNodeRule inserts a rule at the top (position 0), as Proxmox does.
	AddNodeRule(ctx context.Context, r Rule) error
	// DeleteNodeRule deletes the rule at pos of the list whose digest is
	// given, refused when the list changed since.
	DeleteNodeRule(ctx context.Context, pos int, digest string) error
	NodeFirewallEnabled(ctx context.Context) (bool, error)
	SetNodeFirewall(ctx context.Context, on bool) error
	// ClusterFirewallEnabled reports the cluster switch, which only root
	// turns on (see ErrClusterFirewallOff).
	ClusterFirewallEnabled(ctx context.Context) (bool, error)
}

// Converger keeps the management-port rules in place.
type Converger struct {
	fw      Firewall
	apiPort int
	// notracked are the other tcp ports the guard takes out of connection
	// tracking (its management_ports: the metrics listener's, the ones an
	// operator adds), sorted, without 8006, 22 and apiPort.
	notracked []int
	log       *slog.Logger
}

// New returns a Converger; apiPort is the sandbox API's TCP port (0: none),
// notracked every tcp port the guard takes out of connection tracking on
// the management interfaces ([guard] management_ports): each gets a node
// OUT rule for its replies. Only OUT rules: accepting the connections to
// a port past 8006, 22 and apiPort is the operator's decision.
func New(fw Firewall, apiPort int, log *slog.Logger, notracked ...int) *Converger {
	if log == nil {
		log = slog.Default()
	}
	var extra []int
	for _, p := range notracked {
		if p < 1 || p > 65535 || p == 8006 || p == 22 || p == apiPort || slices.Contains(extra, p) {
			continue
		}
		extra = append(extra, p)
	}
	slices.Sort(extra)
	return &Converger{fw: fw, apiPort: apiPort, notracked: extra, log: log.With("component", "mgmtport")}
}

// Desired returns the rules for the default-route interface iface ("" when
// there is none: the interface-bound rules are then left out).
func (c *Converger) Desired(iface string) []Rule {
	var out []Rule
	add := func(proto, port, ifc, what string) {
		out = append(out, Rule{Type: "in", Action: "ACCEPT", Proto: proto, DPort: port, Iface: ifc, Enable: true, Comment: Tag + " " + what})
	}
	if iface != "" {
		add("tcp", "8006", iface, "proxmox-api")
		add("tcp", "22", iface, "ssh")
		if c.apiPort > 0 {
			add("tcp", strconv.Itoa(c.apiPort), iface, "sandbox-api")
		}
	}
	add("udp", "53", "", "dns")
	add("tcp", "53", "", "dns")
	add("udp", "67", "", "dhcp")
	if iface != "" {
		// the node's replies, untracked under the guard (see the package
		// comment): stateless, so policy_out DROP cannot take them
		reply := func(port, what string) {
			out = append(out, Rule{Type: "out", Action: "ACCEPT", Proto: "tcp", SPort: port, Iface: iface, Enable: true, Comment: Tag + " " + what + "-reply"})
		}
		reply("8006", "proxmox-api")
		reply("22", "ssh")
		if c.apiPort > 0 {
			reply(strconv.Itoa(c.apiPort), "sandbox-api")
		}
		for _, p := range c.notracked {
			reply(strconv.Itoa(p), "port-"+strconv.Itoa(p))
		}
	}
	return out
}

func same(a, b Rule) bool {
	return a.Type == b.Type && strings.EqualFold(a.Action, b.Action) && a.Proto == b.Proto && a.DPort == b.DPort && a.SPort == b.SPort &&
		a.Iface == b.Iface && a.Comment == b.Comment && a.Enable == b.Enable
}

// Converge makes the node's rules match Desired(iface), enables the node
// firewall and checks the cluster firewall is on (ErrClusterFirewallOff
// when not). It reports whether it changed anything.
func (c *Converger) Converge(ctx context.Context, iface string) (bool, error) {
	want := c.Desired(iface)
	ours, err := c.ours(ctx)
	if err != nil {
		return false, err
	}
	changed := false
	if !slices.EqualFunc(ours, want, same) {
		// Delete from the bottom, one at a time, each with the digest of
		// the list it was found in: a position is only valid in that list
		// (another writer may have inserted or deleted rules).
		// At most as many deletes as rules found: a writer that keeps
		// adding ours is left to the next round.
		for n := len(ours); len(ours) > 0 && n > 0; n-- {
			last := ours[len(ours)-1]
			if err := c.fw.DeleteNodeRule(ctx, last.Pos, last.Digest); err != nil {
				return true, fmt.Errorf("converge management rules: %w", err)
			}
			if ours, err = c.ours(ctx); err != nil {
				return true, err
			}
		}
		// insert bottom-up at the top: the final order equals want
		for i := len(want) - 1; i >= 0; i-- {
			if err := c.fw.AddNodeRule(ctx, want[i]); err != nil {
				return true, fmt.Errorf("converge management rules: %w", err)
			}
		}
		changed = true
		c.log.Info("management-port rules recreated", "iface", iface, "rules", len(want))
	}
	on, err := c.fw.NodeFirewallEnabled(ctx)
	if err != nil {
		return changed, fmt.Errorf("converge management rules: %w", err)
	}
	if !on {
		if err := c.fw.SetNodeFirewall(ctx, true); err != nil {
			return true, fmt.Errorf("converge management rules: %w", err)
		}
		changed = true
	}
	on, err = c.fw.ClusterFirewallEnabled(ctx)
	if err != nil {
		return changed, fmt.Errorf("converge management rules: %w", err)
	}
	if !on {
		return changed, ErrClusterFirewallOff
	}
	return changed, nil
}

// ErrClusterFirewallOff: the node's rules are in place but the cluster
// firewall, without which Proxmox applies none of them, is off. Turning it
// on needs Sys.Modify on "/" (pve-firewall PVE/API2/Firewall/Cluster.pm
// set_options), which would let the daemon's token change every node's
// firewall and the datacenter options; so root turns it on once, and the
// daemon only checks.
var ErrClusterFirewallOff = errors.New("converge management rules: the cluster firewall is off, so Proxmox applies no node rule; " +
	"as root, after the daemon has put its rules in place: pvesh set /cluster/firewall/options --enable 1")

// ours reads the node's rules and returns those carrying Tag, by
// position.
func (c *Converger) ours(ctx context.Context) ([]Rule, error) {
	rules, err := c.fw.NodeRules(ctx)
	if err != nil {
		return nil, fmt.Errorf("converge management rules: %w", err)
	}
	var out []Rule
	for _, r := range rules {
		if strings.HasPrefix(r.Comment, Tag) {
			out = append(out, r)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Pos < out[j].Pos })
	return out, nil
}

// Run converges with the interface current supplies, again whenever
// changes delivers a new default-route interface, and every interval
// (catching edits by others). It returns when ctx ends; failed rounds are
// logged and retried at the next tick.
func (c *Converger) Run(ctx context.Context, current string, changes <-chan string, interval time.Duration) {
	if interval <= 0 {
		interval = time.Minute
	}
	iface := current
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		cctx, cancel := context.WithTimeout(ctx, interval)
		if _, err := c.Converge(cctx, iface); err != nil {
			c.log.Error("converge management-port rules", "iface", iface, "err", err)
		}
		cancel()
		select {
		case <-ctx.Done():
			return
		case nif, ok := <-changes:
			if !ok {
				changes = nil
				continue
			}
			iface = nif
		case <-t.C:
		}
	}
}
