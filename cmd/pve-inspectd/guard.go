package main

import (
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/pve-inspect/pve-inspect/cmd/pve-inspectd/internal/config"
	"github.com/pve-inspect/pve-inspect/cmd/pve-inspectd/internal/daemon"
	"github.com/pve-inspect/pve-inspect/firewall"
	"github.com/pve-inspect/pve-inspect/firewall/egress"
)

// newGuardCmds returns the host guard verbs: run, plan, status, guard remove.
func newGuardCmds(g *globals) []*cobra.Command {
	return []*cobra.Command{newRunCmd(g), newPlanCmd(g), newStatusCmd(g), newGuardCmd(g)}
}

func newRunCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "run",
		Short: "run the daemon: host guard and metrics (ready once the guard is verified in force)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := g.loadConfig()
			if err != nil {
				return err
			}
			d := &daemon.Daemon{Config: cfg, Log: g.logger(), Notify: daemon.Systemd{}}
			return d.Run(cmd.Context())
		},
	}
}

func newPlanCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "plan",
		Short: "print the interface classification, the exact ruleset the guard would apply and the warm pool; changes nothing",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := g.loadConfig()
			if err != nil {
				return err
			}
			fc, err := daemon.FullGuardConfig(cfg)
			if err != nil {
				return err
			}
			st, err := daemon.EgressPlan(cfg)
			if err != nil {
				return err
			}
			fc = fc.WithRunEgress(st.Zones())
			cls, err := firewall.Classify(cmd.Context(), fc)
			if err != nil {
				return fmt.Errorf("classify interfaces: %w", err)
			}
			zp := planZones(cfg.Guard)
			fc.Zones = zp.merged()
			rs, err := firewall.Render(fc, cls, firewall.Switches{})
			if err != nil {
				return fmt.Errorf("render ruleset: %w", err)
			}
			w := cmd.OutOrStdout()
			zp.write(w)
			if err := writePlan(w, cls, rs); err != nil {
				return err
			}
			brs, err := firewall.RenderBridge(bridgesOf(fc), cls, nil, fc.Flood)
			if err != nil {
				return fmt.Errorf("render bridge table: %w", err)
			}
			if err := writeEgressPlan(w, cfg.Egress, st.Entries()); err != nil {
				return err
			}
			if err := writePoolPlan(w, cfg.Pool); err != nil {
				return err
			}
			return writeBridgePlan(w, brs)
		},
	}
}

func list(s []string) string {
	if len(s) == 0 {
		return "(none)"
	}
	return strings.Join(s, ", ")
}

// guestSide lists the interfaces the input policy treats as guest-facing.
func guestSide(cls firewall.Classification) []string {
	skip := map[string]bool{"lo": true}
	for _, n := range cls.Management {
		skip[n] = true
	}
	for _, n := range cls.Trusted {
		skip[n] = true
	}
	var out []string
	for _, n := range cls.Interfaces {
		if !skip[n] {
			out = append(out, n)
		}
	}
	return out
}

func writeClassification(w io.Writer, cls firewall.Classification) {
	fmt.Fprintf(w, "interfaces:\n")
	fmt.Fprintf(w, "  management (default route): %s\n", list(cls.Management))
	fmt.Fprintf(w, "  trusted (configured):       %s\n", list(cls.Trusted))
	fmt.Fprintf(w, "  guest side (DHCP+DNS only): %s\n", list(guestSide(cls)))
}

func writePlan(w io.Writer, cls firewall.Classification, rs *firewall.Ruleset) error {
	writeClassification(w, cls)
	for _, n := range rs.Notes {
		fmt.Fprintf(w, "note: %s\n", n)
	}
	fmt.Fprintf(w, "\nruleset (%d rules, lockdown off, fail-closed off):\n", rs.RuleCount())
	_, err := io.WriteString(w, rs.String())
	return err
}

// bridgesOf lists the configured zones' bridges.
func bridgesOf(fc firewall.Config) []string {
	var out []string
	for _, b := range fc.Zones {
		out = append(out, b...)
	}
	return out
}

func writeBridgePlan(w io.Writer, rs *firewall.Ruleset) error {
	fmt.Fprintf(w, "\nlayer-2 table (%d rules; guest ports of zone bridges: %s; the daemon maps ports at run time, unmapped ports are DHCP-only):\n",
		rs.RuleCount(), list(rs.Set(firewall.SetGuestPorts).Text))
	_, err := io.WriteString(w, rs.String())
	return err
}

func newStatusCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "status",
		Short: "show the guard in force and what differs from the desired ruleset; exit 1 if anything differs",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := g.loadConfig()
			if err != nil {
				return err
			}
			fc, opts, err := daemon.InspectConfig(cfg)
			if err != nil {
				return err
			}
			st, err := firewall.Inspect(cmd.Context(), fc, opts...)
			if err != nil {
				return fmt.Errorf("inspect guard: %w", err)
			}
			writeStatus(cmd.OutOrStdout(), st)
			writeBridgeStatus(cmd.OutOrStdout(), st.Bridge)
			if n := len(st.Drifts) + len(st.Bridge.Drifts); n > 0 {
				return &exitError{code: 1, msg: fmt.Sprintf("%d difference(s) from the desired guard", n)}
			}
			return nil
		},
	}
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}

func writeStatus(w io.Writer, st *firewall.Status) {
	writeClassification(w, st.Classification)
	switch {
	case !st.Present:
		fmt.Fprintf(w, "table inet %s: ABSENT\n", firewall.TableName)
	case st.Owned:
		fmt.Fprintf(w, "table inet %s: present, owned by netlink port %d, persist=%v\n", firewall.TableName, st.Owner, st.Persist)
	default:
		fmt.Fprintf(w, "table inet %s: present, ORPHANED (no daemon holds it), persist=%v\n", firewall.TableName, st.Persist)
	}
	fmt.Fprintf(w, "lockdown: %s, fail-closed: %s\n", onOff(st.Switches.Lockdown), onOff(st.Switches.FailClosed))
	writeTableBody(w, "", append(st.Desired.Notes, st.Notes...), st.Counters, st.Drifts)
}

// writeTableBody prints a table's notes, rule counters and differences;
// prefix names the table ("" for the inet table).
func writeTableBody(w io.Writer, prefix string, notes []string, counters []firewall.RuleCounter, drifts []firewall.Drift) {
	for _, n := range notes {
		fmt.Fprintf(w, "note: %s\n", n)
	}
	if len(counters) > 0 {
		fmt.Fprintf(w, "%srules (packets/bytes):\n", prefix)
		for _, c := range counters {
			fmt.Fprintf(w, "  %-13s %-18s %d/%d\n", c.Chain, c.Rule, c.Packets, c.Bytes)
		}
	}
	if len(drifts) == 0 {
		fmt.Fprintf(w, "%sin force as desired\n", prefix)
		return
	}
	fmt.Fprintf(w, "%sdifferences:\n", prefix)
	for _, d := range drifts {
		fmt.Fprintf(w, "  %s\n", d)
	}
}

func writeBridgeStatus(w io.Writer, ts firewall.TableStatus) {
	ref := ts.Desired.TableRef()
	state := "ABSENT"
	switch {
	case ts.Present && ts.Owned:
		state = fmt.Sprintf("present, owned by netlink port %d, persist=%v", ts.Owner, ts.Persist)
	case ts.Present:
		state = fmt.Sprintf("present, ORPHANED (no daemon holds it), persist=%v", ts.Persist)
	}
	fmt.Fprintf(w, "%s: %s\n", ref, state)
	writeTableBody(w, "layer-2 table ", ts.Notes, ts.Counters, ts.Drifts)
}

func newGuardCmd(g *globals) *cobra.Command {
	c := &cobra.Command{Use: "guard", Short: "host guard maintenance", Args: cobra.NoArgs}
	c.AddCommand(&cobra.Command{
		Use:   "remove",
		Short: "delete tables inet and bridge pve-inspect and restore net.ipv6.conf.default.disable_ipv6 (stop the daemon first)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := g.loadConfig()
			if err != nil {
				return err
			}
			if err := firewall.RemoveTable(cmd.Context(), daemon.GuardConfig(cfg.Guard)); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "tables inet and bridge %s removed\n", firewall.TableName)
			return nil
		},
	})
	return c
}

// writeEgressPlan prints the egress policies: the node-wide default and
// each sandbox zone's persisted policy.
func writeEgressPlan(w io.Writer, def config.EgressSection, zones []egress.Entry) error {
	fmt.Fprintf(w, "\negress policies (the node-wide lockdown wins over every one):\n")
	fmt.Fprintf(w, "  default, for zones the daemon did not create: %s; allow %s; deny %s\n",
		def.DefaultMode, list(def.Allow), list(def.Deny))
	for _, e := range zones {
		fmt.Fprintf(w, "  sandbox %s (zone %s, bridges %s): %s; allow %s; deny %s\n",
			e.Owner, e.Zone, list(e.Bridges), e.Policy.Mode, list(e.Policy.Allow), list(e.Policy.Deny))
	}
	return nil
}
